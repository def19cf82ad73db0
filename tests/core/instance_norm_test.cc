// InstanceNorm: stateless against the fp64 reference, and with running
// statistics moved as PyTorch moves them.
#include <gtest/gtest.h>

#include <vector>

#include "server/core/engine.h"
#include "tests/testing/core_cases.h"

namespace normd {
namespace {

using ::normd::testing::CheckGroupNorm;
using ::normd::testing::MaxAbsDiff;
using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceChannelNormalize;
using ::normd::testing::ReferenceChannelStats;
using ::normd::testing::ReferenceGroupNorm;
using ::normd::testing::View;

TEST(InstanceNormTest, MatchesReferenceInEveryLayoutFloat32) {
  CheckGroupNorm<float>(NormMode::kInstanceNorm);
}

TEST(InstanceNormTest, MatchesReferenceInEveryLayoutFloat64) {
  CheckGroupNorm<double>(NormMode::kInstanceNorm);
}

TEST(InstanceNormTest, TrainingMovesRunningStatisticsAsPyTorch) {
  // [N=3, C=2, L=5]: per (n, c) mean and unbiased variance; PyTorch
  // averages them over n and moves the running statistics by momentum.
  const Shape shape = {3, 2, 5};
  const auto x = RandomValues<double>(30, 21, 2.0, 3.0);
  Engine engine;
  ModelSpec create;
  create.name = "inst";
  create.num_features = 2;
  create.momentum = 0.25;
  ASSERT_TRUE(engine.store().Create(create).ok());
  NormalizeSpec spec;
  spec.mode = NormMode::kInstanceNorm;
  spec.model = "inst";
  spec.training = true;
  spec.input = View(x, shape);
  std::vector<double> y(30);
  auto result = engine.Normalize(spec, y.data());
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->has_value());
  const BatchNormModel& model = **result;
  std::vector<double> mean, var;
  const auto ref =
      ReferenceGroupNorm(x, shape, 1, 2, 1e-5, {}, {}, &mean, &var);
  EXPECT_LE(MaxAbsDiff(y, ref), 1e-12);
  for (int c = 0; c < 2; ++c) {
    double mean_avg = 0, var_avg = 0;
    for (int n = 0; n < 3; ++n) {
      mean_avg += mean[n * 2 + c] / 3;
      var_avg += var[n * 2 + c] * 5 / 4 / 3;  // Unbiased over L = 5.
    }
    EXPECT_NEAR(model.running_mean[c], 0.25 * mean_avg, 1e-12);
    EXPECT_NEAR(model.running_var[c], 0.75 + 0.25 * var_avg, 1e-12);
  }
  EXPECT_EQ(model.num_batches_tracked, 0);  // As PyTorch's InstanceNorm.
  EXPECT_EQ(model.sample_count, 15);
  const auto pooled = ReferenceChannelStats(x, 3, 2, 5);
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(model.PooledMean()[c], pooled.mean[c], 1e-12);
    EXPECT_NEAR(model.PooledVariance()[c], pooled.var[c], 1e-12);
  }
  // Eval uses the running statistics, as BatchNorm eval.
  spec.training = false;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  EXPECT_LE(MaxAbsDiff(y, ReferenceChannelNormalize(
                              x, 3, 2, 5, model.running_mean, model.running_var,
                              1e-5, {1, 1}, {0, 0})),
            1e-12);
}

TEST(InstanceNormTest, UnknownModelIsCreatedByTrainingOnly) {
  Engine engine;
  const auto x = RandomValues<float>(24, 2);
  NormalizeSpec spec;
  spec.mode = NormMode::kInstanceNorm;
  spec.model = "fresh";
  spec.input = View(x, {2, 3, 4});
  std::vector<float> y(24);
  EXPECT_EQ(engine.Normalize(spec, y.data()).status().code(),
            absl::StatusCode::kNotFound);
  spec.training = true;
  auto trained = engine.Normalize(spec, y.data());
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ((*trained)->num_features, 3);
  EXPECT_EQ((*trained)->generation, 2u);  // Created, then trained.
}

TEST(InstanceNormTest, CumulativeAverageModelIsRefusedUnchanged) {
  Engine engine;
  ModelSpec create;
  create.name = "cumulative";
  create.num_features = 2;
  create.cumulative_average = true;
  ASSERT_TRUE(engine.store().Create(create).ok());
  const auto x = RandomValues<double>(8, 3);
  NormalizeSpec spec;
  spec.mode = NormMode::kInstanceNorm;
  spec.model = "cumulative";
  spec.training = true;
  spec.input = View(x, {2, 2, 2});
  std::vector<double> y(8);
  EXPECT_EQ(engine.Normalize(spec, y.data()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine.store().Get("cumulative")->generation, 1u);
}

}  // namespace
}  // namespace normd
