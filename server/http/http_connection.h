// One REST connection, event-driven on Asio: it reads each request in the
// order api.md gives and answers it, until the client closes, the
// connection idles past --http_idle_timeout, or an answer ends it.
//   1. Line and headers (Beast's strict parser), at most
//      --http_max_header_bytes (431), within --http_header_timeout of the
//      request's first byte (408); framing checked (request_framing.h).
//   2. Route, token and admission (RestApi::Admit): refused at once, the
//      body not read; the connection then closes after lingering.
//   3. Body: within --http_body_timeout, and after its first second at no
//      less than --http_min_body_rate on average (408); a chunked body is
//      admitted as it arrives.
//   4. Parsing and computing in the compute arena, never on an I/O thread;
//      the answer is written back from the connection's strand.
// Every deadline is a timer that cancels the pending read, so that the
// client is told why (408) before the connection is closed.
//
// Thread-safe: each connection runs on its own strand; ConnectionHub is
// shared by all of them and by the server.
#ifndef NORMD_SERVER_HTTP_HTTP_CONNECTION_H_
#define NORMD_SERVER_HTTP_HTTP_CONNECTION_H_

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "server/http/http_metrics.h"
#include "server/http/http_server.h"
#include "server/http/rest_api.h"

namespace normd {

// A connection as the hub sees it.
class ConnectionHandle {
 public:
  virtual ~ConnectionHandle() = default;
  // Called on no particular thread: the server stops; requests not yet
  // read are cut at `deadline`.
  virtual void Stop(std::chrono::steady_clock::time_point deadline) = 0;
};

// What every connection of one server shares: the options, the API, the
// metrics, the open connections (for Stop) and the answers being computed.
// Thread-safe.
class ConnectionHub {
 public:
  ConnectionHub(const HttpServerOptions& server_options, RestApi& rest_api,
                HttpMetrics& http_metrics)
      : options(server_options), api(rest_api), metrics(http_metrics) {}

  const HttpServerOptions options;
  RestApi& api;
  HttpMetrics& metrics;

  // Whether another connection fits --http_max_connections.
  bool HasRoom() const;
  // False (and nothing registered) once stopping.
  bool Register(const std::shared_ptr<ConnectionHandle>& connection);
  void Unregister(const ConnectionHandle* connection);
  int64_t open() const;

  // An answer is being computed off the I/O threads (and ends).
  void ComputationStarted();
  void ComputationEnded();

  bool stopping() const { return stopping_.load(); }
  std::chrono::steady_clock::time_point stop_deadline() const {
    return stop_deadline_;
  }
  // Tells every connection to stop by `deadline`.
  void StopAll(std::chrono::steady_clock::time_point deadline);
  // Waits until no connection is open or `deadline` has passed.
  void WaitForConnections(std::chrono::steady_clock::time_point deadline);
  // Waits until no answer is being computed.
  void WaitForComputations();

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  absl::flat_hash_map<const ConnectionHandle*, std::weak_ptr<ConnectionHandle>>
      connections_;
  int64_t computations_ = 0;
  std::atomic<bool> stopping_ = false;
  std::chrono::steady_clock::time_point stop_deadline_ =
      std::chrono::steady_clock::time_point::max();
};

// Serves an accepted connection (plain TCP, or TLS with `tls`).
void ServeConnection(ConnectionHub& hub, boost::asio::ip::tcp::socket socket,
                     boost::asio::ssl::context* tls);

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_HTTP_CONNECTION_H_
