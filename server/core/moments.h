// Exact, deterministic first and second moments of tensor data. Every
// reduction splits its data into blocks whose bounds depend only on the
// shape, computes each block's (count, mean, M2) and merges them with
// Chan's formula in a fixed order: the same bits at any thread count. fp32
// blocks sum d = x - shift and d^2 in fp32 lanes flushed into fp64 (the
// shift near the block's mean, so M2 = S2 - S1^2 / n holds at large
// offsets); a block that lost accuracy is redone by the exact two-pass fp64
// algorithm, which fp64 data always takes (simd/block_moments.h).
#ifndef NORMD_SERVER_CORE_MOMENTS_H_
#define NORMD_SERVER_CORE_MOMENTS_H_

#include <cmath>
#include <cstdint>
#include <limits>
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
  double BiasedVariance() const {
    return count > 0 ? m2 / static_cast<double>(count)
                     : std::numeric_limits<double>::quiet_NaN();
  }
  // M2 / (count - 1) (NaN when count < 2).
  double UnbiasedVariance() const {
    return count > 1 ? m2 / static_cast<double>(count - 1)
                     : std::numeric_limits<double>::quiet_NaN();
  }
  // True when mean and M2 are finite (false if any value was NaN or Inf).
  bool IsFinite() const { return std::isfinite(mean) && std::isfinite(m2); }
};

// Merges `other` into `into` with Chan's formula: d = mb - ma,
// mean = ma + d nb / n, M2 = M2a + M2b + d^2 na nb / n.
void MergeMoments(Moments& into, const Moments& other);

// Elements per block of the contiguous reductions: as large as L2 allows
// (128 KiB of fp32), since each block's set-up, finish and merge leave the
// loads idle.
inline constexpr int64_t kMomentsBlock = 32768;

// Moments of x[0..n) of `dtype` (16-bit values widened as loaded), in
// kMomentsBlock blocks merged in order; parallel from two blocks on.
Moments ContiguousMoments(DType dtype, const void* x, int64_t n);
template <typename T>
Moments ContiguousMoments(const T* x, int64_t n) {
  return ContiguousMoments(FloatingDType<T>(), x, n);
}

// ContiguousMoments of the n 16-bit values of `dtype` at x widened, bit for
// bit, in one serial pass. `store_widened`: out[0..n) gets the widening (as
// WidenHalf); otherwise out is min(n, kMomentsBlock) floats of scratch.
Moments WidenedMoments(DType dtype, const uint16_t* x, float* out, int64_t n,
                       bool store_widened);

// Per-channel moments of a [outer, channels, inner] tensor of `dtype`
// (see ChannelLayout): result[c] covers channel c's outer x inner values.
// 16-bit data: the moments of its fp32 widening, widened as loaded.
std::vector<Moments> ChannelMoments(DType dtype, const void* x,
                                    const ChannelLayout& layout);
template <typename T>
std::vector<Moments> ChannelMoments(const T* x, const ChannelLayout& layout) {
  return ChannelMoments(FloatingDType<T>(), x, layout);
}

// ChannelMoments with a shift hint per channel (channel c's at
// shift_hints[c], taken as fp32): channels-last tiles of 64 channels, and
// blocks of more than kShortRow values of one channel, shift by them, not
// by their sample's means, where every one lies close enough to its sample
// (simd/fold.h, HintFits). The moments
// ChannelAffineWithMoments takes with mean = shift_hints, bit for bit.
std::vector<Moments> ChannelMoments(DType dtype, const void* x,
                                    const ChannelLayout& layout,
                                    const double* shift_hints);

// Work that rides on a reduction's read of x (ChannelAffineWithMoments):
// every block is handed to it once, on the thread that reduces it, for its
// moments and whatever else it does with the block in the same read, or
// while the block is still in that core's cache. Its methods run
// concurrently on distinct blocks.
class BlockPass {
 public:
  virtual ~BlockPass() = default;
  // The moments of x[at, at + n), n <= kMomentsBlock, a block of one
  // channel's run, as BlockMoments (simd/block_moments.h) takes them.
  virtual Moments RunBlock(int64_t at, int64_t n) const = 0;
  // The moments of `block`'s channels into out[0, width), as
  // ChannelRowBlockMoments (simd/channel_moments.h) takes them; `scratch`
  // holds 3 * width doubles.
  virtual void RunRowBlock(const ChannelRowBlock& block, double* scratch,
                           Moments* out) const = 0;
  // Elements [begin, end) of x, whose moments were just taken.
  virtual void AfterRange(int64_t begin, int64_t end) const = 0;
};

// ChannelMoments, the same bits, with `pass` riding on it: every element of
// x is in exactly one block it is handed.
std::vector<Moments> ChannelMoments(DType dtype, const void* x,
                                    const ChannelLayout& layout,
                                    const BlockPass& pass);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_MOMENTS_H_
