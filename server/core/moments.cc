#include "server/core/moments.h"

#include <tbb/blocked_range.h>

#include <algorithm>
#include <type_traits>

#include "server/core/half.h"
#include "server/core/parallel.h"
#include "server/core/simd/block_moments.h"
#include "server/core/simd/channel_moments.h"
#include "server/core/staging.h"

namespace normd {
namespace {

// The moments of x[at, at + n) of `dtype`, n <= kMomentsBlock, with the
// shift hint at `hint` (if not null).
Moments BlockAt(DType dtype, const void* x, int64_t at, int64_t n,
                const float* hint = nullptr) {
  return BlockMoments(dtype,
                      static_cast<const char*>(x) + at * ElementSize(dtype), n,
                      Staging<float, StagingSlot::kBlockScratch>(kMomentsBlock),
                      /*store_widened=*/false, hint);
}

Moments FoldInOrder(const Moments* parts, int64_t count, int64_t stride) {
  Moments total;
  for (int64_t k = 0; k < count; ++k) MergeMoments(total, parts[k * stride]);
  return total;
}

// The pass of the plain reductions: the moments alone, with each channel's
// shift hint (hints[c]: channels-last tiles and long blocks take them) or
// none.
struct MomentsOnly {
  DType dtype;
  const void* x;
  const ChannelLayout& layout;
  const float* hints = nullptr;
  Moments RunBlock(int64_t at, int64_t n) const {
    return BlockAt(dtype, x, at, n,
                   hints == nullptr ? nullptr : hints + layout.ChannelOf(at));
  }
  void RunRowBlock(const ChannelRowBlock& block, double* scratch,
                   Moments* out) const {
    ChannelRowBlockMoments(dtype, x, layout, block, scratch, out, hints);
  }
  void AfterRange(int64_t, int64_t) const {}
};

// Channel moments of runs of kMinRun values or more (e.g. NCHW): every
// run's blocks in parallel, folded in order per run and per channel.
template <typename Pass>
std::vector<Moments> ChannelMomentsLongRuns(const ChannelLayout& layout,
                                            const Pass& pass) {
  const int64_t runs = layout.outer * layout.channels;
  const int64_t per_run = (layout.inner + kMomentsBlock - 1) / kMomentsBlock;
  std::vector<Moments> blocks(runs * per_run);
  ParallelFor(
      tbb::blocked_range<int64_t>(0, runs * per_run), layout.NumElements(),
      [&](const tbb::blocked_range<int64_t>& range) {
        for (int64_t i = range.begin(); i < range.end(); ++i) {
          const int64_t begin = (i % per_run) * kMomentsBlock;
          blocks[i] =
              pass.RunBlock((i / per_run) * layout.inner + begin,
                            std::min(kMomentsBlock, layout.inner - begin));
        }
      });
  std::vector<Moments> result(layout.channels);
  for (int64_t c = 0; c < layout.channels; ++c) {
    for (int64_t o = 0; o < layout.outer; ++o) {
      MergeMoments(
          result[c],
          FoldInOrder(blocks.data() + (o * layout.channels + c) * per_run,
                      per_run, 1));
    }
  }
  return result;
}

// Channel moments of short runs (e.g. channels-last) in row blocks
// (simd/channel_moments.h). Work items are (channel range, row group), both
// fixed by the shape; each folds its blocks in order, then the groups are
// folded in order per channel.
template <typename Pass>
std::vector<Moments> ChannelMomentsShortRuns(const ChannelLayout& layout,
                                             const Pass& pass) {
  // Elements of one row per block (runs: 16 Ki, so that the hardware
  // prefetcher sees more than a page at a time).
  const int64_t row_width = layout.inner == 1 ? kMaxChannelsLastBlock : 16384;
  // Elements per row block: as large as L2 (1 MiB of fp32) allows, so that
  // an exact-path redo reads from cache.
  constexpr int64_t kShortRunBlock = 8 * kMomentsBlock;
  constexpr int64_t kMinPerGroup = 1024;
  constexpr int64_t kMaxGroups = 256;
  const int64_t channels = layout.channels;
  const int64_t range_width =
      std::clamp<int64_t>(row_width / layout.inner, 1, channels);
  const int64_t num_ranges = (channels + range_width - 1) / range_width;
  const int64_t rows_per_block =
      std::max<int64_t>(1, kShortRunBlock / (range_width * layout.inner));
  const int64_t num_blocks =
      (layout.outer + rows_per_block - 1) / rows_per_block;
  const int64_t num_groups = std::clamp<int64_t>(
      layout.PerChannel() / kMinPerGroup, 1, std::min(num_blocks, kMaxGroups));
  std::vector<Moments> per_group(num_groups * channels);
  ParallelFor(
      tbb::blocked_range<int64_t>(0, num_ranges * num_groups),
      layout.NumElements(), [&](const tbb::blocked_range<int64_t>& items) {
        std::vector<double> scratch(3 * range_width);
        std::vector<Moments> block_moments(range_width);
        for (int64_t item = items.begin(); item < items.end(); ++item) {
          const int64_t group = item / num_ranges;
          const int64_t c0 = (item % num_ranges) * range_width;
          const int64_t c1 = std::min(channels, c0 + range_width);
          const int64_t b0 = group * num_blocks / num_groups;
          const int64_t b1 = (group + 1) * num_blocks / num_groups;
          Moments* acc = per_group.data() + group * channels + c0;
          for (int64_t b = b0; b < b1; ++b) {
            const int64_t r0 = b * rows_per_block;
            const ChannelRowBlock block{
                c0, c1, r0, std::min(layout.outer, r0 + rows_per_block)};
            pass.RunRowBlock(block, scratch.data(), block_moments.data());
            for (int64_t c = 0; c < c1 - c0; ++c) {
              MergeMoments(acc[c], block_moments[c]);
            }
          }
        }
      });
  std::vector<Moments> result(channels);
  for (int64_t c = 0; c < channels; ++c) {
    result[c] = FoldInOrder(per_group.data() + c, num_groups, channels);
  }
  return result;
}

// Runs at least this long are reduced run by run, shorter ones in row
// blocks across channels.
constexpr int64_t kMinRun = 256;

// The moments of channels that are one run each (fp32 or 16-bit, widened
// into a per-thread buffer), as rows: sixteen at a time by FloatRowsMoments.
// A specialization kept on measurement: bfloat16 on AVX3 and AVX2, bench
// case ChannelMoments of [1, C, inner] (docs/design/kernels.md).
template <typename Pass>
std::vector<Moments> OneRunChannelMoments(DType dtype, const void* x,
                                          const ChannelLayout& layout,
                                          const Pass& pass) {
  const int64_t inner = layout.inner;
  const int64_t batches = (layout.channels + 15) / 16;
  std::vector<Moments> result(layout.channels);
  ParallelFor(
      tbb::blocked_range<int64_t>(0, batches), layout.NumElements(),
      [&](const tbb::blocked_range<int64_t>& range) {
        float* buffer = Staging<float, StagingSlot::kWidenedRuns>(16 * inner);
        for (int64_t b = range.begin(); b < range.end(); ++b) {
          const int64_t c0 = 16 * b;
          const int count =
              static_cast<int>(std::min<int64_t>(16, layout.channels - c0));
          const float* runs = static_cast<const float*>(x) + c0 * inner;
          if (IsHalf(dtype)) {
            WidenHalf(dtype, static_cast<const uint16_t*>(x) + c0 * inner,
                      buffer, count * inner);
            runs = buffer;
          }
          FloatRowsMoments(runs, inner, count, result.data() + c0);
          pass.AfterRange(c0 * inner, (c0 + count) * inner);
        }
      });
  return result;
}

// ChannelMoments by the strategy that suits the layout, with `pass`.
template <typename Pass>
std::vector<Moments> ChannelMomentsWith(DType dtype, const void* x,
                                        const ChannelLayout& layout,
                                        const Pass& pass) {
  if (layout.channels == 0) return {};
  if (layout.PerChannel() == 0) return std::vector<Moments>(layout.channels);
  if (layout.inner >= kMinRun) {
    return ChannelMomentsLongRuns(layout, pass);
  }
  // Every channel one run of 16-255 values (GroupNorm of small images).
  if (dtype != DType::kFloat64 && layout.outer == 1 && layout.inner >= 16) {
    return OneRunChannelMoments(dtype, x, layout, pass);
  }
  return ChannelMomentsShortRuns(layout, pass);
}

}  // namespace

void MergeMoments(Moments& into, const Moments& other) {
  if (other.count == 0) return;
  if (into.count == 0) {
    into = other;
    return;
  }
  const double na = static_cast<double>(into.count);
  const double nb = static_cast<double>(other.count);
  const double n = na + nb;
  const double delta = other.mean - into.mean;
  into.mean += delta * (nb / n);
  into.m2 += other.m2 + delta * delta * (na * nb / n);
  into.count += other.count;
}

Moments ContiguousMoments(DType dtype, const void* x, int64_t n) {
  if (n <= 0) return Moments{};
  if (n <= kMomentsBlock) return BlockAt(dtype, x, 0, n);
  const ChannelLayout layout{.outer = 1, .channels = 1, .inner = n};
  return ChannelMomentsLongRuns(layout, MomentsOnly{dtype, x, layout})[0];
}

std::vector<Moments> ChannelMoments(DType dtype, const void* x,
                                    const ChannelLayout& layout) {
  return ChannelMomentsWith(dtype, x, layout, MomentsOnly{dtype, x, layout});
}

std::vector<Moments> ChannelMoments(DType dtype, const void* x,
                                    const ChannelLayout& layout,
                                    const double* shift_hints) {
  std::vector<float> hints(shift_hints, shift_hints + layout.channels);
  return ChannelMomentsWith(dtype, x, layout,
                            MomentsOnly{dtype, x, layout, hints.data()});
}

std::vector<Moments> ChannelMoments(DType dtype, const void* x,
                                    const ChannelLayout& layout,
                                    const BlockPass& pass) {
  return ChannelMomentsWith(dtype, x, layout, pass);
}

Moments WidenedMoments(DType dtype, const uint16_t* x, float* out, int64_t n,
                       bool store_widened) {
  Moments total;
  for (int64_t begin = 0; begin < n; begin += kMomentsBlock) {
    MergeMoments(
        total,
        BlockMoments(dtype, x + begin, std::min(kMomentsBlock, n - begin),
                     store_widened ? out + begin : out, store_widened));
  }
  return total;
}

}  // namespace normd
