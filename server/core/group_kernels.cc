#include "server/core/group_kernels.h"

#include <algorithm>
#include <cmath>

#include "server/core/kernels.h"
#include "server/core/parallel.h"
#include "server/core/thread_paths.h"

namespace normd {
namespace {

// Element i of x, elements of `dtype`.
const char* At(DType dtype, const void* x, int64_t i) {
  return static_cast<const char*>(x) + i * ElementSize(dtype);
}
char* At(DType dtype, void* y, int64_t i) {
  return static_cast<char*>(y) + i * ElementSize(dtype);
}

// ChannelAffineKernel of contiguous x.
void Affine(DType dtype, const char* x, void* y, const ChannelLayout& layout,
            const double* mean, const double* scale, const double* shift,
            int64_t output_elements, Traversal traversal) {
  ChannelAffineKernel(dtype, InputSource{x}, y, layout, mean, scale, shift,
                      output_elements, traversal);
}

// The moments of sample n's groups into group[0..groups), for sample_outer
// > 1. Channels-last: per-(sample, channel) moments with the channels-last
// kernels, then each group's channels merged in order (Chan, fp64). Else a
// sample is [sample_outer, groups, one group's values per outer index].
// group[0..groups) starts empty.
void SampleGroupMoments(DType dtype, const void* x, const GroupGeometry& g,
                        int64_t n, Moments* group) {
  const int64_t per_group = g.ChannelsPerGroup();
  const bool channels_last = g.layout.inner == 1;
  const ChannelLayout sample =
      channels_last
          ? ChannelLayout{g.sample_outer, g.layout.channels, 1}
          : ChannelLayout{g.sample_outer, g.groups, per_group * g.layout.inner};
  const std::vector<Moments> m =
      ChannelMoments(dtype, At(dtype, x, n * g.SampleSize()), sample);
  if (!channels_last) {
    std::copy(m.begin(), m.end(), group);
    return;
  }
  for (int64_t c = 0; c < g.layout.channels; ++c) {
    MergeMoments(group[c / per_group], m[c]);
  }
}

// Sets (sample, group) reduced and written per chunk of about this many
// elements, so that the writing pass reads from cache.
constexpr int64_t kFusedGroupElements = 64 * 1024;

// Sets [first, first + count) of a GroupNorm / InstanceNorm whose groups are
// contiguous runs (see FusedGroupRows) from xs to ys (both at set `first`):
// their moments, then their output. `output_elements` and `traversal` as
// for ChannelAffineKernel; mean / scale / shift are scratch.
void GroupRowsChunk(DType dtype, const char* xs, char* ys,
                    const GroupGeometry& g, int64_t first, int64_t count,
                    const std::vector<double>& weight,
                    const std::vector<double>& bias, double eps,
                    int64_t output_elements, Traversal traversal,
                    std::vector<double>& mean, std::vector<double>& scale,
                    std::vector<double>& shift) {
  const int64_t per_group = g.ChannelsPerGroup();
  const std::vector<Moments> m =
      ChannelMoments(dtype, xs, ChannelLayout{1, count, g.PerGroup()});
  mean.resize(count * per_group);
  scale.resize(mean.size());
  shift.resize(mean.size());
  GroupParams(m.data(), first, count, g, weight, bias, eps, mean.data(),
              scale.data(), shift.data());
  Affine(dtype, xs, ys, ChannelLayout{1, count * per_group, g.layout.inner},
         mean.data(), scale.data(), shift.data(), output_elements, traversal);
}

// Chunks per thread from which FusedGroupRows runs each chunk's loops
// serially (SerialLoopsScope): with fewer, the chunks' own parallel loops
// keep every core busy.
constexpr int64_t kFusedChunksPerThread = 4;

}  // namespace

std::vector<Moments> GroupMoments(DType dtype, const void* x,
                                  const GroupGeometry& g) {
  if (g.sample_outer == 1) {
    return ChannelMoments(dtype, x,
                          ChannelLayout{1, g.samples * g.groups,
                                        g.ChannelsPerGroup() * g.layout.inner});
  }
  std::vector<Moments> out(g.samples * g.groups);
  ParallelFor(tbb::blocked_range<int64_t>(0, g.samples, 1),
              g.layout.NumElements(),
              [&](const tbb::blocked_range<int64_t>& range) {
                for (int64_t n = range.begin(); n < range.end(); ++n) {
                  SampleGroupMoments(dtype, x, g, n, out.data() + n * g.groups);
                }
              });
  return out;
}

void GroupParams(const Moments* moments, int64_t first, int64_t count,
                 const GroupGeometry& g, const std::vector<double>& weight,
                 const std::vector<double>& bias, double eps, double* mean,
                 double* scale, double* shift) {
  const int64_t per_group = g.ChannelsPerGroup();
  for (int64_t s = 0; s < count; ++s) {
    const Moments& m = moments[s];
    for (int64_t t = 0; t < per_group; ++t) {
      const int64_t c = ((first + s) % g.groups) * per_group + t;
      const int64_t i = s * per_group + t;
      mean[i] = m.mean;
      scale[i] = weight[c] / std::sqrt(m.BiasedVariance() + eps);
      shift[i] = bias[c];
    }
  }
}

// Chunks of whole groups are reduced and then written while still in
// cache, one pass over memory. Same per-set moments and per-element formula
// as the two-pass path.
void FusedGroupRows(DType dtype, const void* x, void* y, const GroupGeometry& g,
                    const std::vector<double>& weight,
                    const std::vector<double>& bias, double eps) {
  const int64_t row = g.PerGroup();
  const int64_t per_chunk = std::max<int64_t>(1, kFusedGroupElements / row);
  const int64_t total = g.layout.NumElements();
  const int64_t chunks = (g.samples * g.groups + per_chunk - 1) / per_chunk;
  // With several chunks per thread, each chunk's loops run on its thread.
  const bool serial_chunks =
      chunks >= kFusedChunksPerThread * ComputeConcurrency();
  CountThreadPath(serial_chunks ? ThreadPath::kGroupChunksOnOneThread
                                : ThreadPath::kGroupChunksSpread);
  ParallelFor(
      tbb::blocked_range<int64_t>(0, g.samples * g.groups, per_chunk), total,
      [&](const tbb::blocked_range<int64_t>& range) {
        const SerialLoopsScope serial(serial_chunks);
        std::vector<double> mean, scale, shift;
        for (int64_t s0 = range.begin(); s0 < range.end(); s0 += per_chunk) {
          GroupRowsChunk(dtype, At(dtype, x, s0 * row), At(dtype, y, s0 * row),
                         g, s0, std::min(per_chunk, range.end() - s0), weight,
                         bias, eps, total,
                         serial_chunks ? Traversal::kBackwardsOnThisThread
                                       : Traversal::kParallel,
                         mean, scale, shift);
        }
      });
}

// Each sample's moments, then its output, on one thread, one sample per
// task. The output is written backwards (see
// Traversal::kBackwardsOnThisThread), so the part still in this core's
// cache is read from there rather than from memory. The same moments and
// per-element formula as the two-pass path: the same bits.
void FusedGroupSamples(DType dtype, const void* x, void* y,
                       const GroupGeometry& g,
                       const std::vector<double>& weight,
                       const std::vector<double>& bias, double eps) {
  const int64_t channels = g.layout.channels;
  const int64_t total = g.layout.NumElements();
  const ChannelLayout sample{g.sample_outer, channels, g.layout.inner};
  ParallelFor(
      tbb::blocked_range<int64_t>(0, g.samples, 1), total,
      [&](const tbb::blocked_range<int64_t>& range) {
        // Several samples per thread (see the caller): each on its thread.
        const SerialLoopsScope serial;
        std::vector<Moments> moments(g.groups);
        std::vector<double> mean(channels), scale(channels), shift(channels);
        for (int64_t n = range.begin(); n < range.end(); ++n) {
          std::fill(moments.begin(), moments.end(), Moments{});
          SampleGroupMoments(dtype, x, g, n, moments.data());
          GroupParams(moments.data(), n * g.groups, g.groups, g, weight, bias,
                      eps, mean.data(), scale.data(), shift.data());
          const int64_t at = n * g.SampleSize();
          Affine(dtype, At(dtype, x, at), At(dtype, y, at), sample, mean.data(),
                 scale.data(), shift.data(), total,
                 Traversal::kBackwardsOnThisThread);
        }
      });
}

void SampleChannelAffine(DType dtype, const void* x, void* y,
                         const GroupGeometry& g, const double* mean,
                         const double* scale, const double* shift) {
  const int64_t channels = g.layout.channels;
  if (g.sample_outer == 1) {  // Samples side by side: one channel axis.
    Affine(dtype, static_cast<const char*>(x), y,
           ChannelLayout{1, g.samples * channels, g.layout.inner}, mean, scale,
           shift, 0, Traversal::kParallel);
    return;
  }
  const ChannelLayout sample{g.sample_outer, channels, g.layout.inner};
  ParallelFor(tbb::blocked_range<int64_t>(0, g.samples, 1),
              g.layout.NumElements(),
              [&](const tbb::blocked_range<int64_t>& range) {
                for (int64_t n = range.begin(); n < range.end(); ++n) {
                  const int64_t at = n * g.SampleSize();
                  Affine(dtype, At(dtype, x, at), At(dtype, y, at), sample,
                         mean + n * channels, scale + n * channels,
                         shift + n * channels, g.layout.NumElements(),
                         Traversal::kParallel);
                }
              });
}

}  // namespace normd
