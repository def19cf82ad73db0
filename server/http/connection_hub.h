// What the REST connections of one server share, and how the server stops
// them: the options, the API, the metrics, the open connections and the
// answers being computed off the I/O threads.
#ifndef NORMD_SERVER_HTTP_CONNECTION_HUB_H_
#define NORMD_SERVER_HTTP_CONNECTION_HUB_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
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

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_CONNECTION_HUB_H_
