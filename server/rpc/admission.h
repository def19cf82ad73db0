// Admission control for the Normalizer RPCs: at most max_requests calls in
// progress and max_request_bytes of request messages held by them; a call
// past either limit is refused at once with RESOURCE_EXHAUSTED (naming the
// flag) instead of queuing, so that overload costs the server neither memory
// nor latency for the calls it did admit. A stream counts as one request
// while open and each of its messages counts its bytes while processed.
//
// Thread-safe (atomics); a Ticket is owned by one call.
#ifndef NORMD_SERVER_RPC_ADMISSION_H_
#define NORMD_SERVER_RPC_ADMISSION_H_

#include <atomic>
#include <cstdint>

#include "absl/status/statusor.h"

namespace normd {

class Admission {
 public:
  // What one admitted call holds; given back on destruction.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { Release(); }
    void Release();

   private:
    friend class Admission;
    Admission* admission_ = nullptr;
    int64_t requests_ = 0;
    int64_t bytes_ = 0;
  };

  // 0 = no limit.
  Admission(int64_t max_requests, int64_t max_request_bytes);

  // Admits `requests` (0 or 1) more calls holding `bytes`, or
  // RESOURCE_EXHAUSTED. A single message larger than the byte limit is
  // admitted when nothing else is in flight, so that every request up to
  // --max_message_bytes can be served.
  absl::StatusOr<Ticket> Admit(int64_t requests, int64_t bytes);

  int64_t requests() const { return requests_.load(); }
  int64_t bytes() const { return bytes_.load(); }

 private:
  const int64_t max_requests_;
  const int64_t max_bytes_;
  std::atomic<int64_t> requests_ = 0;
  std::atomic<int64_t> bytes_ = 0;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_ADMISSION_H_
