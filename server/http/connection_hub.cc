#include "server/http/connection_hub.h"

namespace normd {

using Clock = std::chrono::steady_clock;

bool ConnectionHub::HasRoom() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(connections_.size()) < options.max_connections;
}

bool ConnectionHub::Register(
    const std::shared_ptr<ConnectionHandle>& connection) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load()) return false;
  connections_.emplace(connection.get(), connection);
  metrics.AddConnections(1);
  return true;
}

void ConnectionHub::Unregister(const ConnectionHandle* connection) {
  std::lock_guard<std::mutex> lock(mu_);
  if (connections_.erase(connection) > 0) metrics.AddConnections(-1);
  changed_.notify_all();
}

int64_t ConnectionHub::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(connections_.size());
}

void ConnectionHub::ComputationStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  ++computations_;
}

void ConnectionHub::ComputationEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  --computations_;
  changed_.notify_all();
}

void ConnectionHub::StopAll(Clock::time_point deadline) {
  std::vector<std::shared_ptr<ConnectionHandle>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_deadline_ = deadline;
    stopping_.store(true);
    for (const auto& [key, weak] : connections_) {
      if (std::shared_ptr<ConnectionHandle> c = weak.lock()) {
        open.push_back(std::move(c));
      }
    }
  }
  for (const auto& connection : open) connection->Stop(deadline);
}

void ConnectionHub::WaitForConnections(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, deadline, [&] { return connections_.empty(); });
}

void ConnectionHub::WaitForComputations() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return computations_ == 0; });
}

}  // namespace normd
