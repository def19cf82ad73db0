// The moments of one contiguous block (at most kMomentsBlock values), the
// unit of every contiguous reduction, on Highway with the same bits on
// every target. fp32 blocks of more than 128 values: d = x - shift and d^2
// (fused) summed in 64 fp32 lanes (value i in lane i % 64), flushed every
// 1024 values into 32 fp64 lanes, the shift the fp32 mean of the first 32
// values, the values past the last whole 64 added in fp64, the lanes
// folded pairwise (fold.h). Blocks of at most 128 values: 16 lanes, their
// own mean as the shift. A block that lost accuracy (fold::NeedsExactPath)
// is redone by the exact two-pass fp64 path (8 fp64 lanes), as fp64 data
// always is. Narrower vectors hold the same lanes in more registers. Pure
// functions.
#ifndef NORMD_SERVER_CORE_SIMD_BLOCK_MOMENTS_H_
#define NORMD_SERVER_CORE_SIMD_BLOCK_MOMENTS_H_

#include <cstdint>

#include "server/core/moments.h"
#include "server/core/tensor.h"

namespace normd {

// Rows of at most this many values are reduced sixteen at a time by
// FloatRowsMoments: a call per row costs more than its values.
inline constexpr int64_t kShortRow = 128;

// The moments of the `count` blocks x[k n..(k + 1) n) into out[0..count),
// 1 <= n <= kMomentsBlock.
void FloatRowsMoments(const float* x, int64_t n, int64_t count, Moments* out);

// The moments of x[0..n), 1 <= n <= kMomentsBlock.
inline Moments FloatBlockMoments(const float* x, int64_t n) {
  Moments result;
  FloatRowsMoments(x, n, 1, &result);
  return result;
}
Moments DoubleBlockMoments(const double* x, int64_t n);

// FloatBlockMoments of the 16-bit block x[0..n) widened to fp32, bit for
// bit, widening as it loads. `store_widened`: out[0..n) gets the widening;
// otherwise out (n floats) gets only what the scalar parts read.
Moments HalfBlockMoments(DType dtype, const uint16_t* x, float* out, int64_t n,
                         bool store_widened);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_BLOCK_MOMENTS_H_
