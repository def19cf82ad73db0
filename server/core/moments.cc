#include "server/core/moments.h"

#include <tbb/blocked_range.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "server/core/parallel.h"
#include "server/core/simd.h"

namespace normd {
namespace {

// Independent accumulators per reduction, so that the compiler can keep them
// in SIMD registers; the lane sums are combined in a fixed order.
constexpr int kLanes = 8;
// fp32 lanes of the fast path, and how many values each fp32 lane sums
// before it is flushed into fp64 (keeps every fp32 partial sum short).
constexpr int kFloatLanes = 32;
constexpr int64_t kFloatFlush = 256;  // Elements per flush (8 per lane).

template <int N>
double SumLanes(const double (&lanes)[N]) {
  // Pairwise, in a fixed order.
  double tmp[N];
  std::copy(lanes, lanes + N, tmp);
  for (int step = N / 2; step >= 1; step /= 2) {
    for (int j = 0; j < step; ++j) tmp[j] += tmp[j + step];
  }
  return tmp[0];
}

// Moments from a first-pass mean `mean0` and the second-pass sums of
// d = x - mean0 (`residual`) and d^2 (`squares`) over n values.
NORMD_INLINE_INTO_CLONES Moments Corrected(int64_t n, double mean0,
                                           double residual, double squares) {
  const double count = static_cast<double>(n);
  Moments result;
  result.count = n;
  result.mean = mean0 + residual / count;
  result.m2 = std::max(0.0, squares - residual * residual / count);
  if (!std::isfinite(mean0) || !std::isfinite(squares)) {
    // Keep the non-finite marker visible in both fields.
    result.mean = result.m2 = std::numeric_limits<double>::quiet_NaN();
  }
  return result;
}

// Corrected two-pass moments of one block x[0..n), n >= 1, entirely in fp64:
// a first pass for the mean, a second for the deviations d = x - mean0 and
// their squares; the residual sum of d corrects both the mean and M2 for
// rounding in mean0.
template <typename T>
NORMD_INLINE_INTO_CLONES Moments BlockMomentsExactImpl(const T* x, int64_t n) {
  double sum[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) sum[j] += static_cast<double>(x[i + j]);
  }
  for (int j = 0; i < n; ++i, ++j) sum[j] += static_cast<double>(x[i]);
  const double mean0 = SumLanes(sum) / static_cast<double>(n);
  double dev[kLanes] = {};
  double sq[kLanes] = {};
  i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double d = static_cast<double>(x[i + j]) - mean0;
      dev[j] += d;
      sq[j] += d * d;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    const double d = static_cast<double>(x[i]) - mean0;
    dev[j] += d;
    sq[j] += d * d;
  }
  return Corrected(n, mean0, SumLanes(dev), SumLanes(sq));
}

NORMD_MULTIVERSION Moments BlockMomentsExactF32(const float* x, int64_t n) {
  return BlockMomentsExactImpl(x, n);
}
NORMD_MULTIVERSION Moments BlockMomentsF64(const double* x, int64_t n) {
  return BlockMomentsExactImpl(x, n);
}

// True when an fp32 fast-path result may have lost accuracy: non-finite
// (overflow or NaN/Inf input) or a variance so small that fp32 squares of the
// deviations were denormal.
bool NeedsExactPath(const Moments& m) {
  return !m.IsFinite() || m.m2 < 1e-30 * static_cast<double>(m.count);
}

