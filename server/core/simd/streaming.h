// When the kernels write outputs with streaming (non-temporal) stores,
// which skip reading the destination into the cache: large outputs only.
// A process-wide setting; thread-safe.
#ifndef NORMD_SERVER_CORE_SIMD_STREAMING_H_
#define NORMD_SERVER_CORE_SIMD_STREAMING_H_

#include <cstddef>
#include <cstdint>

namespace normd {

// Outputs at least this large are streamed; smaller ones stay in the cache
// for whoever reads them next.
inline constexpr int64_t kDefaultStreamingOutputBytes = 8 << 20;

// The threshold in force. Both ways write the same bits.
int64_t StreamingOutputBytes();
void SetStreamingOutputBytes(int64_t bytes);

// Whether an output of `elements` values of `element_size` bytes streams.
inline bool StreamOutput(int64_t elements, size_t element_size) {
  return elements * static_cast<int64_t>(element_size) >=
         StreamingOutputBytes();
}

// Orders this thread's streaming stores before its later stores.
void StreamFence();

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_STREAMING_H_
