#include "server/http/http_server.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/http/http_connection.h"

namespace normd {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

class HttpServer::Impl {
 public:
  Impl(const HttpServerOptions& options, RestApi& api, HttpMetrics& metrics)
      : hub_(options, api, metrics),
        io_(options.io_threads),
        acceptor_(io_),
        retry_(io_) {}

  ~Impl() { Stop(absl::Now()); }

  absl::Status Open() {
    const HttpServerOptions& options = hub_.options;
    if (options.tls_cert.empty() != options.tls_key.empty()) {
      return absl::InvalidArgumentError(
          "--tls_cert and --tls_key: give both or neither");
    }
    if (!options.tls_cert.empty()) {
      tls_.emplace(asio::ssl::context::tls_server);
      boost::system::error_code ec;
      tls_->set_options(
          asio::ssl::context::default_workarounds |
              asio::ssl::context::no_sslv2 | asio::ssl::context::no_sslv3 |
              asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1,
          ec);
      if (!ec) tls_->use_certificate_chain_file(options.tls_cert, ec);
      if (!ec) {
        tls_->use_private_key_file(options.tls_key, asio::ssl::context::pem,
                                   ec);
      }
      if (!ec && !options.tls_client_ca.empty()) {
        tls_->load_verify_file(options.tls_client_ca, ec);
        if (!ec) {
          tls_->set_verify_mode(
              asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert,
              ec);
        }
      }
      if (ec) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--tls_cert, --tls_key, --tls_client_ca: the HTTP server could "
            "not load them as PEM certificate chain, key and CA bundle (",
            ec.message(), ")"));
      }
    }
    boost::system::error_code ec;
    const asio::ip::address address =
        asio::ip::make_address(options.bind_address, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--bind_address: ", options.bind_address,
                       " is not an IP address (", ec.message(), ")"));
    }
    const tcp::endpoint endpoint(address,
                                 static_cast<unsigned short>(options.port));
    acceptor_.open(endpoint.protocol(), ec);
    // SO_REUSEADDR only: a second normd on the same port must fail.
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("--http_port: cannot listen on ", options.bind_address,
                       " port ", options.port, " (", ec.message(), ")"));
    }
    port_ = acceptor_.local_endpoint(ec).port();
    Accept();
    for (int i = 0; i < options.io_threads; ++i) {
      threads_.emplace_back([this] { io_.run(); });
    }
    return absl::OkStatus();
  }

  int port() const { return port_; }

  void Stop(absl::Time deadline) {
    if (stopped_) return;
    stopped_ = true;
    const Clock::time_point cut =
        Clock::now() + absl::ToChronoNanoseconds(std::max(
                           deadline - absl::Now(), absl::ZeroDuration()));
    asio::post(io_, [this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
      retry_.cancel();
    });
    hub_.StopAll(cut);
    hub_.WaitForConnections(cut);
    io_.stop();
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
    // Answers still being computed hold their connections: they end on
    // their own, their replies posted to the stopped loop and dropped.
    hub_.WaitForComputations();
  }

 private:
  void Accept() {
    // With one I/O thread the loop runs every handler in turn: a strand per
    // connection would only add a queue.
    acceptor_.async_accept(
        hub_.options.io_threads == 1
            ? asio::any_io_executor(io_.get_executor())
            : asio::any_io_executor(asio::make_strand(io_)),
        [this](const boost::system::error_code& ec, tcp::socket socket) {
          if (ec == asio::error::operation_aborted || !acceptor_.is_open()) {
            return;
          }
          if (ec) {
            // E.g. out of file descriptors: try again shortly, not in a
            // busy loop.
            retry_.expires_after(std::chrono::milliseconds(100));
            retry_.async_wait([this](const boost::system::error_code& e) {
              if (!e) Accept();
            });
            return;
          }
          ServeConnection(hub_, std::move(socket),
                          tls_.has_value() ? &*tls_ : nullptr);
          Accept();
        });
  }

  // Destroyed after io_ (whose pending handlers hold connections that
  // unregister from it).
  ConnectionHub hub_;
  std::optional<asio::ssl::context> tls_;
  asio::io_context io_;  // Its concurrency hint: the I/O threads.
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  bool stopped_ = false;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, RestApi& api, HttpMetrics& metrics) {
  auto impl = std::make_unique<Impl>(options, api, metrics);
  if (absl::Status s = impl->Open(); !s.ok()) return s;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() = default;

int HttpServer::port() const { return impl_->port(); }

void HttpServer::Stop(absl::Time deadline) { impl_->Stop(deadline); }

}  // namespace normd
