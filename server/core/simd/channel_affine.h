// The elementwise affine of channel normalization (BatchNorm, GroupNorm,
// InstanceNorm), on Highway: compiled for every SIMD target and dispatched
// per call, the same bits on every target. One walk over the layout for
// every type and store policy. Thread-safe (pure functions).
#ifndef NORMD_SERVER_CORE_SIMD_CHANNEL_AFFINE_H_
#define NORMD_SERVER_CORE_SIMD_CHANNEL_AFFINE_H_

#include <cstdint>

#include "server/core/tensor.h"

namespace normd {

// How a range is written: streaming stores (`stream`; the caller fences
// with StreamFence, streaming.h) or ordinary ones; x prefetched ahead of
// the loads when `prefetch_input`.
struct ChannelWrite {
  bool stream = false;
  bool prefetch_input = false;
};

// Elements [begin, end) of a [outer, channels, inner] tensor of `dtype`,
// element begin + k read from x[k] and written to out[k]:
// fp32 and 16-bit: out = fma(x - a[c], b[c], c[c]) in fp32 (one rounding
// after the subtraction; 16-bit values widened exactly and the results
// rounded to nearest even), the arrays floats; fp64: out = (x - a[c]) *
// b[c] + c[c], each step rounded, the arrays doubles. Channels-last
// (inner == 1) takes the arrays expanded to period + channels entries,
// entry i for channel i % channels (period a multiple of channels), so that
// a run of period elements from any channel reads them without a modulo.
void ChannelAffineWrite(DType dtype, const void* x, void* out, int64_t begin,
                        int64_t end, int64_t channels, int64_t inner,
                        int64_t period, const void* a, const void* b,
                        const void* c, const ChannelWrite& write);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_CHANNEL_AFFINE_H_
