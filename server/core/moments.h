// Exact, deterministic first and second moments of tensor data.
//
// Every reduction splits its data into blocks whose boundaries depend only on
// the shape (never on the number of threads), computes each block with the
// corrected two-pass algorithm in fp64, and merges the blocks with Chan's
// formula in a fixed order. The results are therefore bitwise identical for 1
// or N threads, and accurate at large mean offsets (no E[x^2] - E[x]^2).
#ifndef NORMD_SERVER_CORE_MOMENTS_H_
#define NORMD_SERVER_CORE_MOMENTS_H_

#include <cstdint>
#include <vector>

#include "server/core/layout.h"

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

// Elements per block of every reduction (fits comfortably in L2).
inline constexpr int64_t kMomentsBlock = 8192;

// Moments of x[0..n), blocked by kMomentsBlock and merged in order; parallel
// (oneTBB) when n spans several blocks.
template <typename T>
Moments ContiguousMoments(const T* x, int64_t n);

// Per-channel moments of a tensor laid out as [outer, channels, inner]
// (see ChannelLayout): result[c] covers the outer x inner values of channel c.
template <typename T>
std::vector<Moments> ChannelMoments(const T* x, const ChannelLayout& layout);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_MOMENTS_H_
