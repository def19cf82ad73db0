// Moments: the fp64 reference, the fast fp32 path and its fallbacks,
// non-finite flags, and the hand-written kernels against the compiled loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "server/core/engine.h"
#include "server/core/half.h"
#include "server/core/simd/block_moments.h"
#include "server/core/simd/fold.h"
#include "tests/testing/core_cases.h"
#include "tests/testing/simd_targets.h"

namespace normd {
namespace {

using ::normd::testing::ExpectStatsNear;
using ::normd::testing::ForEachSimdTarget;
using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceChannelStats;
using ::normd::testing::RelErr;
using ::normd::testing::SameBits;

TEST(MomentsTest, MergeIsChanFormula) {
  // {1,2,3} and {10,20}: pooled mean 7.2, M2 = 6.2^2 + 5.2^2 + 4.2^2 + 2.8^2 +
  // 12.8^2 = 254.8.
  Moments a{3, 2.0, 2.0};
  Moments b{2, 15.0, 50.0};
  MergeMoments(a, b);
  EXPECT_EQ(a.count, 5);
  EXPECT_DOUBLE_EQ(a.mean, 7.2);
  EXPECT_NEAR(a.m2, 254.8, 1e-12);
  EXPECT_NEAR(a.BiasedVariance(), 50.96, 1e-13);
}

template <typename T>
void CheckContiguous() {
  constexpr int64_t kB = kMomentsBlock;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9},
                    int64_t{255}, int64_t{256}, int64_t{257}, kB - 1, kB,
                    kB + 1, 2 * kB + 40000, 4 * kB + 3}) {
    SCOPED_TRACE(n);
    const auto x = RandomValues<T>(n, 11 + n, 3.0, 2.0);
    const Moments m = ContiguousMoments(x.data(), n);
    const auto ref = ReferenceChannelStats(x, 1, 1, n);
    EXPECT_EQ(m.count, n);
    ExpectStatsNear<T>(m, ref.mean[0], ref.var[0]);
  }
}

TEST(MomentsTest, ContiguousMatchesReferenceAcrossBlockBoundaries) {
  CheckContiguous<float>();
  CheckContiguous<double>();
}

TEST(MomentsTest, FastPathFallsBackWhereFp32WouldLoseAccuracy) {
  // Deviations whose fp32 squares would be denormal, and values whose fp32
  // squares would overflow: both exact through the fp64 fallback.
  for (double scale : {1e-21, 1e20}) {
    SCOPED_TRACE(scale);
    std::vector<float> x = RandomValues<float>(10000, 3, 0.0, scale);
    const Moments m = ContiguousMoments(x.data(), 10000);
    const auto ref = ReferenceChannelStats(x, 1, 1, 10000);
    ASSERT_TRUE(std::isfinite(ref.var[0]));
    EXPECT_LE(RelErr(m.BiasedVariance(), ref.var[0]), 1e-12);
    // Channels-last, untiled (2 channels) and in fp32 register tiles (40).
    for (int64_t c : {2, 40}) {
      const ChannelLayout layout{10000 / c, c, 1};
      const auto channels = ChannelMoments(x.data(), layout);
      const auto ref2 = ReferenceChannelStats(x, 10000 / c, c, 1);
      for (int64_t ch = 0; ch < c; ++ch) {
        EXPECT_LE(RelErr(channels[ch].BiasedVariance(), ref2.var[ch]), 1e-12)
            << c;
      }
    }
  }
}

// The fp32 fast paths sum d = x - shift with the shift taken from the first
// 32 values (rows); when those are far from the block's mean the shifted sums
// cancel and the block must be redone exactly. One block each, so the result
// is the exact path's (~1e-15); the fast path would be off by ~1e-6 here.
TEST(MomentsTest, ShiftFarFromTheMeanFallsBackToExact) {
  constexpr int64_t kRows = 1024;
  constexpr int64_t kChannels = 64;
  std::vector<float> x = RandomValues<float>(kRows * kChannels, 9, 1e4, 1.0);
  // Contiguous: the first 32 values sit 30 sigma high.
  static_assert(kMomentsBlock <= kRows * kChannels);
  std::vector<float> block(x.begin(), x.begin() + kMomentsBlock);
  for (int64_t i = 0; i < 32; ++i) block[i] += 30.0f;
  const Moments m = ContiguousMoments(block.data(), kMomentsBlock);
  const auto ref = ReferenceChannelStats(block, 1, 1, kMomentsBlock);
  EXPECT_LE(RelErr(m.BiasedVariance(), ref.var[0]), 1e-12);
  // Channels-last: the first 32 rows do.
  for (int64_t i = 0; i < 32 * kChannels; ++i) x[i] += 30.0f;
  const ChannelLayout layout{kRows, kChannels, 1};
  const auto channels = ChannelMoments(x.data(), layout);
  const auto ref2 = ReferenceChannelStats(x, kRows, kChannels, 1);
  for (int64_t c = 0; c < kChannels; ++c) {
    EXPECT_LE(RelErr(channels[c].BiasedVariance(), ref2.var[c]), 1e-12) << c;
  }
  // A sorted ramp keeps the fast path (the shift is ~1.7 sigma off: S2 is
  // 4x M2) and stays within the fp32 tolerance.
  std::vector<float> ramp(8192);
  for (int64_t i = 0; i < 8192; ++i) ramp[i] = 1e3f + 0.01f * i;
  const auto ref3 = ReferenceChannelStats(ramp, 1, 1, 8192);
  ExpectStatsNear<float>(ContiguousMoments(ramp.data(), 8192), ref3.mean[0],
                         ref3.var[0]);
}

