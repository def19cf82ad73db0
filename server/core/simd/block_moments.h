// The moments of one contiguous block (at most kMomentsBlock values), the
// unit of every contiguous reduction, on Highway with the same bits on
// every target. fp32 blocks of more than 256 values: d = x - shift and d^2
// (fused) summed in 64 fp32 lanes (value i in lane i % 64), flushed every
// 1024 values into 32 fp64 lanes, the shift the fp32 mean of the first 32
// values (or a shift hint), the values past the last whole 64 added in fp64,
// the lanes folded pairwise (fold.h). Blocks of at most 256 values: 16 lanes,
// their own mean as the shift, folded by fold::SixteenRowSums' tree. A block
// that lost accuracy (fold::NeedsExactPath) is redone by the exact two-pass
// fp64 path (8 fp64 lanes), as fp64 data always is. Narrower vectors hold the
// same lanes in more registers. Pure functions.
#ifndef NORMD_SERVER_CORE_SIMD_BLOCK_MOMENTS_H_
#define NORMD_SERVER_CORE_SIMD_BLOCK_MOMENTS_H_

#include <cstdint>

#include "server/core/moments.h"
#include "server/core/tensor.h"

namespace normd {

// The fp32 lanes of a long block (a value per lane per step).
inline constexpr int kBlockLanes = 64;

// Rows of at most this many values are reduced sixteen at a time by
// FloatRowsMoments: a call per row costs more than its values.
inline constexpr int64_t kShortRow = 256;

// The moments of the `count` blocks x[k n..(k + 1) n) into out[0..count),
// 1 <= n <= kMomentsBlock.
void FloatRowsMoments(const float* x, int64_t n, int64_t count, Moments* out);

// The moments of the block x[0..n) of `dtype`, 1 <= n <= kMomentsBlock.
// 16-bit blocks: those of their fp32 widening, bit for bit, widened as
// loaded; out[0..n) gets the widening with `store_widened`, else (out n
// floats) only what the scalar parts read. `shift_hint` (if not null): a
// block of more than kShortRow fp32 or 16-bit values shifts by it, not by
// its sample's mean, where it lies close enough to its first 128 values
// (fold::HintFits; never for a constant sample).
Moments BlockMoments(DType dtype, const void* x, int64_t n,
                     float* out = nullptr, bool store_widened = false,
                     const float* shift_hint = nullptr);

// BlockMoments of x[0..n) (fp32 or 16-bit, kShortRow < n <= kMomentsBlock)
// with the shift hint a that also writes one channel's ChannelAffineWrite
// of it, the same bits, y[k] = fma(x[k] - a, b, c) in fp32 narrowed to
// `dtype`, in the same read of x: each vector stored as soon as the sums
// have it (a 16-bit block that held a NaN is written again); where the
// hint is taken, x - a is done once for both. `stream`: streaming stores (y
// aligned to 64 bytes; the caller fences). y must not overlap x (a block that
// takes the exact path reads x again).
Moments BlockMomentsWithAffine(DType dtype, const void* x, void* y, int64_t n,
                               float a, float b, float c, bool stream);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_BLOCK_MOMENTS_H_
