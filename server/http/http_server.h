// The REST listener on --http_port: an event-driven HTTP/1.1 server on
// Boost.Beast and Asio (plain, or TLS with the gRPC port's certificate
// flags). A few I/O threads (--http_threads) move bytes for every
// connection; no thread ever waits on a client. Each connection reads its
// requests in the order api.md gives (http_connection.h): headers within
// --http_header_timeout, then the route, token and admission decided before
// any body byte is read, then the body within --http_body_timeout and above
// --http_min_body_rate, then the answer computed off the I/O threads
// (rest_api.h). Only the health probes, which compute nothing, are answered
// on the I/O thread, so that no queue of work delays them.
//
// Thread-safe: Stop may be called from any thread (once; the destructor
// calls it).
#ifndef NORMD_SERVER_HTTP_HTTP_SERVER_H_
#define NORMD_SERVER_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/http/http_metrics.h"
#include "server/http/rest_api.h"

namespace normd {

struct HttpServerOptions {
  std::string bind_address = "0.0.0.0";
  int port = 8000;  // 0: pick a free port.
  // TLS: PEM files, as for gRPC; cert and key enable TLS, a client CA also
  // requires client certificates it signed.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  int io_threads = 1;
  // Connections open at once; past it a new one gets 503 and is closed.
  int64_t max_connections = 1000;
  // A request's line and headers: at most this many bytes (431), within
  // this long of its first byte (408).
  int64_t max_header_bytes = 64 << 10;
  absl::Duration header_timeout = absl::Seconds(5);
  // A keep-alive connection with no request for this long is closed.
  absl::Duration idle_timeout = absl::Seconds(5);
  // A body must arrive whole within this long of its headers (408), and,
  // after its first second, at no less than min_body_rate bytes per second
  // on average (408; 0: no minimum). An answer must be taken by the client
  // within body_timeout too.
  absl::Duration body_timeout = absl::Seconds(30);
  int64_t min_body_rate = 64 << 10;
  // After an answer sent before the request's body was read (401, 413,
  // 429): how long normd discards what the client still sends before it
  // closes, so that the client reads the answer rather than a reset (the
  // minimum rate applies here too).
  absl::Duration linger_timeout = absl::Seconds(30);
};

class HttpServer {
 public:
  // UNAVAILABLE if the port cannot be bound; INVALID_ARGUMENT naming the
  // flag if the TLS files cannot be loaded. `api` and `metrics` must outlive
  // the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options, RestApi& api, HttpMetrics& metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;

  // Stops accepting; idle connections are closed, requests already read are
  // answered (and their connections closed), connections still sending a
  // request are cut at `deadline`. Returns once every connection is closed
  // (at `deadline` at the latest) and every answer being computed is done.
  void Stop(absl::Time deadline);

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_HTTP_SERVER_H_
