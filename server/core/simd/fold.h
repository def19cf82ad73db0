// The scalar steps every moments reduction shares, whichever target
// summed its lanes: the pairwise fold of lane sums, the correction of
// shifted sums into (mean, M2), and the test that sends a block to the
// exact path. No Highway: the same operations in the same order on every
// target. Pure functions.
#ifndef NORMD_SERVER_CORE_SIMD_FOLD_H_
#define NORMD_SERVER_CORE_SIMD_FOLD_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "server/core/moments.h"

namespace normd::fold {

// The fast paths compute M2 = S2 - S1^2 / n; a shift off the mean by more
// than ~2.6 standard deviations makes S2 (and its fp32 rounding) exceed M2
// by more than this factor: such blocks are redone exactly.
inline constexpr double kMaxCancellation = 8.0;

// Adds the upper half of t[0..N) onto the lower half, recursively: a
// pairwise sum in a fixed order.
template <int N, typename T>
[[gnu::always_inline]] inline void FoldHalves(T* t) {
  if constexpr (N > 1) {
    for (int j = 0; j < N / 2; ++j) t[j] += t[j + N / 2];
    FoldHalves<N / 2, T>(t);
  }
}

// The sums of 16 rows of 16 lanes (rows[16 k + j], lane j of row k) into
// out[0..16), in T: each row's lane j + 8 added onto lane j, then the rows'
// 128 partial sums, as one array a, replaced by a[2 i] + a[2 i + 1] three
// times. A fixed pairwise tree that vectors of any width compute whole
// vectors at a time, across the rows (SixteenRowSums in ops-inl.h).
template <typename T>
[[gnu::always_inline]] inline void SixteenRowSums(const float* rows, T* out) {
  T a[128];
  for (int k = 0; k < 16; ++k) {
    for (int j = 0; j < 8; ++j) {
      a[8 * k + j] = static_cast<T>(rows[16 * k + j]) +
                     static_cast<T>(rows[16 * k + j + 8]);
    }
  }
  for (int n = 64; n >= 16; n /= 2) {
    for (int i = 0; i < n; ++i) a[i] = a[2 * i] + a[2 * i + 1];
  }
  std::copy(a, a + 16, out);
}

// FoldHalves of a copy of lanes[0..N): their sum in that fixed order. With
// pair_lanes = L > 0, lanes[] holds the values in pair order (each 2 L as
// the even ones, then the odd ones; PairOrder in half-inl.h): the same
// additions, in place of putting them back in order.
template <int N>
[[gnu::always_inline]] inline double SumLanes(const double (&lanes)[N],
                                              int64_t pair_lanes = 0) {
  static_assert((N & (N - 1)) == 0, "pairwise folding needs a power of two");
  double t[N];
  std::copy(lanes, lanes + N, t);
  if (pair_lanes == 0) {
    FoldHalves<N>(t);
    return t[0];
  }
  // Steps of 2 L or more pair equal positions of blocks, as in order.
  for (int64_t step = N / 2; step >= 2 * pair_lanes; step /= 2) {
    for (int64_t j = 0; j < step; ++j) t[j] += t[j + step];
  }
  // One block left: the even values' lanes fold as one half, the odd ones'
  // as the other, and the last step adds value 1 to value 0.
  for (int64_t step = pair_lanes / 2; step >= 1; step /= 2) {
    for (int64_t j = 0; j < step; ++j) {
      t[j] += t[j + step];
      t[pair_lanes + j] += t[pair_lanes + j + step];
    }
  }
  return t[0] + t[pair_lanes];
}

// Moments from a first-pass mean `mean0` and the second-pass sums of
// d = x - mean0 (`residual`) and d^2 (`squares`) over n values.
[[gnu::always_inline]] inline Moments Corrected(int64_t n, double mean0,
                                                double residual,
                                                double squares) {
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

// Eval's affine takes off a mean a; with a moments pass fused into it, a
// channels-last tile or a long block shifts by a (a hint), not by its
// sample's mean, where a lies within sqrt(kMaxHintOffset2) = 0.4 of the
// sample's standard deviations of that mean: the subtraction is then done
// once for both. Not further: a shift off the mean makes the fp32 S2
// larger, and at the accuracy bar's offset of 1e4 (values on a coarse
// grid) its rounding errors, which do not average out, with it: about (1 +
// 3 offset^2) times those of a shift at the mean, which is 4e-8 of the
// variance there (measured). A sample of 128 rows (values, for a block)
// keeps the decision's noise (0.09 standard deviations) well inside that,
// so that a model's running means, which match its inputs, fit in all 64
// channels of a tile.
inline constexpr double kMaxHintOffset2 = 0.16;

// True when a hint `offset` from the mean of `count` sample values whose
// squared deviations sum to `squares` is taken (false for NaN). A constant
// sample takes any: a constant channel's moments are redone exactly
// whatever its shift (NeedsExactPath), and it should not keep its tile's
// other channels from their hints.
inline bool HintFits(double offset, double squares, int64_t count) {
  return squares == 0.0 || offset * offset * static_cast<double>(count) <=
                               kMaxHintOffset2 * squares;
}

// True when a fast-path result may have lost accuracy: not finite, a
// variance so small that fp32 squares were denormal, or S2 (`squares`)
// beyond kMaxCancellation times M2.
inline bool NeedsExactPath(const Moments& m, double squares) {
  return !m.IsFinite() || m.m2 < 1e-30 * static_cast<double>(m.count) ||
         m.m2 * kMaxCancellation < squares;
}

}  // namespace normd::fold

#endif  // NORMD_SERVER_CORE_SIMD_FOLD_H_