// The fp32 fast path: the same corrected two-pass algorithm with fp32 SIMD
// lanes that are flushed into fp64 every kFloatFlush elements, and the second
// pass centred on mean0 rounded to float (x - mean0f is exact near the mean).
// Falls back to the fp64 path if fp32 over- or underflowed.
NORMD_MULTIVERSION Moments BlockMomentsF32(const float* x, int64_t n) {
  double wide[kFloatLanes] = {};
  int64_t i = 0;
  for (; i + kFloatFlush <= n; i += kFloatFlush) {
    float lanes[kFloatLanes] = {};
    for (int64_t k = 0; k < kFloatFlush; k += kFloatLanes) {
      for (int j = 0; j < kFloatLanes; ++j) lanes[j] += x[i + k + j];
    }
    for (int j = 0; j < kFloatLanes; ++j) wide[j] += lanes[j];
  }
  double tail = 0.0;
  for (int64_t k = i; k < n; ++k) tail += x[k];
  const double mean0 = (SumLanes(wide) + tail) / static_cast<double>(n);
  const float center = static_cast<float>(mean0);

  double wide_dev[kFloatLanes] = {};
  double wide_sq[kFloatLanes] = {};
  for (i = 0; i + kFloatFlush <= n; i += kFloatFlush) {
    float dev[kFloatLanes] = {};
    float sq[kFloatLanes] = {};
    for (int64_t k = 0; k < kFloatFlush; k += kFloatLanes) {
      for (int j = 0; j < kFloatLanes; ++j) {
        const float d = x[i + k + j] - center;
        dev[j] += d;
        sq[j] += d * d;
      }
    }
    for (int j = 0; j < kFloatLanes; ++j) {
      wide_dev[j] += dev[j];
      wide_sq[j] += sq[j];
    }
  }
  double tail_dev = 0.0;
  double tail_sq = 0.0;
  for (int64_t k = i; k < n; ++k) {
    const double d = static_cast<double>(x[k]) - center;
    tail_dev += d;
    tail_sq += d * d;
  }
  Moments result = Corrected(n, center, SumLanes(wide_dev) + tail_dev,
                             SumLanes(wide_sq) + tail_sq);
  if (NeedsExactPath(result)) return BlockMomentsExactF32(x, n);
  return result;
}

Moments BlockMoments(const float* x, int64_t n) {
  return BlockMomentsF32(x, n);
}
Moments BlockMoments(const double* x, int64_t n) {
  return BlockMomentsF64(x, n);
}

Moments FoldInOrder(const Moments* parts, int64_t count, int64_t stride) {
  Moments total;
  for (int64_t k = 0; k < count; ++k) MergeMoments(total, parts[k * stride]);
  return total;
}

// Channel moments when each channel's values come in contiguous runs of at
// least kMinRun (e.g. NCHW): one ContiguousMoments per (outer, channel) run,
// folded over outer in order.
template <typename T>
std::vector<Moments> ChannelMomentsLongRuns(const T* x,
                                            const ChannelLayout& layout) {
  const int64_t runs = layout.outer * layout.channels;
  std::vector<Moments> per_run(runs);
  ParallelFor(tbb::blocked_range<int64_t>(0, runs), layout.NumElements(),
              [&](const tbb::blocked_range<int64_t>& range) {
                for (int64_t r = range.begin(); r < range.end(); ++r) {
                  per_run[r] =
                      ContiguousMoments(x + r * layout.inner, layout.inner);
                }
              });
  std::vector<Moments> result(layout.channels);
  ParallelFor(tbb::blocked_range<int64_t>(0, layout.channels), runs * 4,
              [&](const tbb::blocked_range<int64_t>& range) {
                for (int64_t c = range.begin(); c < range.end(); ++c) {
                  result[c] = FoldInOrder(per_run.data() + c, layout.outer,
                                          layout.channels);
                }
              });
  return result;
}

// A block of a short-run layout: channels [c0, c1) over rows [r0, r1).
struct RowBlock {
  int64_t c0, c1, r0, r1;
  int64_t width() const { return c1 - c0; }
};

// Per-task scratch for row blocks of up to `width` channels.
struct RowScratch {
  explicit RowScratch(int64_t width) : wide(3 * width) {}
  std::vector<double> wide;
};

// Channels-last (inner == 1) moments of kTile consecutive channels starting
// at `c`, over rows [r0, r1), with the accumulators held in registers across
// rows. fp64 data: exactly the operations of the generic loop in
// RowBlockMomentsExact, in the same order. fp32 data: fp32 accumulators
// flushed into fp64 every kTileFlush rows, the second pass centred on the
// fp32-rounded mean (RowBlockMoments falls back to fp64 where that could
// lose accuracy).
constexpr int kTile = 32;
constexpr int64_t kTileFlush = 16;

