#include "server/core/moments.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace normd {
namespace {

// Independent accumulators per reduction, so that the compiler can keep them
// in SIMD registers; the lane sums are combined in a fixed order.
constexpr int kLanes = 8;

double SumLanes(const double (&lanes)[kLanes]) {
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// Corrected two-pass moments of one block x[0..n), n >= 1: a first pass for
// the mean, a second for the deviations d = x - mean0 and their squares; the
// residual sum of d corrects both the mean and M2 for rounding in mean0.
template <typename T>
Moments BlockMoments(const T* x, int64_t n) {
  double sum[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) sum[j] += static_cast<double>(x[i + j]);
  }
  for (int j = 0; i < n; ++i, ++j) sum[j] += static_cast<double>(x[i]);
  const double count = static_cast<double>(n);
  const double mean0 = SumLanes(sum) / count;

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
  const double residual = SumLanes(dev);
  Moments result;
  result.count = n;
  result.mean = mean0 + residual / count;
  result.m2 = std::max(0.0, SumLanes(sq) - residual * residual / count);
  if (!std::isfinite(mean0)) {
    // Keep the non-finite marker visible in both fields.
    result.mean = mean0;
    result.m2 = mean0;
  }
  return result;
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
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, runs),
                    [&](const tbb::blocked_range<int64_t>& range) {
                      for (int64_t r = range.begin(); r < range.end(); ++r) {
                        per_run[r] = ContiguousMoments(x + r * layout.inner,
                                                       layout.inner);
                      }
                    });
  std::vector<Moments> result(layout.channels);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, layout.channels),
                    [&](const tbb::blocked_range<int64_t>& range) {
                      for (int64_t c = range.begin(); c < range.end(); ++c) {
                        result[c] = FoldInOrder(per_run.data() + c,
                                                layout.outer, layout.channels);
                      }
                    });
  return result;
}

// The moments of channels [c0, c1) over rows [r0, r1) of a short-run layout
// (e.g. channels-last), merged into acc[0..c1-c0). The block is small enough
// to stay in cache between its two passes.
template <typename T>
void AccumulateRowBlock(const T* x, const ChannelLayout& layout, int64_t c0,
                        int64_t c1, int64_t r0, int64_t r1, double* sum,
                        double* dev, double* sq, Moments* acc) {
  const int64_t width = c1 - c0;
  const int64_t inner = layout.inner;
  const int64_t row_stride = layout.channels * inner;
  std::fill(sum, sum + width, 0.0);
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = x + r * row_stride + c0 * inner;
    if (inner == 1) {
      for (int64_t c = 0; c < width; ++c) sum[c] += static_cast<double>(row[c]);
    } else {
      for (int64_t c = 0; c < width; ++c) {
        for (int64_t i = 0; i < inner; ++i) {
          sum[c] += static_cast<double>(row[c * inner + i]);
        }
      }
    }
  }
  const int64_t count = (r1 - r0) * inner;
  const double n = static_cast<double>(count);
  for (int64_t c = 0; c < width; ++c) sum[c] /= n;  // sum now holds mean0.
  std::fill(dev, dev + width, 0.0);
  std::fill(sq, sq + width, 0.0);
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = x + r * row_stride + c0 * inner;
    for (int64_t c = 0; c < width; ++c) {
      for (int64_t i = 0; i < inner; ++i) {
        const double d = static_cast<double>(row[c * inner + i]) - sum[c];
        dev[c] += d;
        sq[c] += d * d;
      }
    }
  }
  for (int64_t c = 0; c < width; ++c) {
    Moments block;
    block.count = count;
    block.mean = sum[c] + dev[c] / n;
    block.m2 = std::max(0.0, sq[c] - dev[c] * dev[c] / n);
    if (!std::isfinite(sum[c])) block.mean = block.m2 = sum[c];
    MergeMoments(acc[c], block);
  }
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
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, num_ranges * num_groups),
      [&](const tbb::blocked_range<int64_t>& items) {
        std::vector<double> scratch(3 * range_width);
        for (int64_t item = items.begin(); item < items.end(); ++item) {
          const int64_t group = item / num_ranges;
          const int64_t c0 = (item % num_ranges) * range_width;
          const int64_t c1 = std::min(channels, c0 + range_width);
          const int64_t b0 = group * num_blocks / num_groups;
          const int64_t b1 = (group + 1) * num_blocks / num_groups;
          Moments* acc = per_group.data() + group * channels + c0;
          for (int64_t b = b0; b < b1; ++b) {
            const int64_t r0 = b * rows_per_block;
            const int64_t r1 = std::min(layout.outer, r0 + rows_per_block);
            AccumulateRowBlock(x, layout, c0, c1, r0, r1, scratch.data(),
                               scratch.data() + range_width,
                               scratch.data() + 2 * range_width, acc);
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
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, num_blocks),
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
