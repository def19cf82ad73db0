#include "server/rpc/stream_watchdog.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace normd {

void IdleStream::FinishIfIdle(std::chrono::steady_clock::time_point cutoff,
                              absl::Duration timeout) {
  Waiting what;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || !waiting_ || since_ >= cutoff) return;
    finished_ = true;
    what = waiting_for_;
  }
  FinishIdle(absl::CancelledError(absl::StrCat(
      "stream idle: ",
      what == Waiting::kForMessage ? "no message arrived"
                                   : "the client took no response",
      " for ", absl::FormatDuration(timeout),
      " (the server's --stream_idle_timeout), so the server ended it")));
}

bool IdleStream::StartWorking() {
  std::lock_guard<std::mutex> lock(mu_);
  waiting_ = false;
  return !finished_;
}

bool IdleStream::ClaimFinish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return false;
  finished_ = true;
  return true;
}

StreamWatchdog::StreamWatchdog(absl::Duration timeout) : timeout_(timeout) {
  if (timeout_ > absl::ZeroDuration() && timeout_ != absl::InfiniteDuration()) {
    thread_ = std::thread([this] { Loop(); });
  }
}

StreamWatchdog::~StreamWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StreamWatchdog::Add(IdleStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.insert(stream);
}

void StreamWatchdog::Remove(IdleStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(stream);
}

void StreamWatchdog::Loop() {
  // A stream is ended between timeout and timeout + period after it went
  // idle.
  const auto period = absl::ToChronoMilliseconds(std::clamp(
      timeout_ / 8, absl::Milliseconds(10), absl::Milliseconds(500)));
  const auto timeout = absl::ToChronoNanoseconds(timeout_);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_.wait_for(lock, period, [this] { return stopping_; })) {
    const auto cutoff = std::chrono::steady_clock::now() - timeout;
    for (IdleStream* stream : streams_) stream->FinishIfIdle(cutoff, timeout_);
  }
}

}  // namespace normd
