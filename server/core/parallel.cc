#include "server/core/parallel.h"

#include <tbb/global_control.h>

#include <algorithm>
#include <atomic>

namespace normd {
namespace {
// A ScopedComputeThreads' arena, when one is alive.
std::atomic<tbb::task_arena*> arena_override{nullptr};
}  // namespace

tbb::task_arena& ComputeArena() {
  if (tbb::task_arena* scoped =
          arena_override.load(std::memory_order_acquire)) {
    return *scoped;
  }
  // Never destroyed: tasks may still be finishing while the process exits.
  static tbb::task_arena* arena = [] {
    auto* a = new tbb::task_arena();
    a->initialize();
    return a;
  }();
  return *arena;
}

namespace {
thread_local bool serial_loops = false;
}  // namespace

SerialLoopsScope::SerialLoopsScope(bool active) : previous_(serial_loops) {
  serial_loops = previous_ || active;
}

SerialLoopsScope::~SerialLoopsScope() { serial_loops = previous_; }

bool SerialLoopsScope::Active() { return serial_loops; }

ScopedComputeThreads::ScopedComputeThreads(int threads)
    // TBB starts one worker fewer than its limit (it counts the thread that
    // starts work): `threads` workers need `threads` + 1.
    : allowed_(tbb::global_control::max_allowed_parallelism,
               static_cast<size_t>(threads) + 1),
      arena_(std::make_unique<tbb::task_arena>(threads,
                                               /*reserved_for_masters=*/0)),
      previous_(nullptr) {
  arena_->initialize();
  previous_ = arena_override.exchange(arena_.get(), std::memory_order_acq_rel);
}

ScopedComputeThreads::~ScopedComputeThreads() {
  arena_override.store(previous_, std::memory_order_release);
}

int ComputeConcurrency() {
  const auto limit = tbb::global_control::active_value(
      tbb::global_control::max_allowed_parallelism);
  return static_cast<int>(std::min<size_t>(
      static_cast<size_t>(ComputeArena().max_concurrency()), limit));
}

}  // namespace normd
