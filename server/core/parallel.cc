#include "server/core/parallel.h"

#include <tbb/global_control.h>

#include <algorithm>

namespace normd {

tbb::task_arena& ComputeArena() {
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

int ComputeConcurrency() {
  const auto limit = tbb::global_control::active_value(
      tbb::global_control::max_allowed_parallelism);
  return static_cast<int>(std::min<size_t>(
      static_cast<size_t>(ComputeArena().max_concurrency()), limit));
}

}  // namespace normd
