#include "server/core/drift_monitor.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace normd {

DriftMonitor::DriftMonitor(DriftOptions options, Clock clock)
    : options_(options), clock_(clock != nullptr ? std::move(clock) : Clock([] {
        return absl::ToUnixNanos(absl::Now());
      })) {}

std::shared_ptr<DriftMonitor::Slot> DriftMonitor::Find(
    absl::string_view name) const {
  MutexLock lock(&mu_);
  auto it = slots_.find(name);
  return it == slots_.end() ? nullptr : it->second;
}

std::shared_ptr<DriftMonitor::Slot> DriftMonitor::FindOrAdd(
    absl::string_view name) {
  MutexLock lock(&mu_);
  std::shared_ptr<Slot>& slot = slots_[name];
  if (slot == nullptr) slot = std::make_shared<Slot>();
  return slot;
}

bool DriftMonitor::ShouldObserve(absl::string_view name) {
  std::shared_ptr<Slot> slot = FindOrAdd(name);
  MutexLock lock(&slot->mu);
  const int64_t every = std::max<int64_t>(options_.sample_every, 1);
  return slot->requests++ % every == 0;
}

void DriftMonitor::Observe(absl::string_view name,
                           absl::Span<const Moments> moments) {
  const auto channels = static_cast<int64_t>(moments.size());
  const int64_t now = clock_();
  std::shared_ptr<Slot> slot = FindOrAdd(name);
  MutexLock lock(&slot->mu);
  if (!slot->window.has_value() || slot->window->channels() != channels) {
    slot->window.emplace(channels, options_.buckets, options_.bucket_seconds);
  }
  slot->window->Add(moments, now);
}

std::vector<Moments> DriftMonitor::Window(absl::string_view name,
                                          int64_t channels) const {
  const int64_t now = clock_();
  std::shared_ptr<Slot> slot = Find(name);
  if (slot != nullptr) {
    MutexLock lock(&slot->mu);
    if (slot->window.has_value() && slot->window->channels() == channels) {
      return slot->window->Merged(now);
    }
  }
  return std::vector<Moments>(channels);
}

void DriftMonitor::Clear(absl::string_view name) {
  std::shared_ptr<Slot> slot = Find(name);
  if (slot == nullptr) return;
  MutexLock lock(&slot->mu);
  slot->window.reset();
}

void DriftMonitor::Forget(absl::string_view name) {
  MutexLock lock(&mu_);
  slots_.erase(name);
}

}  // namespace normd
