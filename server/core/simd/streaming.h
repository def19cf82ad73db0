// When and how the kernels write large outputs with streaming
// (non-temporal) stores: the destination lines are written without first
// being read into the cache, which raises the bandwidth of large outputs on
// x86 well above ordinary stores' (kernel_bench BM_StreamCopy against
// BM_Copy). Process-wide setting; thread-safe.
#ifndef NORMD_SERVER_CORE_SIMD_STREAMING_H_
#define NORMD_SERVER_CORE_SIMD_STREAMING_H_

#include <cstddef>
#include <cstdint>

namespace normd {

// Outputs at least this large are written with streaming stores; smaller ones
// stay in the cache for whoever reads them next (e.g. the RPC layer).
inline constexpr int64_t kDefaultStreamingOutputBytes = 8 << 20;

// The threshold in force (process-wide; thread-safe). Both ways of writing
// give bit-identical outputs, so this only trades cache use for bandwidth.
int64_t StreamingOutputBytes();
void SetStreamingOutputBytes(int64_t bytes);

// Whether an output of `elements` values of `element_size` bytes is written
// with streaming stores (at least StreamingOutputBytes()).
inline bool StreamOutput(int64_t elements, size_t element_size) {
  return elements * static_cast<int64_t>(element_size) >=
         StreamingOutputBytes();
}

// Orders this thread's streaming stores (the kernels' stream writes) before
// its later stores: called once after a run of them.
void StreamFence();

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_STREAMING_H_
