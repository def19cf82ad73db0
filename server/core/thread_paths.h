// Counts of the engine's choices that depend on the number of compute
// threads (ComputeConcurrency): which way each went, so that a test run at
// several thread counts can prove it took every path whose results it
// compares. Each choice is one relaxed atomic increment per call, not per
// element. Thread-safe.
#ifndef NORMD_SERVER_CORE_THREAD_PATHS_H_
#define NORMD_SERVER_CORE_THREAD_PATHS_H_

#include <cstdint>

namespace normd {

enum class ThreadPath : int {
  // LayerNorm rows of kLongLayerNormRow or more: whole rows per thread
  // (enough rows for every thread) or each row spread over every thread.
  kLayerNormWholeLongRows,
  kLayerNormLongRowsSpread,
  // Stateless GroupNorm / InstanceNorm of contiguous groups: chunks of
  // groups with their loops on one thread (several chunks per thread), or
  // each chunk's loops spread too.
  kGroupChunksOnOneThread,
  kGroupChunksSpread,
  // Stateless GroupNorm / InstanceNorm of samples of several rows
  // (channels-last): one sample per task (enough samples for every thread)
  // or the two-pass path over the whole tensor.
  kGroupSamplesFused,
  kGroupSamplesTwoPass,
  kCount,
};

void CountThreadPath(ThreadPath path);

// How many times `path` was taken in this process.
int64_t ThreadPathCount(ThreadPath path);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_THREAD_PATHS_H_
