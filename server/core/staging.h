// Memory the SIMD kernels read a vector at a time beside their input:
// 64-byte aligned, so that no full-vector load splits a cache line.
#ifndef NORMD_SERVER_CORE_STAGING_H_
#define NORMD_SERVER_CORE_STAGING_H_

#include <cstdint>

#include "hwy/aligned_allocator.h"

namespace normd {

// An array of T, 64-byte aligned (hwy::AllocateAligned<T>(n) makes one).
template <typename T>
using VectorArray = hwy::AlignedFreeUniquePtr<T[]>;

// The core's per-thread buffers, one per slot and element type, so that a
// caller's buffer is never one its callees use.
enum class StagingSlot {
  kKernelOutput,  // 16-bit rows' widened batch, or statistics scratch.
  kKernelInput,   // Input copied or widened for a piece.
  kBlockScratch,  // A 16-bit moments block's widened values.
  kWidenedRuns,   // 16-bit channel runs widened for FloatRowsMoments.
};

// This thread's buffer of `kSlot`, at least `elements` long (grown, never
// shrunk; its contents are not kept across a growth).
template <typename T, StagingSlot kSlot>
T* Staging(int64_t elements) {
  thread_local VectorArray<T> buffer;
  thread_local int64_t size = 0;
  if (size < elements) {
    buffer = hwy::AllocateAligned<T>(elements);
    size = elements;
  }
  return buffer.get();
}

}  // namespace normd

#endif  // NORMD_SERVER_CORE_STAGING_H_
