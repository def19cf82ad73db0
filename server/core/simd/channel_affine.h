// The elementwise affine of channel normalization (BatchNorm, GroupNorm,
// InstanceNorm), on Highway with the same bits on every target: one walk
// over the layout for every type and store policy. Pure functions.
#ifndef NORMD_SERVER_CORE_SIMD_CHANNEL_AFFINE_H_
#define NORMD_SERVER_CORE_SIMD_CHANNEL_AFFINE_H_

#include <cmath>
#include <cstdint>

#include "server/core/tensor.h"

namespace normd {

// Streaming stores (the caller fences with StreamFence) or ordinary ones;
// x prefetched a little ahead of the loads into L1 when `prefetch_input`;
// when `prefetch_next_bytes` > 0, x that many bytes ahead into L2 instead
// (a caller's next range, read again later).
struct ChannelWrite {
  bool stream = false;
  bool prefetch_input = false;
  int64_t prefetch_next_bytes = 0;
};

// Elements [begin, end) of a [outer, channels, inner] tensor of `dtype`,
// element begin + k from x[k] to out[k]: fp32 and 16-bit, fma(x - a[c],
// b[c], c[c]) in fp32, the arrays floats; fp64, (x - a[c]) * b[c] + c[c],
// the arrays doubles. Channels-last (inner == 1) takes the arrays expanded
// to period + channels entries (entry i for channel i % channels, period a
// multiple of channels): a run of period elements reads them in order.
void ChannelAffineWrite(DType dtype, const void* x, void* out, int64_t begin,
                        int64_t end, int64_t channels, int64_t inner,
                        int64_t period, const void* a, const void* b,
                        const void* c, const ChannelWrite& write);

// True when fma(x - a, b, c) in fp32 is NaN only where x is: finite
// constants and b != 0 (an x - a that overflows stays infinite). The fused
// passes then narrow 16-bit results without their NaN step and write again
// what held a NaN.
inline bool NaNOnlyFromInput(float a, float b, float c) {
  return std::isfinite(a) && std::isfinite(b) && std::isfinite(c) && b != 0.0f;
}

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_CHANNEL_AFFINE_H_