TEST(MomentsTest, NonFiniteInputIsFlagged) {
  std::vector<float> x(20000, 1.0f);
  EXPECT_TRUE(ContiguousMoments(x.data(), 20000).IsFinite());
  x[12345] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(ContiguousMoments(x.data(), 20000).IsFinite());
  x[12345] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(ContiguousMoments(x.data(), 20000).IsFinite());
}

// Every SIMD target reduces a block to the same bits: at every tail and
// flush boundary, and on the blocks that fall back to the exact path (a
// shift far from the mean, a constant block, tiny values whose squares
// underflow) or are non-finite; and the moments are the fp64 ones.
TEST(MomentsTest, EveryTargetReducesABlockToTheSameBits) {
  std::vector<std::pair<std::string, std::vector<float>>> blocks;
  for (int64_t n : std::vector<int64_t>{1,
                                        5,
                                        16,
                                        31,
                                        32,
                                        33,
                                        48,
                                        63,
                                        64,
                                        65,
                                        100,
                                        127,
                                        128,
                                        129,
                                        768,
                                        1023,
                                        1024,
                                        1025,
                                        1088,
                                        4113,
                                        kMomentsBlock - 1,
                                        kMomentsBlock}) {
    blocks.emplace_back("normal " + std::to_string(n),
                        RandomValues<float>(n, 7 + n, 3.0, 2.0));
    blocks.emplace_back("offset 1e4 " + std::to_string(n),
                        RandomValues<float>(n, 9 + n, 1e4, 1.0));
  }
  std::vector<float> far = RandomValues<float>(5000, 5, 0.0, 1.0);
  std::fill(far.begin(), far.begin() + 32, 1e6f);  // The shift's sample.
  blocks.emplace_back("shift far from the mean", far);
  blocks.emplace_back("constant", std::vector<float>(3000, 0.1f));
  // Short blocks (one vector of lanes) on their exact path: constant, and a
  // far outlier that its own mean cannot shift away from.
  blocks.emplace_back("short constant", std::vector<float>(64, 0.1f));
  std::vector<float> outlier = RandomValues<float>(64, 4, 0.0, 1e-3);
  outlier[5] = 3e7f;
  blocks.emplace_back("short outlier", outlier);
  blocks.emplace_back("tiny", RandomValues<float>(3000, 6, 0.0, 1e-30));
  std::vector<float> inf = RandomValues<float>(3000, 8, 3.0, 2.0);
  inf[2000] = std::numeric_limits<float>::infinity();
  blocks.emplace_back("inf", inf);
  std::vector<float> nan = inf;
  nan[2000] = std::numeric_limits<float>::quiet_NaN();
  blocks.emplace_back("nan", nan);
  for (const auto& [name, values] : blocks) {
    const int64_t n = static_cast<int64_t>(values.size());
    const float* x = values.data();  // Clang 14 captures no bindings.
    // The 16-bit blocks too: bfloat16 blocks of 2048 values or more are
    // read in pair order where vectors allow (not on scalar).
    std::vector<uint16_t> bf16(values.size());
    for (int64_t i = 0; i < n; ++i) {
      bf16[i] = DoubleToHalf(DType::kBFloat16, values[i]);
    }
    const uint16_t* halves = bf16.data();
    std::vector<std::pair<std::string, Moments>> by_target, bf16_by_target;
    ForEachSimdTarget([&](const std::string& target) {
      by_target.emplace_back(target, BlockMoments(DType::kFloat32, x, n));
      std::vector<float> scratch(n);
      bf16_by_target.emplace_back(
          target, BlockMoments(DType::kBFloat16, halves, n, scratch.data()));
    });
    const Moments& first = by_target.front().second;
    EXPECT_EQ(first.count, n) << name;
    for (const auto& results : {by_target, bf16_by_target}) {
      const Moments& expected = results.front().second;
      for (const auto& [target, m] : results) {
        EXPECT_TRUE(SameBits(m, expected)) << name << " on " << target;
      }
    }
    if (name.rfind("normal", 0) == 0 || name.rfind("offset", 0) == 0) {
      const auto ref = ReferenceChannelStats(values, 1, 1, n);
      ExpectStatsNear<float>(first, ref.mean[0], ref.var[0]);
    }
  }
}

