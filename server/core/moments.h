// Exact, deterministic first and second moments of tensor data.
//
// Every reduction splits its data into blocks whose boundaries depend only on
// the shape (never on the number of threads), computes each block's (count,
// mean, M2), and merges the blocks with Chan's formula in a fixed order. The
// results are therefore bitwise identical for 1 or N threads.
//
// fp32 blocks take one pass over the data: sums of d = x - shift and d^2 in
// fp32 SIMD lanes flushed into fp64, with the shift the mean of the block's
// first 32 values (rows), so M2 = S2 - S1^2 / n is accurate at large mean
// offsets (never E[x^2] - E[x]^2 of raw values). A block whose shift proved
// too far from its mean (S2 > 8 M2), or whose fp32 sums over- or underflowed,
// is redone with the exact corrected two-pass algorithm in fp64, as fp64
// data always is.
#ifndef NORMD_SERVER_CORE_MOMENTS_H_
#define NORMD_SERVER_CORE_MOMENTS_H_

#include <cstdint>
#include <vector>

#include "server/core/layout.h"
#include "server/core/tensor.h"

namespace normd {

// Count, mean and sum of squared deviations (M2) of a set of values, in fp64.
// A plain value type.
struct Moments {
  int64_t count = 0;
  double mean = 0.0;
  double m2 = 0.0;

  // M2 / count (NaN when empty).
  double BiasedVariance() const;
  // M2 / (count - 1) (NaN when count < 2).
  double UnbiasedVariance() const;
  // True when mean and M2 are finite (false if any value was NaN or Inf).
  bool IsFinite() const;
};

// Merges `other` into `into` with Chan's parallel formula:
// n = na + nb; d = mb - ma; mean = ma + d nb / n; M2 = M2a + M2b + d^2 na nb /
// n.
void MergeMoments(Moments& into, const Moments& other);

// Elements per block of the contiguous reductions (128 KiB of fp32: fits L2;
// channels-last reductions use larger blocks, see moments.cc). Each block
// costs a few hundred cycles to set up, finish and merge, during which no
// loads are in flight, so blocks are as large as L2 allows (kernel_bench
// BM_HalfFit and BM_HalfGroupNorm NCHW).
inline constexpr int64_t kMomentsBlock = 32768;

// Moments of `dtype`'s x[0..n) (16-bit values widened exactly as loaded),
// blocked by kMomentsBlock and merged in order; parallel (oneTBB) when n
// spans two blocks or more.
Moments ContiguousMoments(DType dtype, const void* x, int64_t n);
template <typename T>
Moments ContiguousMoments(const T* x, int64_t n) {
  return ContiguousMoments(FloatingDType<T>(), x, n);
}

// ChannelMoments of x (`dtype` float32, bfloat16 or float16) as the row blocks
// of channels in short runs (inner < 256) reduce them (simd/channel_moments.h),
// whatever the layout: exposed so that tests can compare channels-last blocks
// of different widths.
std::vector<Moments> ShortRunChannelMoments(DType dtype, const void* x,
                                            const ChannelLayout& layout);

// Widens n values of the 16-bit `dtype` at x into out (as WidenHalf) and
// returns ContiguousMoments(out, n), bit for bit, in one pass over x
// (simd/block_moments.h). Serial: for rows of a kernel that is parallel over
// rows.
Moments WidenWithMoments(DType dtype, const uint16_t* x, float* out, int64_t n);

// The same moments as WidenWithMoments (bit for bit) without leaving the
// widened values behind: `scratch` (min(n, kMomentsBlock) floats) gets
// only what the block kernels' scalar parts read. Made of blocks of
// kMomentsBlock values merged in order: the moments of a longer x are its
// blocks' HalfMoments folded with MergeMoments. For rows whose outputs are
// computed from the 16-bit values again: no stores of the widened values.
Moments HalfMoments(DType dtype, const uint16_t* x, float* scratch, int64_t n);

// Per-channel moments of a tensor of `dtype` laid out as [outer, channels,
// inner] (see ChannelLayout): result[c] covers the outer x inner values of
// channel c. 16-bit data: the moments of its fp32 widening, bit for bit,
// without widening it in memory (values are widened as they are loaded, or
// a block at a time into small per-task buffers).
std::vector<Moments> ChannelMoments(DType dtype, const void* x,
                                    const ChannelLayout& layout);
template <typename T>
std::vector<Moments> ChannelMoments(const T* x, const ChannelLayout& layout) {
  return ChannelMoments(FloatingDType<T>(), x, layout);
}

}  // namespace normd

#endif  // NORMD_SERVER_CORE_MOMENTS_H_
