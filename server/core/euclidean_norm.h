// The Euclidean (L2) norm of a set of values, for L2_NORM and WEIGHT_NORM.
// Taken from the set's moments (count, mean, M2: exact, deterministic, the
// same bits on every SIMD target) as sqrt(M2 + n mean^2) in fp64, both terms
// non-negative, so nothing cancels. Where that sum leaves fp64's range (a
// NaN or Inf among the values, or squares that overflow or come near
// underflow, which only fp64 data can reach), the values are scanned
// instead, scaled by the largest magnitude as hypot does. Pure functions,
// serial and in a fixed order: the same bits at any thread count.
#ifndef NORMD_SERVER_CORE_EUCLIDEAN_NORM_H_
#define NORMD_SERVER_CORE_EUCLIDEAN_NORM_H_

#include <cstdint>

#include "server/core/layout.h"
#include "server/core/moments.h"
#include "server/core/tensor.h"

namespace normd {

// The norm of channel `channel` of x (elements of `dtype` laid out as
// `layout`), whose moments are `moments`: NaN if a value is NaN, else +Inf if
// one is infinite, else the norm. A row of n values is channel 0 of
// ChannelLayout{1, 1, n}.
double EuclideanNorm(const Moments& moments, DType dtype, const void* x,
                     const ChannelLayout& layout, int64_t channel);

// The scan EuclideanNorm falls back on, over the same values (for tests).
double ScannedEuclideanNorm(DType dtype, const void* x,
                            const ChannelLayout& layout, int64_t channel);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_EUCLIDEAN_NORM_H_