// fold::SumLanes of lanes held in pair order (each 2 L values as the even
// ones, then the odd ones) adds exactly what it adds in order: values whose
// sum depends on the order, for every lane count a target has.
TEST(MomentsTest, PairOrderSumEqualsTheSumInOrderBitwise) {
  // +-1e16 at the even values, which cancel only in the right pairs.
  double natural[32];
  for (int64_t j = 0; j < 32; ++j) {
    natural[j] = j % 4 == 0   ? 1e16
                 : j % 4 == 2 ? -1e16
                              : 1.0 + 0.37 * static_cast<double>(j);
  }
  const double expected = fold::SumLanes(natural);
  for (int64_t lanes : {1, 2, 4, 8, 16}) {
    double paired[32];
    for (int64_t b = 0; b < 32; b += 2 * lanes) {
      for (int64_t j = 0; j < lanes; ++j) {
        paired[b + j] = natural[b + 2 * j];
        paired[b + lanes + j] = natural[b + 2 * j + 1];
      }
    }
    EXPECT_EQ(std::bit_cast<uint64_t>(fold::SumLanes(paired, lanes)),
              std::bit_cast<uint64_t>(expected))
        << lanes << " lanes";
    // The values' sum depends on the order: folded as if in order, the
    // lanes in pair order give other bits.
    if (lanes > 1) {
      EXPECT_NE(std::bit_cast<uint64_t>(fold::SumLanes(paired)),
                std::bit_cast<uint64_t>(expected))
          << lanes << " lanes";
    }
  }
}

// fold::SixteenRowSums' tree, worked by hand: lanes 0, 1, 3 and 4 of row k
// hold 2^p, 1, 2k and -2^p (p the type's mantissa bits plus one), the rest
// 0. Lanes j + 8 onto j change nothing; then adjacent pairs: 2^p + 1 ties
// to 2^p, and 2^p + 2k - 2^p is 2k. FoldHalves' order (lane j + 4 onto j
// next) would give 2k + 1, the exact sum.
template <typename T>
void ExpectSixteenRowSumsTree(int p) {
  float rows[16][16] = {};
  for (int k = 0; k < 16; ++k) {
    rows[k][0] = std::ldexp(1.0f, p);
    rows[k][1] = 1.0f;
    rows[k][3] = static_cast<float>(2 * k);
    rows[k][4] = -std::ldexp(1.0f, p);
  }
  T sums[16];
  fold::SixteenRowSums(&rows[0][0], sums);
  for (int k = 0; k < 16; ++k) EXPECT_EQ(sums[k], T(2 * k)) << "row " << k;
}
TEST(MomentsTest, SixteenRowSumsFoldsHalvesThenAdjacentPairs) {
  ExpectSixteenRowSumsTree<float>(24);
  ExpectSixteenRowSumsTree<double>(53);
}

// Rows of up to 256 values reduced sixteen at a time, their folds done
// across the rows, give each row's BlockMoments bit for bit, whatever
// row of a batch it is, including rows that take the exact path and a last
// batch of fewer than 16 rows.
TEST(MomentsTest, ShortRowsSixteenAtATimeEqualOneAtATimeBitwise) {
  for (int64_t n : {16, 17, 32, 48, 64, 80, 100, 128, 129, 200, 256}) {
    constexpr int kRows = 37;  // Two whole batches and 5 rows.
    std::vector<float> x = RandomValues<float>(kRows * n, 11 + n, 3.0, 2.0);
    const auto offset = RandomValues<float>(n, 12 + n, 1e4, 1.0);
    std::copy(offset.begin(), offset.end(), x.begin() + 3 * n);
    std::fill(x.begin() + 7 * n, x.begin() + 8 * n, 0.1f);  // Constant.
    x[9 * n + 2] = std::numeric_limits<float>::infinity();
    x[17 * n + 1] = std::numeric_limits<float>::quiet_NaN();
    x[20 * n + 4] = 3e7f;  // An outlier: cancellation, the exact path.
    std::fill(x.begin() + 33 * n, x.begin() + 34 * n, -0.0f);
    SCOPED_TRACE(::testing::Message() << "n " << n);
    for (int64_t r0 = 0; r0 < kRows; r0 += 16) {
      const int count = static_cast<int>(std::min<int64_t>(16, kRows - r0));
      Moments batch[16];
      FloatRowsMoments(x.data() + r0 * n, n, count, batch);
      for (int k = 0; k < count; ++k) {
        const float* row = x.data() + (r0 + k) * n;
        const Moments one = BlockMoments(DType::kFloat32, row, n);
        EXPECT_EQ(batch[k].count, n);
        EXPECT_TRUE(SameBits(batch[k], one)) << "row " << r0 + k;
        const std::vector<float> values(row, row + n);
        if (std::isfinite(batch[k].mean)) {
          const auto ref = ReferenceChannelStats(values, 1, 1, n);
          ExpectStatsNear<float>(batch[k], ref.mean[0], ref.var[0]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace normd
