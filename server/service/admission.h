// Admission control for every front end: at most max_requests calls in
// progress and max_request_bytes held by them; a call past either limit is
// refused at once with RESOURCE_EXHAUSTED (naming the flag) instead of
// queuing, so that overload costs the server neither memory nor latency for
// the calls it did admit. A stream's messages are admitted one at a time
// while each is processed; a REST request is admitted on its declared length
// before its body is read and grows its ticket by what its reply will hold.
//
// Thread-safe (atomics); a Ticket is owned by one call.
#ifndef NORMD_SERVER_SERVICE_ADMISSION_H_
#define NORMD_SERVER_SERVICE_ADMISSION_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
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
    // The bytes this ticket holds.
    int64_t bytes() const { return bytes_; }

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

  // Grows an admitted `ticket` by `bytes`, or RESOURCE_EXHAUSTED (the ticket
  // unchanged). As Admit, a ticket alone in flight may pass the limit.
  absl::Status Grow(Ticket& ticket, int64_t bytes);

  int64_t requests() const { return requests_.load(); }
  int64_t bytes() const { return bytes_.load(); }

 private:
  const int64_t max_requests_;
  const int64_t max_bytes_;
  std::atomic<int64_t> requests_ = 0;
  std::atomic<int64_t> bytes_ = 0;
};

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_ADMISSION_H_
