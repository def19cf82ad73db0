#include "server/http/rest_server.h"

#include <sys/socket.h>

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/http/connection.h"

namespace normd {

absl::StatusOr<std::unique_ptr<RestServer>> RestServer::Start(
    const RestServerOptions& options, RestHandler& handler) {
  std::unique_ptr<RestServer> rest(new RestServer);
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key: give both or neither");
  }
  const ConnectionLimits limits{
      .max_header_bytes = static_cast<size_t>(options.max_header_bytes),
      .header_timeout = absl::ToChronoMilliseconds(options.idle_timeout),
      .io_timeout = absl::ToChronoMilliseconds(options.idle_timeout),
      .linger_timeout = absl::ToChronoMilliseconds(options.linger_timeout)};
  auto on_refused = [&handler](int status) { handler.RecordRefusal(status); };
  if (!options.tls_cert.empty()) {
    auto tls = std::make_unique<GuardedHttpsServer>(
        limits, on_refused, options.tls_cert.c_str(), options.tls_key.c_str(),
        options.tls_client_ca.empty() ? nullptr
                                      : options.tls_client_ca.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(
          "--tls_cert, --tls_key, --tls_client_ca: the HTTP server could not "
          "load them as PEM certificate, key and CA bundle");
    }
    rest->server_ = std::move(tls);
  } else {
    rest->server_ = std::make_unique<GuardedHttpServer>(limits, on_refused);
  }
  httplib::Server& server = *rest->server_;
  handler.Install(server, options.max_body_bytes);
  const int threads = options.threads;
  server.new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  // The Keep-Alive header httplib writes; the connection loop itself is
  // ConnectionStream's (idle timeout, any number of requests).
  server.set_keep_alive_timeout(
      std::max<time_t>(1, absl::ToInt64Seconds(options.idle_timeout)));
  server.set_keep_alive_max_count(std::numeric_limits<int32_t>::max());
  // Headers and body go out in separate writes: without TCP_NODELAY,
  // Nagle's algorithm holds the body until the client's delayed ACK.
  server.set_tcp_nodelay(true);
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would
  // let a second normd bind the same port and take half its connections.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  if (options.port == 0) {
    rest->port_ = server.bind_to_any_port(options.bind_address);
  } else {
    rest->port_ = server.bind_to_port(options.bind_address, options.port)
                      ? options.port
                      : -1;
  }
  if (rest->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("--http_port: cannot listen on ", options.bind_address,
                     " port ", options.port, " (in use, or not permitted)"));
  }
  rest->listener_ = std::thread([&server] { server.listen_after_bind(); });
  return rest;
}

RestServer::~RestServer() { Stop(); }

void RestServer::Stop() {
  if (!listener_.joinable()) return;
  server_->stop();
  listener_.join();
}

}  // namespace normd
