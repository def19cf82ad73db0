// Numeric core against an independent fp64 reference, the worked PyTorch
// numbers of numerics.md, the accuracy bar and thread-count determinism.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "server/core/engine.h"
#include "server/core/moments.h"
#include "server/core/parallel.h"
#include "server/core/stream_copy.h"
#include "tests/input_view.h"
#include "tests/reference.h"

namespace normd {
namespace {

using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceChannelNormalize;
using ::normd::testing::ReferenceChannelStats;
using ::normd::testing::ReferenceLayerNorm;
using ::normd::testing::RelErr;
using ::normd::testing::View;

// A training BatchNorm request for model `model` on x.
template <typename T>
NormalizeSpec TrainingSpec(const std::string& model, const std::vector<T>& x,
                           Shape shape, int32_t axis) {
  NormalizeSpec spec;
  spec.mode = NormMode::kBatchNorm;
  spec.model = model;
  spec.training = true;
  spec.channel_axis = axis;
  spec.input = View(x, std::move(shape));
  return spec;
}

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

// How close the statistics of T data must be to the fp64 reference: the
// mean relative to its scale |mean| + std, the variance relative. fp32 data
// goes through the fp32-SIMD fast paths (lanes flushed to fp64): errors of
// about one fp32 ulp (6e-8) of the data on tensors too small to average them
// out; fp64 data through the all-fp64 paths.
template <typename T>
constexpr double kMeanTolerance = std::is_same_v<T, float> ? 5e-8 : 1e-13;
template <typename T>
constexpr double kVarTolerance = std::is_same_v<T, float> ? 5e-7 : 1e-12;

template <typename T>
void ExpectStatsNear(const Moments& m, double ref_mean, double ref_var) {
  const double scale = std::abs(ref_mean) + std::sqrt(ref_var);
  EXPECT_LE(std::abs(m.mean - ref_mean), kMeanTolerance<T> * scale);
  if (m.count > 1) {
    EXPECT_LE(RelErr(m.BiasedVariance(), ref_var), kVarTolerance<T>);
  }
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

// Blocks are reduced by a hand-written AVX-512 kernel where the CPU has one
// and by a compiler-vectorized loop elsewhere; both must give the same bits:
// at every tail and flush boundary, and on the blocks that fall back to the
// exact path (a shift far from the mean, a constant block, tiny values whose
// squares underflow) or are non-finite. (On a CPU without AVX-512 both
// sides run the same loop.)
TEST(MomentsTest, HandWrittenBlockKernelMatchesTheVectorizedLoopBitwise) {
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
  for (const auto& [name, x] : blocks) {
    const int64_t n = static_cast<int64_t>(x.size());
    const Moments hand = FloatBlockMoments(x.data(), n, true);
    const Moments loop = FloatBlockMoments(x.data(), n, false);
    EXPECT_EQ(hand.count, n) << name;
    EXPECT_EQ(loop.count, n) << name;
    EXPECT_EQ(std::bit_cast<uint64_t>(hand.mean),
              std::bit_cast<uint64_t>(loop.mean))
        << name << ": " << hand.mean << " vs " << loop.mean;
    EXPECT_EQ(std::bit_cast<uint64_t>(hand.m2),
              std::bit_cast<uint64_t>(loop.m2))
        << name << ": " << hand.m2 << " vs " << loop.m2;
    if (name.rfind("normal", 0) == 0 || name.rfind("offset", 0) == 0) {
      // And both are the fp64 moments.
      const auto ref = ReferenceChannelStats(x, 1, 1, n);
      ExpectStatsNear<float>(hand, ref.mean[0], ref.var[0]);
    }
  }
}

// Rows of up to 128 values reduced sixteen at a time, their folds done
// across the rows, give each row's FloatBlockMoments bit for bit, whatever
// row of a batch it is, including rows that take the exact path and a last
// batch of fewer than 16 rows.
TEST(MomentsTest, ShortRowsSixteenAtATimeEqualOneAtATimeBitwise) {
  for (int64_t n : {16, 32, 48, 64, 80, 128}) {
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
      ShortRowMoments16(x.data() + r0 * n, n, count, batch);
      for (int k = 0; k < count; ++k) {
        const float* row = x.data() + (r0 + k) * n;
        for (bool hand_written : {true, false}) {
          const Moments one = FloatBlockMoments(row, n, hand_written);
          EXPECT_EQ(batch[k].count, n);
          EXPECT_EQ(std::bit_cast<uint64_t>(batch[k].mean),
                    std::bit_cast<uint64_t>(one.mean))
              << "row " << r0 + k << ": " << batch[k].mean << " vs "
              << one.mean;
          EXPECT_EQ(std::bit_cast<uint64_t>(batch[k].m2),
                    std::bit_cast<uint64_t>(one.m2))
              << "row " << r0 + k << ": " << batch[k].m2 << " vs " << one.m2;
        }
        const std::vector<float> values(row, row + n);
        if (std::isfinite(batch[k].mean)) {
          const auto ref = ReferenceChannelStats(values, 1, 1, n);
          ExpectStatsNear<float>(batch[k], ref.mean[0], ref.var[0]);
        }
      }
    }
  }
}

// A layout case: shape, channel axis, and [outer, C, inner] as expected.
struct LayoutCase {
  const char* name;
  Shape shape;
  int32_t axis;
  int64_t outer, channels, inner;
};

std::vector<LayoutCase> Layouts() {
  return {
      {"NC", {64, 5}, 1, 64, 5, 1},
      {"NCL", {8, 3, 50}, 1, 8, 3, 50},
      {"NCHW", {4, 3, 40, 40}, 1, 4, 3, 1600},
      {"NHWC", {4, 20, 20, 6}, -1, 1600, 6, 1},
      {"NCDHW", {2, 4, 6, 7, 8}, 1, 2, 4, 336},
      {"NDHWC", {2, 5, 6, 7, 3}, -1, 420, 3, 1},
      {"NLC_axis2", {6, 300, 7}, 2, 1800, 7, 1},
      {"wide_C", {3, 5000}, 1, 3, 5000, 1},
  };
}

TEST(LayoutTest, ResolveChannelAxis) {
  for (const LayoutCase& c : Layouts()) {
    auto layout = ResolveChannelAxis(c.shape, c.axis);
    ASSERT_TRUE(layout.ok()) << c.name;
    EXPECT_EQ(layout->outer, c.outer) << c.name;
    EXPECT_EQ(layout->channels, c.channels) << c.name;
    EXPECT_EQ(layout->inner, c.inner) << c.name;
  }
  EXPECT_EQ(ResolveChannelAxis({2, 3}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveChannelAxis({2, 3}, -2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveChannelAxis({2, 3}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveChannelAxis({5}, std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveNormalizedDims({2, 3}, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveNormalizedDims({2, 3}, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

template <typename T>
void CheckBatchNormLayouts(double tolerance) {
  for (const LayoutCase& c : Layouts()) {
    SCOPED_TRACE(c.name);
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    const auto x = RandomValues<T>(n, 7, 5.0, 3.0);
    const ChannelLayout layout{c.outer, c.channels, c.inner};
    const auto ref = ReferenceChannelStats(x, c.outer, c.channels, c.inner);
    const auto moments = ChannelMoments(x.data(), layout);
    ASSERT_EQ(moments.size(), static_cast<size_t>(c.channels));
    for (int64_t ch = 0; ch < c.channels; ++ch) {
      ExpectStatsNear<T>(moments[ch], ref.mean[ch], ref.var[ch]);
    }

    // Training Normalize on a fresh model, with a per-call weight and bias.
    Engine engine;
    NormalizeSpec spec = TrainingSpec("m", x, c.shape, c.axis);
    std::vector<double> w(c.channels), b(c.channels);
    for (int64_t ch = 0; ch < c.channels; ++ch) {
      w[ch] = 0.5 + 0.25 * static_cast<double>(ch % 7);
      b[ch] = -1.0 + 0.125 * static_cast<double>(ch % 5);
    }
    spec.weight = AffineParam{{c.channels}, w};
    spec.bias = AffineParam{{c.channels}, b};
    std::vector<T> y(n);
    auto model = engine.Normalize(spec, y.data());
    ASSERT_TRUE(model.ok()) << model.status();
    const auto expected = ReferenceChannelNormalize(
        x, c.outer, c.channels, c.inner, ref.mean, ref.var, 1e-5, w, b);
    for (int64_t k = 0; k < n; ++k) {
      ASSERT_NEAR(y[k], expected[k], tolerance * (1 + std::abs(expected[k])))
          << "element " << k;
    }
    // Running stats after one momentum-0.1 step: 0.1 * mean, 0.9 + 0.1 * var
    // * m / (m - 1).
    const double m = static_cast<double>(c.outer * c.inner);
    const double tol = 100 * kVarTolerance<T>;
    for (int64_t ch = 0; ch < c.channels; ++ch) {
      EXPECT_NEAR((*model)->running_mean[ch], 0.1 * ref.mean[ch], tol);
      EXPECT_NEAR((*model)->running_var[ch],
                  0.9 + 0.1 * ref.var[ch] * m / (m - 1), tol);
    }

    // Eval with the model's statistics.
    spec.training = false;
    spec.weight.reset();
    spec.bias.reset();
    ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
    const auto eval_expected = ReferenceChannelNormalize(
        x, c.outer, c.channels, c.inner, (*model)->running_mean,
        (*model)->running_var, 1e-5, std::vector<double>(c.channels, 1.0),
        std::vector<double>(c.channels, 0.0));
    for (int64_t k = 0; k < n; ++k) {
      ASSERT_NEAR(y[k], eval_expected[k],
                  tolerance * (1 + std::abs(eval_expected[k])))
          << "element " << k;
    }
  }
}

TEST(BatchNormTest, EveryLayoutMatchesReferenceFloat32) {
  CheckBatchNormLayouts<float>(2e-6);
}

TEST(BatchNormTest, EveryLayoutMatchesReferenceFloat64) {
  CheckBatchNormLayouts<double>(1e-12);
}

// numerics.md: BatchNorm1d(2) in train mode on x = [[1,2],[3,6],[5,10],[7,14]].
TEST(BatchNormTest, WorkedPyTorchExample) {
  const std::vector<double> x = {1, 2, 3, 6, 5, 10, 7, 14};
  Engine engine;
  NormalizeSpec spec;
  spec.mode = NormMode::kBatchNorm;
  spec.model = "bn";
  spec.training = true;
  spec.input = View(x, {4, 2});
  std::vector<double> y(8);
  auto model = engine.Normalize(spec, y.data());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_NEAR((*model)->running_mean[0], 0.4, 1e-15);
  EXPECT_NEAR((*model)->running_mean[1], 0.8, 1e-15);
  EXPECT_NEAR((*model)->running_var[0], 0.9 + 0.1 * 20.0 / 3.0, 1e-15);
  EXPECT_NEAR((*model)->running_var[1], 0.9 + 0.1 * 80.0 / 3.0, 1e-15);
  EXPECT_NEAR((*model)->running_var[0], 1.5667, 1e-4);
  EXPECT_NEAR((*model)->running_var[1], 3.5667, 1e-4);
  EXPECT_EQ((*model)->num_batches_tracked, 1);
  // Output uses the biased batch variance [5, 20]: (1 - 4) / sqrt(5 + 1e-5).
  EXPECT_NEAR(y[0], -3.0 / std::sqrt(5.0 + 1e-5), 1e-15);
  EXPECT_NEAR(y[1], -6.0 / std::sqrt(20.0 + 1e-5), 1e-15);
  EXPECT_NEAR(y[7], 6.0 / std::sqrt(20.0 + 1e-5), 1e-15);
  // Pooled statistics equal the batch's.
  EXPECT_EQ((*model)->PooledMean(), (std::vector<double>{4, 8}));
  EXPECT_NEAR((*model)->PooledVariance()[0], 5.0, 1e-15);
  EXPECT_NEAR((*model)->PooledVariance()[1], 20.0, 1e-15);
}

// numerics.md: momentum=None over batches x, 2x+1, [[0,0],[1,1]].
TEST(BatchNormTest, WorkedCumulativeAverageSequence) {
  Engine engine;
  ModelSpec create;
  create.name = "cma";
  create.num_features = 2;
  create.cumulative_average = true;
  ASSERT_TRUE(engine.store().Create(create).ok());
  const std::vector<std::vector<double>> batches = {
      {1, 2, 3, 6, 5, 10, 7, 14}, {3, 5, 7, 13, 11, 21, 15, 29}, {0, 0, 1, 1}};
  const double expected_mean[3][2] = {{4, 8}, {6.5, 12.5}, {4.5, 8.5}};
  const double expected_var[3][2] = {
      {6.667, 26.667}, {16.667, 66.667}, {11.278, 44.611}};
  for (int step = 0; step < 3; ++step) {
    const auto& x = batches[step];
    FitSpec fit{"cma", View(x, {static_cast<int64_t>(x.size() / 2), 2}),
                std::nullopt};
    auto model = engine.Fit(fit);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(model->num_batches_tracked, step + 1);
    for (int c = 0; c < 2; ++c) {
      EXPECT_NEAR(model->running_mean[c], expected_mean[step][c], 1e-12);
      EXPECT_NEAR(model->running_var[c], expected_var[step][c], 1e-3);
    }
  }
  // Pooled over all 10 rows: channel 0 = {1,3,5,7,3,7,11,15,0,1}.
  auto model = engine.store().Get("cma");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->sample_count, 10);
  const std::vector<double> ch0 = {1, 3, 5, 7, 3, 7, 11, 15, 0, 1};
  const auto ref = ReferenceChannelStats(ch0, 1, 1, 10);
  EXPECT_NEAR(model->PooledMean()[0], ref.mean[0], 1e-14);
  EXPECT_NEAR(model->PooledVariance()[0], ref.var[0], 1e-13);
}

// The fp32 channel affine folds the part of the mean that float drops into
// the shift (fma(x - hi, scale, shift - (mean - hi) * scale)). Where the fp32
// scale is not finite (an infinite weight, or one past FLT_MAX) there is
// nothing to fold into: every value must still come out as the infinity of
// the sign of (x - mean) * weight, never NaN, cached and streamed, in both
// layouts. (Folding an infinite rest made half of them NaN.) Values equal to
// the float-rounded mean are left out: 0 * inf is NaN there, as in a
// float-mean computation. Weight 1e39 is checked where its result overflows
// float: its fp32 scale is infinite, so results that would fit (x within
// 0.34 of the mean) come out infinite too, a limit of fp32 scales. The
// finite channel meets the fp64 reference.
TEST(BatchNormTest, OverflowingScalesGiveSignedInfinities) {
  constexpr double kMean = 1.0 / 3.0;  // Not a float: a non-zero rest.
  const std::vector<double> weight = {std::numeric_limits<double>::infinity(),
                                      -std::numeric_limits<double>::infinity(),
                                      1e39, 2.0};
  const std::vector<float> values = {-2.0f, 0.25f,   0.5f,
                                     7.0f,  0.3333f, 0.33334f};
  constexpr int64_t kChannels = 4;
  constexpr int64_t kRows = 64;  // Per channel, runs of 64 values.
  Engine engine;
  ModelSpec create;
  create.name = "inf";
  create.num_features = kChannels;
  create.running_mean.assign(kChannels, kMean);
  create.running_var.assign(kChannels, 1.0);
  create.bias.assign(kChannels, 0.25);
  ASSERT_TRUE(engine.store().Create(create).ok());
  for (bool channels_last : {false, true}) {
    for (int64_t threshold :
         {std::numeric_limits<int64_t>::max(), int64_t{0}}) {
      SCOPED_TRACE(::testing::Message() << "channels_last " << channels_last
                                        << " streamed " << (threshold == 0));
      SetStreamingOutputBytes(threshold);
      std::vector<float> x(2 * kChannels * kRows);
      auto channel_of = [&](int64_t i) {
        return channels_last ? i % kChannels : (i / kRows) % kChannels;
      };
      for (size_t i = 0; i < x.size(); ++i) x[i] = values[i % values.size()];
      NormalizeSpec spec;
      spec.mode = NormMode::kBatchNorm;
      spec.model = "inf";
      spec.input = View(x, channels_last ? Shape{2, kRows, kChannels}
                                         : Shape{2, kChannels, kRows});
      spec.channel_axis = channels_last ? -1 : 1;
      spec.weight = AffineParam{{kChannels}, weight};
      std::vector<float> y(x.size());
      ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
      for (size_t i = 0; i < x.size(); ++i) {
        const int64_t c = channel_of(static_cast<int64_t>(i));
        const double reference = (static_cast<double>(x[i]) - kMean) /
                                     std::sqrt(1.0 + kDefaultEps) * weight[c] +
                                 0.25;
        if (c == 3) {
          EXPECT_NEAR(y[i], reference, 1e-6) << "element " << i;
        } else if (c != 2 || std::isinf(static_cast<float>(reference))) {
          EXPECT_EQ(y[i], static_cast<float>(reference))
              << "element " << i << " x " << x[i] << " channel " << c;
        }
      }
    }
  }
  SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
}

// A momentum-0.1 training sequence against an fp64 reference stepped by hand.
TEST(BatchNormTest, MomentumSequenceMatchesReference) {
  Engine engine;
  std::vector<double> rm(3, 0.0), rv(3, 1.0);
  for (int step = 0; step < 6; ++step) {
    const auto x = RandomValues<float>(5 * 3 * 4, 100 + step, step, 1 + step);
    FitSpec fit{"seq", View(x, {5, 3, 4}), std::nullopt};
    auto model = engine.Fit(fit);
    ASSERT_TRUE(model.ok());
    const auto ref = ReferenceChannelStats(x, 5, 3, 4);
    for (int c = 0; c < 3; ++c) {
      rm[c] = 0.9 * rm[c] + 0.1 * ref.mean[c];
      rv[c] = 0.9 * rv[c] + 0.1 * ref.var[c] * 20.0 / 19.0;
      EXPECT_NEAR(model->running_mean[c], rm[c], 1e-12);
      EXPECT_NEAR(model->running_var[c], rv[c], 1e-12);
    }
    EXPECT_EQ(model->num_batches_tracked, step + 1);
    EXPECT_EQ(model->generation, static_cast<uint64_t>(step + 1 + 1));
  }
}

TEST(BatchNormTest, FitWithOneValuePerChannelUpdatesOnlyPooled) {
  Engine engine;
  const std::vector<double> a = {1, 2, 3, 4};
  ASSERT_TRUE(engine.Fit({"one", View(a, {2, 2}), std::nullopt}).ok());
  const std::vector<double> single = {10, 20};
  auto model = engine.Fit({"one", View(single, {1, 2}), std::nullopt});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->num_batches_tracked, 1);
  EXPECT_EQ(model->sample_count, 3);
  EXPECT_NEAR(model->running_mean[0], 0.2, 1e-15);
  EXPECT_NEAR(model->PooledMean()[0], (1 + 3 + 10) / 3.0, 1e-14);
  // A training Normalize with m = 1 is INVALID_ARGUMENT (PyTorch).
  NormalizeSpec spec;
  spec.mode = NormMode::kBatchNorm;
  spec.model = "one";
  spec.training = true;
  spec.input = View(single, {1, 2});
  std::vector<double> y(2);
  EXPECT_EQ(engine.Normalize(spec, y.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.store().Get("one")->generation, model->generation);
}

TEST(BatchNormTest, NonFiniteFitIsRejectedAndChangesNothing) {
  Engine engine;
  std::vector<float> x = {1, 2, 3, 4};
  ASSERT_TRUE(engine.Fit({"nf", View(x, {2, 2}), std::nullopt}).ok());
  const BatchNormModel before = *engine.store().Get("nf");
  x[3] = std::numeric_limits<float>::quiet_NaN();
  auto status = engine.Fit({"nf", View(x, {2, 2}), std::nullopt}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("input"), std::string::npos);
  const BatchNormModel after = *engine.store().Get("nf");
  EXPECT_EQ(after.generation, before.generation);
  EXPECT_EQ(after.running_mean, before.running_mean);
}

TEST(LayerNormTest, MatchesReferenceWithAffine) {
  for (int k : {1, 2, 3}) {
    const Shape shape = {3, 4, 5, 6};
    int64_t n = 1;
    for (int i = 4 - k; i < 4; ++i) n *= shape[i];
    const auto x = RandomValues<float>(360, 5 + k, 2.0, 4.0);
    std::vector<double> w(n), b(n);
    for (int64_t j = 0; j < n; ++j) {
      w[j] = 1.0 + 0.01 * static_cast<double>(j);
      b[j] = 0.5 - 0.02 * static_cast<double>(j);
    }
    NormalizeSpec spec;
    spec.mode = NormMode::kLayerNorm;
    spec.normalized_ndim = k;
    spec.input = View(x, shape);
    spec.weight = AffineParam{Shape(shape.end() - k, shape.end()), w};
    spec.bias = AffineParam{Shape(shape.end() - k, shape.end()), b};
    Engine engine;
    std::vector<float> y(360);
    ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
    const auto ref = ReferenceLayerNorm(x, n, 1e-5, w, b);
    for (int64_t i = 0; i < 360; ++i) {
      ASSERT_NEAR(y[i], ref[i], 2e-6 * (1 + std::abs(ref[i]))) << k << " " << i;
    }
    // A weight of the wrong shape names the field.
    spec.weight = AffineParam{{n + 1}, std::vector<double>(n + 1, 1.0)};
    auto status = engine.Normalize(spec, y.data()).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("weight.shape"), std::string::npos);
  }
}

TEST(LayerNormTest, BertStyleUsesUnbiasedStdOutsideTheRoot) {
  const std::vector<double> x = {1, 2, 3, 4};
  NormalizeSpec spec;
  spec.mode = NormMode::kLayerNorm;
  spec.layer_norm_style = LayerNormStyle::kBertUnbiasedStd;
  spec.input = View(x, {1, 4});
  std::vector<double> y(4);
  Engine engine;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  const double std_unbiased = std::sqrt(5.0 / 3.0);
  EXPECT_NEAR(y[0], -1.5 / (std_unbiased + 1e-6), 1e-15);
  EXPECT_NEAR(y[3], 1.5 / (std_unbiased + 1e-6), 1e-15);
}

TEST(LayerNormTest, NonFiniteValuesPassThroughAsIeee) {
  const std::vector<float> x = {
      1, std::numeric_limits<float>::infinity(), 3, 4, 5, 6};
  NormalizeSpec spec;
  spec.mode = NormMode::kLayerNorm;
  spec.input = View(x, {2, 3});
  std::vector<float> y(6);
  Engine engine;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  EXPECT_TRUE(std::isnan(y[0]));  // Row 0 has an Inf: NaN as in PyTorch.
  EXPECT_NEAR(y[3], -1.0 / std::sqrt(2.0 / 3.0 + 1e-5), 1e-6);
}

// The same bar for channels-last data with the channel counts that take
// the fp32 register tiles (64 channels, and the narrower tiles of 32, 16,
// .., 1 beside or instead of them; 128 channels and more, rows first, with
// the same lanes): their error comes from each flush of
// fp32 lanes, so it does not shrink with the count per channel, and fewer
// values per channel show it (2.1e-7 with 32 rows per flush).
TEST(AccuracyTest, OffsetTenThousandChannelsLastTiles) {
  struct Case {
    int64_t channels;
    int64_t per_channel;
  };
  for (const Case& c :
       {Case{64, 100'000}, Case{96, 40'000}, Case{16, 100'000},
        Case{3, 200'000}, Case{256, 25'000}, Case{1024, 6'000}}) {
    SCOPED_TRACE(c.channels);
    const int64_t n = c.channels * c.per_channel;
    const auto x = RandomValues<float>(n, 44, 1e4, 1.0);
    const ChannelLayout layout{c.per_channel, c.channels, 1};
    const auto ref =
        ReferenceChannelStats(x, layout.outer, layout.channels, layout.inner);
    const auto moments = ChannelMoments(x.data(), layout);
    for (int64_t ch = 0; ch < c.channels; ++ch) {
      EXPECT_LE(RelErr(moments[ch].BiasedVariance(), ref.var[ch]), 1e-7) << ch;
      EXPECT_LE(RelErr(moments[ch].mean, ref.mean[ch]), 1e-12) << ch;
    }
  }
}

// numerics.md accuracy bar: 1e4 + N(0,1), 1e7 values per channel / row,
// relative variance error <= 1e-7 in every layout.
TEST(AccuracyTest, OffsetTenThousandEveryLayout) {
  constexpr int64_t kPerChannel = 10'000'000;
  struct Case {
    const char* name;
    Shape shape;
    int32_t axis;
  };
  const Case cases[] = {
      {"NC", {kPerChannel, 2}, 1},        {"NCHW", {10, 2, 1000, 1000}, 1},
      {"NHWC", {10, 1000, 1000, 2}, -1},  {"NCL_long", {1000, 2, 10000}, 1},
      {"NCL_short", {100000, 2, 100}, 1}, {"NCDHW", {10, 2, 100, 100, 100}, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto x = RandomValues<float>(2 * kPerChannel, 42, 1e4, 1.0);
    auto layout = ResolveChannelAxis(c.shape, c.axis);
    ASSERT_TRUE(layout.ok());
    const auto ref = ReferenceChannelStats(x, layout->outer, layout->channels,
                                           layout->inner);
    const auto moments = ChannelMoments(x.data(), *layout);
    for (int ch = 0; ch < 2; ++ch) {
      EXPECT_LE(RelErr(moments[ch].BiasedVariance(), ref.var[ch]), 1e-7);
      EXPECT_LE(RelErr(moments[ch].mean, ref.mean[ch]), 1e-12);
    }
  }
  // LayerNorm: one row of 1e7; check the output against the reference too.
  const auto x = RandomValues<float>(kPerChannel, 43, 1e4, 1.0);
  const auto ref = ReferenceChannelStats(x, 1, 1, kPerChannel);
  const Moments m = ContiguousMoments(x.data(), kPerChannel);
  EXPECT_LE(RelErr(m.BiasedVariance(), ref.var[0]), 1e-7);
  NormalizeSpec spec;
  spec.mode = NormMode::kLayerNorm;
  spec.input = View(x, {1, kPerChannel});
  std::vector<float> y(kPerChannel);
  Engine engine;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  const double rstd = 1.0 / std::sqrt(ref.var[0] + 1e-5);
  for (int64_t i = 0; i < kPerChannel; i += 9973) {
    ASSERT_NEAR(y[i], (x[i] - ref.mean[0]) * rstd, 1e-5);
  }
}

// Every fp32 channel path (AVX-512 runs, short runs, channels-last
// registers and per-element loads, with streaming or ordinary stores, and
// the compiled loops that CPUs without AVX-512 run: this test is also run
// under valgrind) computes exactly the documented formula: hi = the fp64
// mean rounded to float, y = fma(x - hi, float(scale), float(shift - (mean -
// hi) * scale)) with scale = weight / sqrt(var + eps) in fp64. BatchNorm eval
// with a model whose statistics the test chose, means off float's grid.
TEST(StreamingTest, ChannelOutputsAreTheDocumentedFp32FormulaBitwise) {
  struct Case {
    Shape shape;
    int32_t axis;
  };
  const Case cases[] = {
      {{4, 6, 40, 50}, 1},    // Runs of 2000.
      {{40, 6, 7, 7}, 1},     // Short runs (49 values).
      {{4, 50, 41, 64}, -1},  // Channels-last, parameters in registers.
      {{4, 50, 41, 5}, -1},   // Channels-last, per-element parameters.
      {{4, 50, 41, 80}, -1},
  };
  for (const Case& c : cases) {
    const int64_t channels = c.axis < 0 ? c.shape.back() : c.shape[1];
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    const auto x = RandomValues<float>(n, 31, 1e4, 3.0);
    ModelSpec create;
    create.name = "m";
    create.num_features = channels;
    for (int64_t k = 0; k < channels; ++k) {
      const double i = static_cast<double>(k);
      create.running_mean.push_back(1e4 + i / 3.0);
      create.running_var.push_back(2.0 + i / 7.0);
      create.weight.push_back(0.5 + i / 11.0);
      create.bias.push_back(0.25 - i / 13.0);
    }
    std::vector<float> expected(n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = c.axis < 0
                            ? i % channels
                            : (i / (n / c.shape[0] / channels)) % channels;
      const double mean = create.running_mean[k];
      const double scale =
          create.weight[k] / std::sqrt(create.running_var[k] + kDefaultEps);
      const float hi = static_cast<float>(mean);
      const float shift = static_cast<float>(
          create.bias[k] - (mean - static_cast<double>(hi)) * scale);
      expected[i] = std::fma(x[i] - hi, static_cast<float>(scale), shift);
    }
    for (int64_t threshold :
         {std::numeric_limits<int64_t>::max(), int64_t{0}}) {
      SCOPED_TRACE(::testing::Message()
                   << "last dim " << c.shape.back() << " axis " << c.axis
                   << " streamed " << (threshold == 0));
      SetStreamingOutputBytes(threshold);
      Engine engine;
      ASSERT_TRUE(engine.store().Create(create).ok());
      NormalizeSpec spec;
      spec.mode = NormMode::kBatchNorm;
      spec.model = "m";
      spec.input = View(x, c.shape);
      spec.channel_axis = c.axis;
      std::vector<float> y(n);
      ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (std::memcmp(&y[i], &expected[i], sizeof(float)) != 0 &&
            differ++ < 3) {
          ADD_FAILURE() << "element " << i << ": " << y[i] << " expected "
                        << expected[i];
        }
      }
      EXPECT_EQ(differ, 0);
    }
  }
  SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
}

// Large outputs go out through streaming stores (fused AVX-512 runs or a
// staging buffer); they must carry exactly the bits of the cached path.
TEST(StreamingTest, StreamedOutputsEqualCachedOutputsBitwise) {
  struct Case {
    NormMode mode;
    Shape shape;
    int32_t axis_or_k;
    bool affine;
    int64_t groups = 0;  // GroupNorm.
  };
  const Case cases[] = {
      {NormMode::kLayerNorm, {4096, 768}, 1, true},
      {NormMode::kLayerNorm, {2, 1, 40000}, 1, false},  // Long rows.
      // Enough long rows for whole rows per work item.
      {NormMode::kLayerNorm, {16, 40000}, 1, true},
      {NormMode::kBatchNorm, {8, 16, 128, 128}, 1, true},
      {NormMode::kBatchNorm, {8, 128, 128, 16}, -1, false},
      // Odd row lengths and channel counts: rows and channel periods that
      // start mid-line, a period longer than 1024 (C = 1500).
      {NormMode::kLayerNorm, {4099, 771}, 1, true},
      {NormMode::kBatchNorm, {8, 128, 128, 3}, -1, true},
      {NormMode::kBatchNorm, {1500, 1500}, 1, true},
      // Channels-last counts whose parameters repeat within 64 values (held
      // in registers: 1, 2, 3 or 4 vectors), ones that do not (5, 80), and a
      // period shorter than the repeat (6 channels, 6 rows: 36 < 48).
      {NormMode::kBatchNorm, {4, 100, 99, 64}, -1, true},
      {NormMode::kBatchNorm, {4, 100, 99, 24}, -1, true},
      {NormMode::kBatchNorm, {4, 100, 99, 32}, -1, false},
      {NormMode::kBatchNorm, {4, 100, 99, 1}, -1, true},
      {NormMode::kBatchNorm, {4, 100, 99, 5}, -1, true},
      {NormMode::kBatchNorm, {4, 100, 99, 80}, -1, true},
      {NormMode::kBatchNorm, {6, 6}, -1, true},
      // Runs of 16-255 values (7x7, 5x5, 4x4 images) go line by line across
      // runs, a line's lanes from up to two channels.
      {NormMode::kBatchNorm, {64, 32, 7, 7}, 1, true},
      {NormMode::kBatchNorm, {50, 20, 5, 5}, 1, false},
      {NormMode::kBatchNorm, {30, 8, 4, 4}, 1, true},
      {NormMode::kBatchNorm, {20, 12, 15, 17}, 1, true},
      {NormMode::kBatchNorm, {7, 3, 16, 16}, 1, true},
      {NormMode::kGroupNorm, {4, 60, 61, 64}, -1, true, 8},
      {NormMode::kGroupNorm, {4, 60, 61, 48}, -1, false, 4},
      {NormMode::kInstanceNorm, {4, 60, 61, 64}, -1, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "mode " << static_cast<int>(c.mode) << " last dim "
                 << c.shape.back() << " axis/k " << c.axis_or_k);
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    const auto x = RandomValues<float>(n, 5, 100.0, 3.0);
    // `offset` floats into the buffer: 1 makes every line partial at the
    // ends (masked stores).
    auto run = [&](int64_t threshold, int64_t offset) {
      SetStreamingOutputBytes(threshold);
      Engine engine;
      NormalizeSpec spec = TrainingSpec("s", x, c.shape, c.axis_or_k);
      spec.mode = c.mode;
      spec.normalized_ndim = c.axis_or_k;
      spec.num_groups = c.groups;
      if (c.mode != NormMode::kBatchNorm) spec.model.clear();  // Stateless.
      const int64_t params = c.mode == NormMode::kLayerNorm || c.axis_or_k < 0
                                 ? c.shape.back()
                                 : c.shape[1];
      if (c.affine) {
        std::vector<double> w(params), b(params);
        for (int64_t i = 0; i < params; ++i) {
          w[i] = 0.5 + 0.001 * static_cast<double>(i);
          b[i] = 0.25 - 0.002 * static_cast<double>(i);
        }
        spec.weight = AffineParam{{params}, w};
        spec.bias = AffineParam{{params}, b};
      }
      std::vector<float> y(n + offset);
      EXPECT_TRUE(engine.Normalize(spec, y.data() + offset).ok());
      return std::vector<float>(y.begin() + offset, y.end());
    };
    const auto cached = run(std::numeric_limits<int64_t>::max(), 0);
    for (int64_t offset : {0, 1}) {
      const auto streamed = run(0, offset);
      EXPECT_EQ(std::memcmp(streamed.data(), cached.data(), n * sizeof(float)),
                0)
          << "output offset " << offset;
    }
    SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
  }
}

// Rows of 16-128 values stream sixteen at a time (into a 64-byte aligned
// output, as the service's), with the bits of the cached path and of a
// misaligned output (a row at a time), in every row style, with and without
// weights and biases, and against the fp64 definitions.
TEST(StreamingTest, ShortRowsStreamedInBatchesEqualCachedBitwise) {
  using ::normd::testing::ReferenceRmsNorm;
  for (int64_t n : {16, 48, 64, 128, 100}) {
    constexpr int64_t kRows = 1000;  // 62 batches and 8 rows.
    const auto x = RandomValues<float>(kRows * n, 21 + n, 2.0, 3.0);
    std::vector<double> w(n), b(n);
    for (int64_t j = 0; j < n; ++j) {
      w[j] = 0.5 + 0.01 * static_cast<double>(j);
      b[j] = 0.25 - 0.02 * static_cast<double>(j);
    }
    for (LayerNormStyle style :
         {LayerNormStyle::kPyTorch, LayerNormStyle::kBertUnbiasedStd,
          LayerNormStyle::kRms}) {
      for (int affine = 0; affine < 3; ++affine) {
        SCOPED_TRACE(::testing::Message()
                     << "n " << n << " style " << static_cast<int>(style)
                     << " affine " << affine);
        NormalizeSpec spec;
        spec.mode = style == LayerNormStyle::kRms ? NormMode::kRmsNorm
                                                  : NormMode::kLayerNorm;
        spec.layer_norm_style =
            style == LayerNormStyle::kRms ? LayerNormStyle::kPyTorch : style;
        spec.normalized_ndim = 1;
        spec.input = View(x, {kRows, n});
        if (affine >= 1) spec.weight = AffineParam{{n}, w};
        if (affine >= 2) spec.bias = AffineParam{{n}, b};
        // offset -1: in place, in an aligned copy of x.
        auto run = [&](int64_t threshold, int64_t offset) {
          SetStreamingOutputBytes(threshold);
          std::vector<float> buffer(kRows * n + 32);
          const auto address = reinterpret_cast<uintptr_t>(buffer.data());
          float* y = buffer.data() + (64 - address % 64) % 64 / 4 +
                     std::max<int64_t>(offset, 0);
          NormalizeSpec call = spec;
          if (offset < 0) {
            std::copy(x.begin(), x.end(), y);
            call.input.data = y;
          }
          Engine engine;
          EXPECT_TRUE(engine.Normalize(call, y).ok());
          SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
          return std::vector<float>(y, y + kRows * n);
        };
        const auto cached = run(std::numeric_limits<int64_t>::max(), 0);
        for (int64_t offset : {0, 1, -1}) {
          const auto streamed = run(0, offset);
          EXPECT_EQ(std::memcmp(streamed.data(), cached.data(),
                                cached.size() * sizeof(float)),
                    0)
              << "output offset " << offset;
        }
        const std::vector<double> no;
        const auto& weight = affine >= 1 ? w : no;
        const auto& bias = affine >= 2 ? b : no;
        std::vector<double> ref;
        if (style == LayerNormStyle::kRms) {
          ref = ReferenceRmsNorm(x, n, 1e-5, weight, bias);
        } else if (style == LayerNormStyle::kPyTorch) {
          ref = ReferenceLayerNorm(x, n, 1e-5, weight, bias);
        } else {
          // (x - mean) / (unbiased std + 1e-6), from the fp64 statistics.
          ref.resize(x.size());
          for (int64_t r = 0; r < kRows; ++r) {
            const auto s = ReferenceChannelStats(
                std::vector<float>(x.begin() + r * n, x.begin() + (r + 1) * n),
                1, 1, n);
            const double std_unbiased = std::sqrt(
                s.var[0] * static_cast<double>(n) / static_cast<double>(n - 1));
            for (int64_t j = 0; j < n; ++j) {
              double v = (x[r * n + j] - s.mean[0]) / (std_unbiased + 1e-6);
              if (affine >= 1) v *= w[j];
              if (affine >= 2) v += b[j];
              ref[r * n + j] = v;
            }
          }
        }
        double worst = 0.0;
        for (size_t i = 0; i < ref.size(); ++i) {
          worst = std::max(
              worst, std::abs(cached[i] - ref[i]) / (1.0 + std::abs(ref[i])));
        }
        EXPECT_LE(worst, 2e-6);
      }
    }
  }
}

// The bytes of x split at random boundaries (1 byte to 2 KiB, so elements
// straddle chunks and most chunks are misaligned), copied into odd offsets of
// one backing string.
class RandomChunks {
 public:
  template <typename T>
  RandomChunks(const std::vector<T>& x, uint32_t seed) {
    const char* bytes = reinterpret_cast<const char*>(x.data());
    const size_t n = x.size() * sizeof(T);
    std::mt19937 gen(seed);
    std::vector<std::pair<size_t, size_t>> cuts;  // (backing offset, size)
    for (size_t pos = 0; pos < n;) {
      const size_t take = std::min<size_t>(
          n - pos, std::uniform_int_distribution<size_t>(1, 2048)(gen));
      backing_ += std::string(1 + gen() % 7, '\xAB');  // Misaligning gap.
      cuts.emplace_back(backing_.size(), take);
      backing_.append(bytes + pos, take);
      pos += take;
    }
    for (const auto& [offset, size] : cuts) {
      scattered_.Append(absl::string_view(backing_).substr(offset, size));
    }
  }
  const ScatteredBytes* get() const { return &scattered_; }

 private:
  std::string backing_;
  ScatteredBytes scattered_;
};

// Scattered input (InputTensor::scattered) is read piece by piece for
// LayerNorm and BatchNorm eval and gathered first elsewhere: every path must
// give bitwise the outputs and model of contiguous input, streamed or not.
template <typename T>
void CheckScatteredMatchesContiguous() {
  struct Case {
    NormMode mode;
    Shape shape;
    int32_t axis_or_k;
    bool training;
  };
  const Case cases[] = {
      {NormMode::kLayerNorm, {300, 768}, 1, false},
      {NormMode::kLayerNorm, {37, 5, 11}, 2, false},
      {NormMode::kLayerNorm, {2, 40000}, 1, false},  // Long rows: gathered.
      {NormMode::kBatchNorm, {4, 16, 40, 40}, 1, false},
      {NormMode::kBatchNorm, {4, 40, 40, 16}, -1, false},
      {NormMode::kBatchNorm, {64, 3}, 1, false},
      {NormMode::kBatchNorm, {4, 16, 40, 40}, 1, true},  // Gathered.
  };
  for (int64_t threshold : {int64_t{0}, std::numeric_limits<int64_t>::max()}) {
    SetStreamingOutputBytes(threshold);
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << c.shape.size() << "d mode " << static_cast<int>(c.mode)
                   << " k/axis " << c.axis_or_k << " stream "
                   << (threshold == 0));
      int64_t n = 1;
      for (int64_t d : c.shape) n *= d;
      const auto x = RandomValues<T>(n, 21, 4.0, 3.0);
      const RandomChunks chunks(x, 22);
      auto run = [&](bool scattered, std::optional<BatchNormModel>& model) {
        Engine engine;
        if (c.mode == NormMode::kBatchNorm && !c.training) {
          // A fitted model, so that eval uses non-trivial statistics.
          FitSpec fit{"m", View(x, c.shape), c.axis_or_k};
          EXPECT_TRUE(engine.Fit(fit).ok());
        }
        NormalizeSpec spec = TrainingSpec("m", x, c.shape, c.axis_or_k);
        spec.mode = c.mode;
        spec.training = c.training;
        spec.normalized_ndim = c.axis_or_k;
        if (scattered) {
          spec.input.data = nullptr;
          spec.input.scattered = chunks.get();
        }
        EXPECT_EQ(Engine::ReadsScatteredInPlace(spec),
                  c.training == false && c.shape.back() != 40000);
        std::vector<T> y(n);
        auto result = engine.Normalize(spec, y.data());
        EXPECT_TRUE(result.ok()) << result.status();
        if (result.ok()) model = *result;
        return y;
      };
      std::optional<BatchNormModel> model_contiguous, model_scattered;
      const auto contiguous = run(false, model_contiguous);
      const auto scattered = run(true, model_scattered);
      EXPECT_EQ(std::memcmp(contiguous.data(), scattered.data(), n * sizeof(T)),
                0);
      ASSERT_EQ(model_contiguous.has_value(), model_scattered.has_value());
      if (model_contiguous.has_value()) {
        EXPECT_EQ(model_contiguous->running_mean,
                  model_scattered->running_mean);
        EXPECT_EQ(model_contiguous->running_var, model_scattered->running_var);
      }
    }
  }
  SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
  // Fit gathers scattered input: the same statistics.
  const auto x = RandomValues<T>(4 * 16 * 40 * 40, 23, 4.0, 3.0);
  const RandomChunks chunks(x, 24);
  Engine a, b;
  FitSpec fit{"m", View(x, {4, 16, 40, 40}), 1};
  const auto fitted = a.Fit(fit);
  fit.input.data = nullptr;
  fit.input.scattered = chunks.get();
  const auto fitted_scattered = b.Fit(fit);
  ASSERT_TRUE(fitted.ok() && fitted_scattered.ok());
  EXPECT_EQ(fitted->running_var, fitted_scattered->running_var);
}

TEST(ScatteredInputTest, EveryPathMatchesContiguousBitwise) {
  CheckScatteredMatchesContiguous<float>();
  CheckScatteredMatchesContiguous<double>();
}

// Runs `f` with the core limited to `threads` threads. The core computes in
// its own arena (ComputeArena), so an arena made here would not limit it; a
// global_control does (the most restrictive one is in effect).
template <typename F>
auto WithThreads(int threads, F f) {
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                            threads);
  return f();
}

TEST(DeterminismTest, OutputsAndStatisticsBitwiseEqualFor1AndNThreads) {
  tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  struct Case {
    Shape shape;
    int32_t axis;
  };
  const Case cases[] = {{{64, 3, 64, 64}, 1},
                        {{64, 64, 64, 3}, -1},
                        {{200000, 7}, 1},
                        {{2, 3, 300000}, 1},
                        {{1, 5, 700, 300}, 1},
                        {{3, 20000, 33}, 2},
                        // LayerNorm rows of 40000: whole rows per work item
                        // on 1 and 2 threads, spread over the threads one
                        // at a time on 3 and 8 (see LayerNormKernel).
                        {{8, 2, 20000}, 1}};
  for (const Case& c : cases) {
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    const auto x = RandomValues<float>(n, 9, 1e3, 5.0);
    auto run = [&](int threads) {
      return WithThreads(threads, [&] {
        Engine engine;
        NormalizeSpec spec = TrainingSpec("d", x, c.shape, c.axis);
        std::vector<float> y(n);
        auto model = engine.Normalize(spec, y.data());
        EXPECT_TRUE(model.ok());
        spec.mode = NormMode::kLayerNorm;
        spec.normalized_ndim = 2;
        std::vector<float> ln(n);
        EXPECT_TRUE(engine.Normalize(spec, ln.data()).ok());
        return std::make_tuple(y, ln, (*model)->running_var,
                               (*model)->PooledVariance());
      });
    };
    const auto one = run(1);
    for (int threads : {2, 3, 8}) {
      const auto many = run(threads);
      EXPECT_EQ(std::memcmp(std::get<0>(one).data(), std::get<0>(many).data(),
                            n * sizeof(float)),
                0)
          << threads;
      EXPECT_EQ(std::memcmp(std::get<1>(one).data(), std::get<1>(many).data(),
                            n * sizeof(float)),
                0)
          << threads;
      EXPECT_EQ(std::get<2>(one), std::get<2>(many));
      EXPECT_EQ(std::get<3>(one), std::get<3>(many));
    }
  }
}

TEST(ParallelTest, SerialLoopsScopeRunsLoopsWholeOnTheCallingThread) {
  const tbb::blocked_range<int64_t> range(0, 1 << 20, 1024);
  struct Call {
    int64_t begin, end;
    std::thread::id thread;
  };
  auto calls_of = [&] {
    std::vector<Call> calls;
    std::mutex mutex;
    ParallelFor(range, range.size(), [&](const tbb::blocked_range<int64_t>& r) {
      std::lock_guard<std::mutex> lock(mutex);
      calls.push_back({r.begin(), r.end(), std::this_thread::get_id()});
    });
    return calls;
  };
  EXPECT_FALSE(SerialLoopsScope::Active());
  {
    const SerialLoopsScope serial;
    EXPECT_TRUE(SerialLoopsScope::Active());
    {
      const SerialLoopsScope inactive(false);  // Nested: stays serial.
      EXPECT_TRUE(SerialLoopsScope::Active());
    }
    const std::vector<Call> calls = calls_of();
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].begin, 0);
    EXPECT_EQ(calls[0].end, 1 << 20);
    EXPECT_EQ(calls[0].thread, std::this_thread::get_id());
  }
  EXPECT_FALSE(SerialLoopsScope::Active());
  {
    const SerialLoopsScope inactive(false);
    EXPECT_FALSE(SerialLoopsScope::Active());
  }
  // Without a scope the loop is split (into many pieces, whatever the
  // number of threads), covering the range once.
  std::vector<Call> calls = calls_of();
  EXPECT_GT(calls.size(), 1u);
  int64_t covered = 0;
  for (const Call& c : calls) covered += c.end - c.begin;
  EXPECT_EQ(covered, 1 << 20);
}

}  // namespace
}  // namespace normd
