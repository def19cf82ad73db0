// One call's lifecycle, the same for every front end: the token decision,
// the admission ticket (a slot and the bytes the call holds), the deadline,
// the in-flight and latency metrics, and the durability wait (a call that
// changed models is answered only once its changes are on disk). A front end
// makes a Call when a request arrives, asks it in turn to Authenticate,
// Admit and Run, and answers with the status Run hands it (or with the first
// refusal); Finish records the call.
//
// Not thread-safe: a Call belongs to one request, and its front end uses it
// from one thread at a time (it may hand the call from its I/O thread to the
// compute arena, and the log's thread calls Run's `done`).
#ifndef NORMD_SERVER_SERVICE_CALL_H_
#define NORMD_SERVER_SERVICE_CALL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/service/admission.h"
#include "server/service/bearer_token.h"
#include "server/service/methods.h"
#include "server/service/service.h"

namespace normd {

// Requests at least this large are computed in the compute arena rather than
// on the thread that received them (a gRPC callback thread), so that one big
// tensor never holds up the threads serving everyone else; smaller ones are
// cheaper to compute in place than to hand over. REST computes every request
// off its I/O thread.
inline constexpr int64_t kOffloadRequestBytes = 256 << 10;

class Call {
 public:
  // The call has started: counted in flight from now.
  Call(Service& service, Protocol protocol, Method method);
  // A call never finished is recorded as CANCELLED.
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  Protocol protocol() const { return protocol_; }
  Method method() const { return method_; }

  // The token decision: OK when the server needs no token or
  // `authorization` (the value the call presented; nullopt: none) carries
  // it; UNAUTHENTICATED naming where `carrier` says the protocol puts it.
  absl::Status Authenticate(std::optional<absl::string_view> authorization,
                            TokenCarrier carrier) const;

  // Admits the call holding `bytes`: RESOURCE_EXHAUSTED naming the flag
  // (--max_inflight_requests, --max_inflight_bytes) otherwise, counted as
  // refused. A call admitted again (a stream's next message) holds only the
  // new ticket.
  absl::Status Admit(int64_t bytes);
  // Grows the admitted bytes by `bytes` (e.g. what its reply will hold), or
  // RESOURCE_EXHAUSTED as Admit.
  absl::Status AdmitMore(int64_t bytes);
  // Gives the slot and the bytes back (an answered call, a stream waiting
  // for its next message).
  void ReleaseAdmission() { ticket_.Release(); }

  // The time after which its client no longer waits (default: none).
  void set_deadline(absl::Time deadline) { deadline_ = deadline; }
  // Tells whether the client has gone (e.g. a cancelled gRPC call).
  void set_cancelled_probe(std::function<bool()> probe) {
    cancelled_ = std::move(probe);
  }

  // Runs `body`, unless the client has gone (CANCELLED) or the deadline has
  // passed (DEADLINE_EXCEEDED), turning an allocation that cannot be made
  // into RESOURCE_EXHAUSTED. `done` gets the result once every model change
  // the body made is durable: at once without --state_dir or without a
  // change, else from the log's thread (the failure to make it durable
  // replaces an OK result).
  void Run(absl::FunctionRef<absl::Status()> body,
           absl::AnyInvocable<void(absl::Status) &&> done);

  // Run's two halves, for a stream that acknowledges many messages at once:
  // runs `body` (guarded) with its changes' durability deferred, and returns
  // its status and the log position they need (0: none); WhenDurable calls
  // `done` once the log is durable up to `sequence`.
  struct Deferred {
    absl::Status status;
    uint64_t sequence = 0;
  };
  static Deferred RunDeferred(absl::FunctionRef<absl::Status()> body);
  void WhenDurable(uint64_t sequence,
                   absl::AnyInvocable<void(absl::Status) &&> done);

  // Records the call's code and duration (the first time; later calls are
  // ignored) and releases its admission.
  void Finish(absl::StatusCode code);
  bool finished() const { return finished_; }

  // Since the call started.
  double ElapsedSeconds() const;

 private:
  Service& service_;
  const Protocol protocol_;
  const Method method_;
  const std::chrono::steady_clock::time_point start_;
  Admission::Ticket ticket_;
  absl::Time deadline_ = absl::InfiniteFuture();
  std::function<bool()> cancelled_;
  bool finished_ = false;
};

// Runs `body`, turning an allocation that cannot be made (std::bad_alloc,
// std::length_error) into RESOURCE_EXHAUSTED, so that no exception crosses
// into a front end's library.
absl::Status RunGuarded(absl::FunctionRef<absl::Status()> body);

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_CALL_H_