template <typename T>
NORMD_INLINE_INTO_CLONES void ChannelsLastTile(const T* __restrict x,
                                               int64_t row_stride, int64_t c,
                                               int64_t r0, int64_t r1,
                                               double* __restrict mean_out,
                                               double* __restrict dev_out,
                                               double* __restrict sq_out) {
  const int64_t flush = std::is_same_v<T, float> ? kTileFlush : r1 - r0;
  double sum[kTile] = {};
  for (int64_t f = r0; f < r1; f += flush) {
    const int64_t f_end = std::min(r1, f + flush);
    T acc[kTile] = {};
    for (int64_t r = f; r < f_end; ++r) {
      const T* __restrict row = x + r * row_stride + c;
      for (int j = 0; j < kTile; ++j) acc[j] += row[j];
    }
    for (int j = 0; j < kTile; ++j) sum[j] += static_cast<double>(acc[j]);
  }
  const double count = static_cast<double>(r1 - r0);
  T center[kTile];
  for (int j = 0; j < kTile; ++j) center[j] = static_cast<T>(sum[j] / count);
  double dev[kTile] = {};
  double sq[kTile] = {};
  for (int64_t f = r0; f < r1; f += flush) {
    const int64_t f_end = std::min(r1, f + flush);
    T dev_acc[kTile] = {};
    T sq_acc[kTile] = {};
    for (int64_t r = f; r < f_end; ++r) {
      const T* __restrict row = x + r * row_stride + c;
      for (int j = 0; j < kTile; ++j) {
        const T d = row[j] - center[j];
        dev_acc[j] += d;
        sq_acc[j] += d * d;
      }
    }
    for (int j = 0; j < kTile; ++j) {
      dev[j] += static_cast<double>(dev_acc[j]);
      sq[j] += static_cast<double>(sq_acc[j]);
    }
  }
  for (int j = 0; j < kTile; ++j) {
    mean_out[j] = static_cast<double>(center[j]);
    dev_out[j] = dev[j];
    sq_out[j] = sq[j];
  }
}

// Moments of every channel of a row block into out[0..width): per-channel
// accumulators, vectorized across channels (in register tiles of kTile
// channels for channels-last). `tile` false: all-fp64 generic loops.
template <typename T>
NORMD_INLINE_INTO_CLONES void RowBlockMomentsImpl(const T* x,
                                                  const ChannelLayout& layout,
                                                  const RowBlock& block,
                                                  RowScratch& scratch,
                                                  Moments* out, bool tile) {
  const int64_t width = block.width();
  const int64_t inner = layout.inner;
  const int64_t row_stride = layout.channels * inner;
  double* __restrict sum = scratch.wide.data();
  double* __restrict dev = sum + width;
  double* __restrict sq = dev + width;
  std::fill(sum, sum + 3 * width, 0.0);
  // Channels [0, tiled) in register tiles; the rest in the generic loops.
  const int64_t tiled = tile && inner == 1 ? width / kTile * kTile : 0;
  for (int64_t t = 0; t < tiled; t += kTile) {
    ChannelsLastTile(x, row_stride, block.c0 + t, block.r0, block.r1, sum + t,
                     dev + t, sq + t);
  }
  for (int64_t r = block.r0; r < block.r1; ++r) {
    const T* __restrict row = x + r * row_stride + block.c0 * inner;
    for (int64_t c = tiled; c < width; ++c) {
      for (int64_t i = 0; i < inner; ++i) {
        sum[c] += static_cast<double>(row[c * inner + i]);
      }
    }
  }
  const int64_t count = (block.r1 - block.r0) * inner;
  for (int64_t c = tiled; c < width; ++c) sum[c] /= static_cast<double>(count);
  for (int64_t r = block.r0; r < block.r1; ++r) {
    const T* __restrict row = x + r * row_stride + block.c0 * inner;
    for (int64_t c = tiled; c < width; ++c) {
      for (int64_t i = 0; i < inner; ++i) {
        const double d = static_cast<double>(row[c * inner + i]) - sum[c];
        dev[c] += d;
        sq[c] += d * d;
      }
    }
  }
  for (int64_t c = 0; c < width; ++c) {
    out[c] = Corrected(count, sum[c], dev[c], sq[c]);
  }
}

NORMD_MULTIVERSION void RowBlockMomentsF32(const float* x,
                                           const ChannelLayout& layout,
                                           const RowBlock& block,
                                           RowScratch& scratch, Moments* out,
                                           bool tile) {
  RowBlockMomentsImpl(x, layout, block, scratch, out, tile);
}

NORMD_MULTIVERSION void RowBlockMomentsF64(const double* x,
                                           const ChannelLayout& layout,
                                           const RowBlock& block,
                                           RowScratch& scratch, Moments* out) {
  RowBlockMomentsImpl(x, layout, block, scratch, out, /*tile=*/true);
}

