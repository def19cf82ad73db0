// The moments of one contiguous block of values (at most kMomentsBlock, see
// moments.h), the unit every contiguous reduction of the core is made of,
// on Highway: compiled for every SIMD target and dispatched per call, with
// the same bits on every target.
//
// fp32 blocks of more than 128 values: one pass summing d = x - shift and
// d^2 (fused) in 64 fp32 lanes (value i in lane i % 64), flushed every 1024
// values into 32 fp64 lanes (lane j + 32 added onto lane j in fp32 first);
// the shift is the fp32 mean of the first 32 values; the values after the
// last whole 64 are added in fp64; the lanes are folded pairwise
// (fold::FoldHalves) and corrected (fold::Corrected). Blocks of at most 128
// values use 16 lanes and their own fp32 mean as the shift. A block whose
// shifted sums lost accuracy (fold::NeedsExactPath) is redone by the exact
// two-pass fp64 path, which fp64 data always takes (8 fp64 lanes). Narrower
// vectors keep the same lanes in more registers and in the same order.
// Thread-safe (pure functions).
#ifndef NORMD_SERVER_CORE_SIMD_BLOCK_MOMENTS_H_
#define NORMD_SERVER_CORE_SIMD_BLOCK_MOMENTS_H_

#include <cstdint>

#include "server/core/moments.h"
#include "server/core/tensor.h"

namespace normd {

// The moments of x[0..n), 1 <= n <= kMomentsBlock.
Moments FloatBlockMoments(const float* x, int64_t n);
Moments DoubleBlockMoments(const double* x, int64_t n);

// Rows of at most this many values are reduced many at a time by
// FloatRowsMoments (see ShortMoments in block_moments.cc): a call per row
// costs more than its values.
inline constexpr int64_t kShortRow = 128;

// FloatBlockMoments(x + k n, n) of `count` rows into out[0..count).
void FloatRowsMoments(const float* x, int64_t n, int64_t count, Moments* out);

// FloatBlockMoments of the 16-bit block x[0..n) (`dtype` bfloat16 or
// float16) widened to fp32, bit for bit, widening as it loads.
// `store_widened`: out[0..n) is left holding the widening; otherwise out
// (n floats) is scratch that gets only what the scalar parts read.
Moments HalfBlockMoments(DType dtype, const uint16_t* x, float* out, int64_t n,
                         bool store_widened);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_BLOCK_MOMENTS_H_
