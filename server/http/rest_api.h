// The REST front end's translation, without sockets: what each endpoint of
// the Open Inference Protocol (and Triton's repository, configuration and
// statistics extensions) asks of the service, and the HTTP answer. It
// decides in the spec's order: route (404, 405), token (401, the body not
// read), admission on the declared length (413, 429, the body not read),
// then, once the connection has read the body, parse and compute. Every
// routed request is a service Call (protocol "rest"), with its lifecycle,
// metrics and durability wait. The connection (http_connection.h) moves the
// bytes; tests and the fuzzer drive this directly.
//
// Thread-safe: any number of exchanges at once; one exchange is used by one
// thread at a time.
#ifndef NORMD_SERVER_HTTP_REST_API_H_
#define NORMD_SERVER_HTTP_REST_API_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "server/http/rest_router.h"
#include "server/service/buffer_pool.h"
#include "server/service/call.h"
#include "server/service/inference.h"
#include "server/service/service.h"

namespace normd {

// Where REST requests carry the bearer token.
inline constexpr TokenCarrier kHttpTokenCarrier{"Authorization", "header"};

// A request's head, as the API needs it.
struct RestRequestHead {
  std::string method;
  std::string target;
  std::optional<std::string> authorization;
  // Inference-Header-Content-Length (the binary-data extension).
  std::optional<std::string> header_length;
  // The declared body length; nullopt for a chunked body.
  std::optional<uint64_t> content_length;
};

// An answer: a JSON body (or an infer reply's JSON head), then optionally a
// binary payload (the binary-data extension's output).
struct RestResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  PooledBuffer payload{nullptr, &BufferPool::Release};
  int64_t payload_bytes = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  // The connection is closed after this answer (its request's body was not
  // read, or the server is stopping).
  bool close = false;
};

// One request on its way through the API; owned by its connection.
struct RestExchange {
  RestRequestHead head;
  RestRoute route;
  std::unique_ptr<Call> call;  // Once routed to an endpoint.
  // Bytes of body received so far (a chunked body is admitted as it
  // arrives).
  int64_t received = 0;
};

// The REST front end's own limits.
struct RestLimits {
  int64_t max_body_bytes = 64 << 20;  // --max_message_bytes
};

class RestApi {
 public:
  // `service` and `inference` must outlive the API.
  RestApi(Service& service, Inference& inference, RestLimits limits);

  // After the head: routes, decides the token and admits the declared body.
  // An answer to send at once (the body not read), or nullopt: read the
  // body.
  std::optional<RestResponse> Admit(RestExchange& exchange);
  // While a chunked body arrives: admits it up to `received` bytes, or the
  // answer to send at once (413 past the body limit, 429).
  std::optional<RestResponse> AdmitReceived(RestExchange& exchange,
                                            int64_t received);
  // A request's body as read: its bytes, and how many bytes from its start
  // may be read (the JSON parser reads up to 64 bytes past the JSON: with
  // that much room it parses in place).
  struct Body {
    absl::string_view bytes;
    size_t readable = 0;
  };

  // Off the I/O thread, once the body is read: parses and computes, then
  // calls `done` with the answer (from the log's thread when a model change
  // must first be durable). The body must stay alive until then.
  void Handle(RestExchange& exchange, Body body,
              absl::AnyInvocable<void(RestResponse) &&> done);

  // The answer to a request refused before it reached an endpoint (bad
  // framing 400, 408, 431, 505, ...), or a routed call's error.
  static RestResponse ErrorResponse(int status, absl::string_view message);
  static RestResponse ErrorResponse(const absl::Status& status);

  int64_t max_body_bytes() const { return limits_.max_body_bytes; }

 private:
  // Fills `response` for the routed request whose body is `body`.
  absl::Status Respond(RestExchange& exchange, Body body,
                       RestResponse& response);
  absl::Status Infer(RestExchange& exchange, Body body, RestResponse& response);
  // A refusal of an admitted exchange: its call finished with `status`.
  RestResponse Refuse(RestExchange& exchange, const absl::Status& status,
                      int http_status);

  Service& service_;
  Inference& inference_;
  const RestLimits limits_;
};

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_REST_API_H_
