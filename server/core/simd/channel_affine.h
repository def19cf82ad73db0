// The elementwise affine of channel normalization (BatchNorm, GroupNorm,
// InstanceNorm), into the cache, on Highway: compiled for every SIMD target
// and dispatched per call, the same bits on every target. Thread-safe (pure
// functions).
#ifndef NORMD_SERVER_CORE_SIMD_CHANNEL_AFFINE_H_
#define NORMD_SERVER_CORE_SIMD_CHANNEL_AFFINE_H_

#include <cstdint>

namespace normd {

// Elements [begin, end) of a [outer, channels, inner] tensor, element
// begin + k read from x[k] and written to out[k]:
// fp32: out = fma(x - hi[c], scale[c], shift[c]) (one rounding after the
// subtraction); fp64: out = (x - mean[c]) * scale[c] + shift[c], each step
// rounded. Channels-last (inner == 1) takes the three arrays expanded to
// period + channels entries, entry i for channel i % channels (period a
// multiple of channels), so that a run of period elements from any channel
// reads them without a modulo.
void FloatChannelAffineRange(const float* x, float* out, int64_t begin,
                             int64_t end, int64_t channels, int64_t inner,
                             int64_t period, const float* hi,
                             const float* scale, const float* shift);
void DoubleChannelAffineRange(const double* x, double* out, int64_t begin,
                              int64_t end, int64_t channels, int64_t inner,
                              int64_t period, const double* mean,
                              const double* scale, const double* shift);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_CHANNEL_AFFINE_H_
