// Whether the server takes work: set by the server as it starts, when its
// state can no longer be written, and as it shuts down; read by every front
// end's readiness check (gRPC health, the Open Inference Protocol's
// ServerReady and /v2/health/ready). Thread-safe (one atomic).
#ifndef NORMD_SERVER_SERVICE_READINESS_H_
#define NORMD_SERVER_SERVICE_READINESS_H_

#include <atomic>

namespace normd {

class Readiness {
 public:
  void Set(bool ready) { ready_.store(ready); }
  bool ready() const { return ready_.load(); }

 private:
  std::atomic<bool> ready_ = false;
};

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_READINESS_H_
