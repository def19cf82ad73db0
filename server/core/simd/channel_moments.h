// The per-channel moments of one row block of a [outer, channels, inner]
// tensor (see ChannelLayout), the unit of the short-run channel reductions
// (moments.cc): channels [c0, c1) over the rows (outer indices) [r0, r1).
// On Highway: compiled for every SIMD target and dispatched once per block,
// with the same bits on every target.
//
// fp32 and 16-bit data (widened exactly as loaded) take fast paths whose
// lanes are fixed, whatever the vector width:
// - channels-last (inner == 1): each channel has its own fp32 lane. Its
//   shift is the fp32 mean of its first 32 rows in the block; d = x - shift
//   and d^2 (fused) are summed in fp32, flushed into fp64 every 16 rows.
//   Whole tiles of 64 channels; the channels past them in narrow tiles of
//   32, 16, .., 1 channels whose 64 lanes take 64 / width rows per step
//   (lane s * width + j: channel j of row s of the step), flushed every 16
//   steps and added per channel in lane order at the end.
// - runs of 16 values or more (1 < inner < 256, e.g. 7x7 images): 16 fp64
//   lanes per run (value i in lane i % 16), folded pairwise and added to the
//   channel's sums; the shift is the mean of its first run's first 16
//   values.
// A block where the fast sums lost accuracy (fold::NeedsExactPath), fp64
// data, and runs of 2 to 15 values take the exact two-pass fp64 loops.
// Thread-safe (pure functions).
#ifndef NORMD_SERVER_CORE_SIMD_CHANNEL_MOMENTS_H_
#define NORMD_SERVER_CORE_SIMD_CHANNEL_MOMENTS_H_

#include <cstdint>

#include "server/core/layout.h"
#include "server/core/moments.h"
#include "server/core/tensor.h"

namespace normd {

// Channels [c0, c1) over rows [r0, r1) of a ChannelLayout.
struct ChannelRowBlock {
  int64_t c0 = 0, c1 = 0, r0 = 0, r1 = 0;
  int64_t width() const { return c1 - c0; }
};

// The widest channels-last block ChannelRowBlockMoments takes.
inline constexpr int64_t kMaxChannelsLastBlock = 1024;

// The moments of each channel of `block` of x (`dtype` any) into
// out[0, width). `scratch` holds 3 * width doubles.
void ChannelRowBlockMoments(DType dtype, const void* x,
                            const ChannelLayout& layout,
                            const ChannelRowBlock& block, double* scratch,
                            Moments* out);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_CHANNEL_MOMENTS_H_
