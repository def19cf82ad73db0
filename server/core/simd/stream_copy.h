// Copies with non-temporal (streaming) stores: the destination lines are
// written without first being read into the cache, which raises the
// bandwidth of large outputs on x86 well above memcpy's (kernel_bench
// BM_StreamCopy against BM_Copy). Kernels compute an output piece into a
// small cache-resident buffer and stream it out. Stateless; thread-safe.
#ifndef NORMD_SERVER_CORE_SIMD_STREAM_COPY_H_
#define NORMD_SERVER_CORE_SIMD_STREAM_COPY_H_

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

// memcpy(dst, src, bytes) with streaming stores where the CPU has them, then a
// store fence so that the data is visible to other threads afterwards.
void StreamCopy(void* dst, const void* src, size_t bytes);

// Orders this thread's streaming stores (the kernels' stream writes) before
// its later stores: called once after a run of them.
void StreamFence();

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_STREAM_COPY_H_
