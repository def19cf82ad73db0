// BatchNorm against the fp64 reference in every layout, the worked PyTorch
// numbers of the numerics contract, momentum and cumulative averages, and
// refused fits.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "server/core/engine.h"
#include "server/core/simd/streaming.h"
#include "tests/testing/core_cases.h"

namespace normd {
namespace {

using ::normd::testing::ExpectStatsNear;
using ::normd::testing::Fp32OutputBound;
using ::normd::testing::Fp64OutputBound;
using ::normd::testing::kMeanTolerance;
using ::normd::testing::kU64;
using ::normd::testing::kVarTolerance;
using ::normd::testing::LayoutCase;
using ::normd::testing::Layouts;
using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceChannelNormalize;
using ::normd::testing::ReferenceChannelStats;
using ::normd::testing::TrainingSpec;
using ::normd::testing::View;

// |y - expected| within Fp32OutputBound / Fp64OutputBound (reference.h)
// for channel `ch` of a normalization over m values per channel.
template <typename T>
double OutputBound(double expected, double w, double b, double m,
                   double kappa) {
  if constexpr (std::is_same_v<T, float>) {
    return Fp32OutputBound(expected, b, w);
  } else {
    return Fp64OutputBound(expected, b, w, static_cast<int64_t>(m + 7) / 8,
                           kappa);
  }
}

template <typename T>
void CheckBatchNormLayouts() {
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
    const double m = static_cast<double>(c.outer * c.inner);
    // kappa = max|x| / sigma: the data is N(5, 3), within 8 sigma.
    const double kappa = (5.0 + 8 * 3.0) / 3.0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t ch = (k / c.inner) % c.channels;
      ASSERT_LE(std::abs(y[k] - expected[k]),
                OutputBound<T>(expected[k], w[ch], b[ch], m, kappa))
          << "element " << k;
    }
    // Running stats after one momentum-0.1 step: 0.1 * mean, 0.9 + 0.1 * var
    // * m / (m - 1). Their error is 0.1 times the statistics' (within
    // kMeanTolerance of |mean| + sigma, kVarTolerance of var: the accuracy
    // bar ExpectStatsNear checked above) plus the update's 4 roundings. A
    // variance without m / (m - 1) is off by 0.1 var / (m - 1): caught for
    // every m below 2e5 (fp32) or 1e10 (fp64).
    for (int64_t ch = 0; ch < c.channels; ++ch) {
      const double mean_scale = std::abs(ref.mean[ch]) + std::sqrt(ref.var[ch]);
      const double want_mean = 0.1 * ref.mean[ch];
      const double want_var = 0.9 + 0.1 * ref.var[ch] * m / (m - 1);
      EXPECT_LE(
          std::abs((*model)->running_mean[ch] - want_mean),
          0.1 * kMeanTolerance<T> * mean_scale + 4 * kU64 * std::abs(want_mean))
          << ch;
      EXPECT_LE(std::abs((*model)->running_var[ch] - want_var),
                0.1 * kVarTolerance<T> * ref.var[ch] * m / (m - 1) +
                    4 * kU64 * want_var)
          << ch;
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
    // Eval: no reduction (one value per statistic), weight 1, bias 0.
    for (int64_t k = 0; k < n; ++k) {
      ASSERT_LE(std::abs(y[k] - eval_expected[k]),
                OutputBound<T>(eval_expected[k], 1.0, 0.0, 1.0, kappa))
          << "element " << k;
    }
  }
}

TEST(BatchNormTest, EveryLayoutMatchesReferenceFloat32) {
  CheckBatchNormLayouts<float>();
}

TEST(BatchNormTest, EveryLayoutMatchesReferenceFloat64) {
  CheckBatchNormLayouts<double>();
}

// docs/api.md: BatchNorm1d(2) in train mode on x = [[1,2],[3,6],[5,10],[7,14]].
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

// PyTorch 1.13: momentum=None over batches x, 2x+1, [[0,0],[1,1]].
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
  // The batches' unbiased variances: 20/3 and 80/3, 80/3 and 320/3, 1/2
  // and 1/2; the running variance is their average over the batches so far
  // (6.667, 26.667; 16.667, 66.667; 11.278, 44.611 as PyTorch prints them).
  const double expected_var[3][2] = {
      {20.0 / 3, 80.0 / 3},
      {(20.0 / 3 + 80.0 / 3) / 2, (80.0 / 3 + 320.0 / 3) / 2},
      {(20.0 / 3 + 80.0 / 3 + 0.5) / 3, (80.0 / 3 + 320.0 / 3 + 0.5) / 3}};
  for (int step = 0; step < 3; ++step) {
    const auto& x = batches[step];
    FitSpec fit{"cma", View(x, {static_cast<int64_t>(x.size() / 2), 2}),
                std::nullopt};
    auto model = engine.Fit(fit);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(model->num_batches_tracked, step + 1);
    for (int c = 0; c < 2; ++c) {
      // A few fp64 roundings on each side (the moments, the average's
      // update, the expectation's divisions): 8 u.
      EXPECT_NEAR(model->running_mean[c], expected_mean[step][c],
                  8 * kU64 * expected_mean[step][c]);
      EXPECT_NEAR(model->running_var[c], expected_var[step][c],
                  8 * kU64 * expected_var[step][c]);
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
          EXPECT_NEAR(y[i], reference, Fp32OutputBound(reference, 0.25, 2.0))
              << "element " << i;
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

}  // namespace
}  // namespace normd