void RowBlockMoments(const float* x, const ChannelLayout& layout,
                     const RowBlock& block, RowScratch& scratch, Moments* out) {
  RowBlockMomentsF32(x, layout, block, scratch, out, /*tile=*/true);
  for (int64_t c = 0; c < block.width(); ++c) {
    if (NeedsExactPath(out[c])) {
      // fp32 tiles may have over- or underflowed: redo the block in fp64.
      RowBlockMomentsF32(x, layout, block, scratch, out, /*tile=*/false);
      return;
    }
  }
}
void RowBlockMoments(const double* x, const ChannelLayout& layout,
                     const RowBlock& block, RowScratch& scratch, Moments* out) {
  RowBlockMomentsF64(x, layout, block, scratch, out);
}

// Channel moments for short runs (inner < kMinRun, e.g. channels-last or
// (N, C)). Work items are (channel range, row group); the ranges and groups
// depend only on the shape. Each item folds its row blocks in order; the
// groups are then folded per channel in order.
template <typename T>
std::vector<Moments> ChannelMomentsShortRuns(const T* x,
                                             const ChannelLayout& layout) {
  constexpr int64_t kRowWidth = 1024;  // Elements of one row per block.
  constexpr int64_t kMinPerGroup = 1024;
  constexpr int64_t kMaxGroups = 256;
  const int64_t channels = layout.channels;
  const int64_t range_width =
      std::clamp<int64_t>(kRowWidth / layout.inner, 1, channels);
  const int64_t num_ranges = (channels + range_width - 1) / range_width;
  const int64_t rows_per_block =
      std::max<int64_t>(1, kMomentsBlock / (range_width * layout.inner));
  const int64_t num_blocks =
      (layout.outer + rows_per_block - 1) / rows_per_block;
  const int64_t num_groups = std::clamp<int64_t>(
      layout.PerChannel() / kMinPerGroup, 1, std::min(num_blocks, kMaxGroups));

  std::vector<Moments> per_group(num_groups * channels);
  ParallelFor(
      tbb::blocked_range<int64_t>(0, num_ranges * num_groups),
      layout.NumElements(), [&](const tbb::blocked_range<int64_t>& items) {
        RowScratch scratch(range_width);
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
            const RowBlock block{c0, c1, r0,
                                 std::min(layout.outer, r0 + rows_per_block)};
            RowBlockMoments(x, layout, block, scratch, block_moments.data());
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

}  // namespace

double Moments::BiasedVariance() const {
  return count > 0 ? m2 / static_cast<double>(count)
                   : std::numeric_limits<double>::quiet_NaN();
}

double Moments::UnbiasedVariance() const {
  return count > 1 ? m2 / static_cast<double>(count - 1)
                   : std::numeric_limits<double>::quiet_NaN();
}

bool Moments::IsFinite() const {
  return std::isfinite(mean) && std::isfinite(m2);
}

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

template <typename T>
Moments ContiguousMoments(const T* x, int64_t n) {
  if (n <= 0) return Moments{};
  const int64_t num_blocks = (n + kMomentsBlock - 1) / kMomentsBlock;
  auto block = [&](int64_t b) {
    const int64_t begin = b * kMomentsBlock;
    return BlockMoments(x + begin, std::min(kMomentsBlock, n - begin));
  };
  if (num_blocks < 4) {
    Moments total;
    for (int64_t b = 0; b < num_blocks; ++b) MergeMoments(total, block(b));
    return total;
  }
  std::vector<Moments> parts(num_blocks);
  ParallelFor(tbb::blocked_range<int64_t>(0, num_blocks), n,
              [&](const tbb::blocked_range<int64_t>& range) {
                for (int64_t b = range.begin(); b < range.end(); ++b) {
                  parts[b] = block(b);
                }
              });
  return FoldInOrder(parts.data(), num_blocks, 1);
}

template <typename T>
std::vector<Moments> ChannelMoments(const T* x, const ChannelLayout& layout) {
  constexpr int64_t kMinRun = 256;
  if (layout.channels == 0) return {};
  if (layout.PerChannel() == 0) return std::vector<Moments>(layout.channels);
  if (layout.inner >= kMinRun) return ChannelMomentsLongRuns(x, layout);
  return ChannelMomentsShortRuns(x, layout);
}

template Moments ContiguousMoments<float>(const float*, int64_t);
template Moments ContiguousMoments<double>(const double*, int64_t);
template std::vector<Moments> ChannelMoments<float>(const float*,
                                                    const ChannelLayout&);
template std::vector<Moments> ChannelMoments<double>(const double*,
                                                     const ChannelLayout&);

}  // namespace normd
