// The per-channel moments of one row block of a [outer, channels, inner]
// tensor: channels [c0, c1) over rows (outer indices) [r0, r1), the unit
// of the short-run channel reductions (moments.cc). On Highway, the same
// bits on every target: lanes are fixed, whatever the vector width.
// - Channels-last (inner == 1), fp32 and 16-bit: each channel its own fp32
//   lane, shifted by the fp32 mean of its first 32 rows (or a hint that
//   fits, in tiles of 64 channels), d and d^2 (fused)
//   flushed into fp64 every 16 rows; 64 channels per tile, and narrow tiles
//   of 32, 16, .., 1 channels whose 64 lanes take 64 / width rows a step
//   (fewer than 64 channels that are whole rows: one narrow tile of them
//   all, its lanes taking floor(64 / width) rows a step).
// - Runs of 16 to 255 values: 16 fp64 lanes per run, folded pairwise into
//   the channel's sums, shifted by the mean of its first 16 values.
// fp64 data, runs of 2 to 15 values and blocks whose fast sums lost
// accuracy (fold::NeedsExactPath) take the exact two-pass fp64 loops. Pure
// functions.
#ifndef NORMD_SERVER_CORE_SIMD_CHANNEL_MOMENTS_H_
#define NORMD_SERVER_CORE_SIMD_CHANNEL_MOMENTS_H_

#include <cstdint>

#include "server/core/layout.h"
#include "server/core/moments.h"
#include "server/core/tensor.h"

namespace normd {

// The widest channels-last block ChannelRowBlockMoments takes.
inline constexpr int64_t kMaxChannelsLastBlock = 1024;

// The moments of each channel of `block` of x (`dtype` any) into
// out[0, width). `scratch` holds 3 * width doubles. `shift_hints` (channel
// c's at shift_hints[c], or null): a channels-last tile of 64 channels
// shifts by its hints where every one of them lies close enough to its
// sample's mean (fold::HintFits), as the pass fused with the affine does
// with its a: the same bits as that pass.
void ChannelRowBlockMoments(DType dtype, const void* x,
                            const ChannelLayout& layout,
                            const ChannelRowBlock& block, double* scratch,
                            Moments* out, const float* shift_hints = nullptr);

// ChannelRowBlockMoments of a channels-last block (inner == 1) of whole
// tiles (width a multiple of 64) of fp32 or 16-bit x, a the shift hints,
// that also writes the
// block's ChannelAffineWrite, the same bits: y[r * channels + c] =
// fma(x - a[c], b[c], c[c]) in fp32 narrowed to `dtype`, in the same read
// of x, each vector stored as soon as the sums have it (a 16-bit block that
// held a NaN is written again). `stream`: streaming stores (every row of y
// aligned to 64 bytes; the caller fences). y must not overlap x (a block
// that loses accuracy reads x again).
void ChannelRowBlockMomentsWithAffine(DType dtype, const void* x, void* y,
                                      const ChannelLayout& layout,
                                      const ChannelRowBlock& block,
                                      const float* a, const float* b,
                                      const float* c, bool stream,
                                      double* scratch, Moments* out);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_CHANNEL_MOMENTS_H_
