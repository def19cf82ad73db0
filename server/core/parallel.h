// Where the numeric core runs its parallel work.
//
// All of it runs in one process-wide tbb::task_arena (ComputeArena), so that
// compute never competes with itself across arenas and the RPC layer can hand
// whole requests to it (EnqueueCompute) instead of computing on gRPC's
// threads. ParallelFor runs work too small to be worth a task serially on the
// calling thread, without entering TBB at all. Splitting never changes a
// result: every body computes fixed blocks, whatever range it is given.
//
// Thread-safe. The thread count is capped process-wide with
// tbb::global_control (normd's --tbb_threads).
#ifndef NORMD_SERVER_CORE_PARALLEL_H_
#define NORMD_SERVER_CORE_PARALLEL_H_

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <cstdint>
#include <memory>
#include <utility>

namespace normd {

// Below this many elements of work, a loop runs on the calling thread: waking
// workers costs more than the work (a few microseconds).
inline constexpr int64_t kSerialWorkElements = 32 * 1024;

tbb::task_arena& ComputeArena();

// How many threads compute work can use now: the arena's size, or less
// under a tbb::global_control limit (normd's --tbb_threads).
int ComputeConcurrency();

// While one is alive, the compute arena is a fresh arena of exactly
// `threads` threads, even past the machine's cores (oversubscribed, which is
// fine for comparing bits), and ComputeConcurrency() is `threads`. Every slot
// is open to TBB's workers, so work handed over with EnqueueCompute runs on
// `threads` threads too (the default arena, without a scope, keeps a slot
// for an outside thread, which enqueued work never has, and so runs it on
// one thread fewer). The server holds one for its lifetime (--tbb_threads);
// tests use them for results at a thread count. Scopes nest. Not for use while
// other compute runs (it replaces the process-wide arena).
class ScopedComputeThreads {
 public:
  explicit ScopedComputeThreads(int threads);
  ~ScopedComputeThreads();
  ScopedComputeThreads(const ScopedComputeThreads&) = delete;
  ScopedComputeThreads& operator=(const ScopedComputeThreads&) = delete;

 private:
  tbb::global_control allowed_;
  std::unique_ptr<tbb::task_arena> arena_;
  tbb::task_arena* previous_;
};

// Runs `task` (any callable, move-only is fine) in the compute arena on some
// worker thread, later; returns at once. `task` must not throw.
template <typename Task>
void EnqueueCompute(Task&& task) {
  ComputeArena().enqueue(std::forward<Task>(task));
}

// While one is alive (and `active`), ParallelFor on this thread runs its
// loop serially: for the bodies of an outer parallel loop that already has
// several tasks per thread, where nested loops would only add TBB's
// overhead and move cached data to other cores. Scopes nest; results are
// the same either way (bodies compute fixed blocks). Thread-compatible: it
// changes only its own thread's state.
class SerialLoopsScope {
 public:
  explicit SerialLoopsScope(bool active = true);
  ~SerialLoopsScope();
  SerialLoopsScope(const SerialLoopsScope&) = delete;
  SerialLoopsScope& operator=(const SerialLoopsScope&) = delete;

  // Whether a scope is active on this thread.
  static bool Active();

 private:
  bool previous_;
};

// tbb::parallel_for over `range` in the compute arena, or body(range) on this
// thread when `work_elements` (what the whole loop touches) is small or a
// SerialLoopsScope is active.
template <typename Body>
void ParallelFor(const tbb::blocked_range<int64_t>& range,
                 int64_t work_elements, const Body& body) {
  if (work_elements < kSerialWorkElements || !range.is_divisible() ||
      SerialLoopsScope::Active()) {
    body(range);
    return;
  }
  ComputeArena().execute([&] { tbb::parallel_for(range, body); });
}

}  // namespace normd

#endif  // NORMD_SERVER_CORE_PARALLEL_H_
