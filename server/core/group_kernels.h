// The GroupNorm / InstanceNorm kernels over a whole batch (engine.cc
// validates and chooses among them): moments per (sample, group), the
// per-(sample, channel) affine parameters from them, and the fused paths
// that reduce and write each chunk of groups, or each sample, while it is in
// cache. Every path computes the same moments and the same per-element
// formula: the same bits. Stateless; each call spreads its work over the
// compute arena (server/core/parallel.h).
#ifndef NORMD_SERVER_CORE_GROUP_KERNELS_H_
#define NORMD_SERVER_CORE_GROUP_KERNELS_H_

#include <cstdint>
#include <vector>

#include "server/core/layout.h"
#include "server/core/moments.h"
#include "server/core/tensor.h"

namespace normd {

// GroupNorm / InstanceNorm geometry: `samples` samples (dim 0), each
// [sample_outer, channels, inner] around the channel axis; statistics per
// (sample, group of channels_per_group adjacent channels).
struct GroupGeometry {
  ChannelLayout layout;  // The whole tensor.
  int64_t samples = 0;
  int64_t groups = 0;
  int64_t sample_outer = 0;

  int64_t ChannelsPerGroup() const { return layout.channels / groups; }
  // Values per (sample, group).
  int64_t PerGroup() const {
    return sample_outer * ChannelsPerGroup() * layout.inner;
  }
  int64_t SampleSize() const {
    return sample_outer * layout.channels * layout.inner;
  }
};

// Samples per thread from which stateless GroupNorm / InstanceNorm with
// samples of several rows (channels-last, say) runs one sample per task
// (FusedGroupSamples).
inline constexpr int64_t kFusedSamplesPerThread = 4;

// Moments per (sample, group), sample-major, of x (elements of `dtype`).
// NCHW-like layouts (nothing between the batch and channel axes): every
// group is one contiguous run. Else per sample.
std::vector<Moments> GroupMoments(DType dtype, const void* x,
                                  const GroupGeometry& g);

// Affine parameters per (sample, channel) for the statistics sets [first,
// first + count) (a set is one (sample, group), sample-major; moments[0] is
// set `first`): entries [0, count * channels per group) of mean / scale /
// shift, in (sample, channel) order.
void GroupParams(const Moments* moments, int64_t first, int64_t count,
                 const GroupGeometry& g, const std::vector<double>& weight,
                 const std::vector<double>& bias, double eps, double* mean,
                 double* scale, double* shift);

// Stateless GroupNorm / InstanceNorm x -> y when every group is one
// contiguous run (sample_outer == 1): chunks of whole groups reduced and
// then written while still in cache, one pass over memory.
void FusedGroupRows(DType dtype, const void* x, void* y, const GroupGeometry& g,
                    const std::vector<double>& weight,
                    const std::vector<double>& bias, double eps);

// Stateless GroupNorm / InstanceNorm x -> y with sample_outer > 1 and at
// least kFusedSamplesPerThread samples per thread: one sample per task,
// reduced, then written backwards.
void FusedGroupSamples(DType dtype, const void* x, void* y,
                       const GroupGeometry& g,
                       const std::vector<double>& weight,
                       const std::vector<double>& bias, double eps);

// y = (x - mean) * scale + shift with per-(sample, channel) parameters
// (samples * channels entries each), for the two-pass path.
void SampleChannelAffine(DType dtype, const void* x, void* y,
                         const GroupGeometry& g, const double* mean,
                         const double* scale, const double* shift);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_GROUP_KERNELS_H_
