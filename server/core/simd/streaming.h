// When the kernels write outputs with streaming (non-temporal) stores,
// which skip reading the destination into the cache: large outputs only.
// A process-wide setting; thread-safe.
#ifndef NORMD_SERVER_CORE_SIMD_STREAMING_H_
#define NORMD_SERVER_CORE_SIMD_STREAMING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "hwy/cache_control.h"

namespace normd {

// Outputs at least this large are streamed; smaller ones stay in the cache
// for whoever reads them next.
inline constexpr int64_t kDefaultStreamingOutputBytes = 8 << 20;

// The threshold in force. Both ways write the same bits.
inline std::atomic<int64_t>& StreamingThreshold() {
  static std::atomic<int64_t> bytes{kDefaultStreamingOutputBytes};
  return bytes;
}
inline int64_t StreamingOutputBytes() {
  return StreamingThreshold().load(std::memory_order_relaxed);
}
inline void SetStreamingOutputBytes(int64_t bytes) {
  StreamingThreshold().store(bytes, std::memory_order_relaxed);
}

// Whether an output of `elements` values of `element_size` bytes streams.
inline bool StreamOutput(int64_t elements, size_t element_size) {
  return elements * static_cast<int64_t>(element_size) >=
         StreamingOutputBytes();
}

// Orders this thread's streaming stores before its later stores.
inline void StreamFence() { hwy::FlushStream(); }

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_STREAMING_H_
