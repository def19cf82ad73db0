// The HTTP/REST listener of the Open Inference Protocol on --http_port:
// cpp-httplib's server (plain, or TLS with the gRPC port's certificate
// flags) running RestHandler on a pool of --http_threads threads, one per
// connection in progress, each connection read through the guard of
// connection.h (bounded headers, in bounded time); idle keep-alive
// connections are closed after --http_idle_timeout. Start binds the port (or
// fails) before returning; Stop stops accepting, finishes the requests in
// progress and joins.
//
// Thread-safe: Stop may be called from any thread (once; the destructor
// calls it).
#ifndef NORMD_SERVER_HTTP_REST_SERVER_H_
#define NORMD_SERVER_HTTP_REST_SERVER_H_

#include <httplib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/http/rest_handler.h"

namespace normd {

struct RestServerOptions {
  std::string bind_address = "0.0.0.0";
  int port = 8000;  // 0: pick a free port.
  // TLS: PEM files, as for gRPC; cert and key enable TLS, a client CA also
  // requires client certificates it signed.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  int64_t max_body_bytes = 64 << 20;  // Past it: 413.
  int threads = 32;                   // Connections served at once.
  // A keep-alive connection with no request for this long is closed; a
  // request's line and headers must arrive within it (else 408), and each
  // read and write of a body within it.
  absl::Duration idle_timeout = absl::Seconds(5);
  // Discarding an unread body before closing (413; see ConnectionLimits).
  absl::Duration linger_timeout = absl::Seconds(30);
  int64_t max_header_bytes = 64 << 10;  // A request line and headers (431).
};

class RestServer {
 public:
  // UNAVAILABLE if the port cannot be bound; INVALID_ARGUMENT naming the
  // flag if the TLS files cannot be loaded. `handler` must outlive the
  // server.
  static absl::StatusOr<std::unique_ptr<RestServer>> Start(
      const RestServerOptions& options, RestHandler& handler);
  ~RestServer();

  int port() const { return port_; }
  void Stop();

 private:
  RestServer() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  int port_ = 0;
};

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_REST_SERVER_H_
