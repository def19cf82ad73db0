// The Open Inference Protocol over HTTP/REST: routes a request that httplib
// has read to the OIP service's call for its endpoint, and answers with the
// JSON (or binary-data) body or the error. A front-end that only
// translates (rest_codec.h): every endpoint runs the same OipService method
// as gRPC, under the same bearer token (health endpoints exempt), admission
// (429) and durability (a reply only once a change is on disk), with
// errors mapped to HTTP statuses in status_mapping.h. No sockets here (see
// rest_server.h), so that tests and the fuzzer drive it directly.
//
// Thread-safe: httplib calls it from many connection threads at once.
#ifndef NORMD_SERVER_HTTP_REST_HANDLER_H_
#define NORMD_SERVER_HTTP_REST_HANDLER_H_

#include <httplib.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/rpc/metrics.h"
#include "server/rpc/normalizer_service.h"
#include "server/rpc/oip_service.h"

namespace normd {

// Where a request's method and target lead.
struct RestRoute {
  RestEndpoint endpoint = RestEndpoint::kUnknown;
  std::string model;    // Percent-decoded; for the model endpoints.
  std::string version;  // From /versions/{version}; "" when absent.
  bool method_allowed = false;
  const char* allowed = "";  // The endpoint's method, for 405's Allow.
};

// The endpoint of `target` (its path, up to any "?") for `method`.
RestRoute RouteRestRequest(absl::string_view method, absl::string_view target);

class RestHandler {
 public:
  // `auth_token` empty: no token needed. All references must outlive the
  // handler.
  RestHandler(OipService& oip, NormalizerService& native, HttpMetrics& metrics,
              std::string auth_token);

  // Sets up `server`'s handlers: every method and path comes here, httplib's
  // own refusals (413 past `max_body_bytes`, 400 for a malformed request)
  // get the same JSON error body, every response is counted. Used by
  // RestServer and by the fuzzer on its in-memory server.
  void Install(httplib::Server& server, int64_t max_body_bytes);

  // Counts a request the connection guard refused (connection.h) with
  // `http_status` (431, 408) before httplib saw it.
  void RecordRefusal(int http_status) {
    metrics_.Handled(RestEndpoint::kUnknown, http_status, 0);
  }

  // Answers one request whose body is `body`.
  void Handle(const httplib::Request& request, absl::string_view body,
              httplib::Response& response);

 private:
  // Reads a POST's body (at most `max_body_bytes`, else 413), then Handle.
  void ReadBodyAndHandle(const httplib::Request& request,
                         const httplib::ContentReader& reader,
                         int64_t max_body_bytes, httplib::Response& response);
  absl::Status Authenticate(const httplib::Request& request) const;
  // The endpoint's body and status; an error status becomes the response.
  absl::Status Run(const RestRoute& route, const httplib::Request& request,
                   absl::string_view body, httplib::Response& response);
  absl::Status Infer(const RestRoute& route, const httplib::Request& request,
                     absl::string_view body, httplib::Response& response);

  OipService& oip_;
  NormalizerService& native_;
  HttpMetrics& metrics_;
  const std::string auth_token_;
};

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_REST_HANDLER_H_
