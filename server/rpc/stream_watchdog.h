// Ends streaming calls that make no progress (--stream_idle_timeout), so that
// clients that open streams and then say nothing cannot hold the server's
// resources forever. A background thread looks at every registered stream a
// few times per timeout and tells each one that has waited on its client for
// longer than the timeout to finish.
//
// Thread-safe. A stream is registered from its reactor's constructor and
// removed in its OnDone, before it is destroyed; IdleStream::FinishIfIdle
// runs under the watchdog's lock, so Remove waits for a call in progress and
// the stream is never used after it is gone.
#ifndef NORMD_SERVER_RPC_STREAM_WATCHDOG_H_
#define NORMD_SERVER_RPC_STREAM_WATCHDOG_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace normd {

// The idle-tracking state of one stream: whether it is waiting on its
// client (for a message, or for the client to take a response) and since
// when, or working, or finished. Its reactor moves it between phases under
// its mutex and starts its reads and writes under that mutex, so a stream
// the watchdog finished never starts another operation.
//
// Thread-safe.
class IdleStream {
 public:
  enum class Waiting { kForMessage, kForClientToRead };

  virtual ~IdleStream() = default;

  // Called by the watchdog: if the stream has waited on its client since
  // before `cutoff`, marks it finished and calls FinishIdle.
  void FinishIfIdle(std::chrono::steady_clock::time_point cutoff,
                    absl::Duration timeout);

 protected:
  // Marks the stream waiting for `what` from now on and runs `start` (the
  // StartRead or StartWrite) under the stream's mutex; false, without
  // running it, once the stream is finished.
  template <typename Fn>
  bool StartWaiting(Waiting what, Fn&& start) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return false;
    waiting_ = true;
    waiting_for_ = what;
    since_ = std::chrono::steady_clock::now();
    start();
    return true;
  }
  // The stream got what it waited for and works: not idle. False once the
  // stream is finished (the caller drops what arrived).
  bool StartWorking();
  // Claims the one Finish of the stream: true for the first caller.
  bool ClaimFinish();
  // Ends the idle stream with `status`; called once, by FinishIfIdle,
  // outside the stream's mutex.
  virtual void FinishIdle(const absl::Status& status) = 0;

 private:
  std::mutex mu_;
  bool finished_ = false;
  bool waiting_ = false;
  Waiting waiting_for_ = Waiting::kForMessage;
  std::chrono::steady_clock::time_point since_;
};

class StreamWatchdog {
 public:
  // `timeout` zero or infinite: streams are never ended for idleness (the
  // thread is not started).
  explicit StreamWatchdog(absl::Duration timeout);
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  void Add(IdleStream* stream);
  void Remove(IdleStream* stream);

 private:
  void Loop();

  const absl::Duration timeout_;
  std::mutex mu_;
  std::condition_variable stop_;
  bool stopping_ = false;
  absl::flat_hash_set<IdleStream*> streams_;
  std::thread thread_;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_STREAM_WATCHDOG_H_
