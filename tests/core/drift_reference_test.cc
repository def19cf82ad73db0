// Drift references in the store: set from running, pooled or explicit
// statistics, cleared, kept by ResetModel and MergeModel, taken in by a
// checkpoint import and ImportModel, and every malformed request refused
// with the field named and nothing changed.
#include "server/core/drift_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "server/core/model.h"
#include "server/core/model_store.h"

namespace normd {
namespace {

// A store holding model "m" of two channels, running statistics set.
class DriftReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(store
                    .Create({.name = "m",
                             .num_features = 2,
                             .running_mean = {1, 2},
                             .running_var = {3, 4}})
                    .ok());
  }
  ModelStore store;
};

TEST_F(DriftReferenceTest, RunningSourceCopiesTheRunningStatisticsNow) {
  absl::StatusOr<BatchNormModel> model =
      store.SetReference("m", {.source = ReferenceSource::kRunning});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(model->reference.has_value());
  EXPECT_EQ(model->reference->source, ReferenceSource::kRunning);
  EXPECT_EQ(model->reference->mean, (std::vector<double>{1, 2}));
  EXPECT_EQ(model->reference->var, (std::vector<double>{3, 4}));
  EXPECT_GT(model->reference->set_unix_nanos, 0);
  EXPECT_EQ(model->generation, 2u);
  // Training moves the running statistics, not the reference.
  ASSERT_TRUE(store
                  .Train("m", {{.count = 2, .mean = 10, .m2 = 2},
                               {.count = 2, .mean = 20, .m2 = 8}})
                  .ok());
  EXPECT_EQ(store.Get("m")->reference->mean, (std::vector<double>{1, 2}));
}

TEST_F(DriftReferenceTest, PooledSourceNeedsSomethingFitted) {
  absl::StatusOr<BatchNormModel> refused =
      store.SetReference("m", {.source = ReferenceSource::kPooled});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(store.Get("m")->reference.has_value());
  EXPECT_EQ(store.Get("m")->generation, 1u);
  ASSERT_TRUE(store
                  .Train("m", {{.count = 4, .mean = 10, .m2 = 8},
                               {.count = 4, .mean = -1, .m2 = 4}})
                  .ok());
  absl::StatusOr<BatchNormModel> model =
      store.SetReference("m", {.source = ReferenceSource::kPooled});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->reference->mean, (std::vector<double>{10, -1}));
  EXPECT_EQ(model->reference->var, (std::vector<double>{2, 1}));  // M2 / n.
}

TEST_F(DriftReferenceTest, ExplicitSourceTakesTheArrays) {
  absl::StatusOr<BatchNormModel> model = store.SetReference(
      "m",
      {.source = ReferenceSource::kExplicit, .mean = {5, 6}, .var = {0, 7}});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->reference->source, ReferenceSource::kExplicit);
  EXPECT_EQ(model->reference->var, (std::vector<double>{0, 7}));
}

TEST_F(DriftReferenceTest, MalformedRequestsNameTheFieldAndChangeNothing) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    ReferenceRequest request;
    absl::StatusCode code;
    std::string field;
  };
  const Case cases[] = {
      {{.source = static_cast<ReferenceSource>(0)},
       absl::StatusCode::kInvalidArgument,
       "source"},
      {{.source = ReferenceSource::kCheckpoint},
       absl::StatusCode::kInvalidArgument,
       "source"},
      {{.source = ReferenceSource::kRunning, .mean = {1, 2}},
       absl::StatusCode::kInvalidArgument,
       "mean"},
      {{.source = ReferenceSource::kPooled, .var = {1, 2}},
       absl::StatusCode::kInvalidArgument,
       "var"},
      {{.source = ReferenceSource::kExplicit},
       absl::StatusCode::kInvalidArgument,
       "mean"},
      {{.source = ReferenceSource::kExplicit, .mean = {1, 2}, .var = {1}},
       absl::StatusCode::kInvalidArgument,
       "var"},
      {{.source = ReferenceSource::kExplicit, .mean = {1, 2}, .var = {1, -1}},
       absl::StatusCode::kInvalidArgument,
       "var[1]"},
      {{.source = ReferenceSource::kExplicit, .mean = {1, 2}, .var = {nan, 1}},
       absl::StatusCode::kInvalidArgument,
       "var[0]"},
      {{.source = ReferenceSource::kExplicit, .mean = {inf, 2}, .var = {1, 1}},
       absl::StatusCode::kInvalidArgument,
       "mean[0]"},
      // Another length than the model's num_features.
      {{.source = ReferenceSource::kExplicit,
        .mean = {1, 2, 3},
        .var = {1, 1, 1}},
       absl::StatusCode::kInvalidArgument,
       "mean"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<BatchNormModel> refused = store.SetReference("m", c.request);
    EXPECT_EQ(refused.status().code(), c.code) << refused.status();
    EXPECT_TRUE(absl::StartsWith(refused.status().message(), c.field + ":"))
        << refused.status() << " should name " << c.field;
  }
  EXPECT_FALSE(store.Get("m")->reference.has_value());
  EXPECT_EQ(store.Get("m")->generation, 1u);
  // An unknown model: NOT_FOUND, after a well-formed request.
  EXPECT_EQ(store.SetReference("nope", {.source = ReferenceSource::kRunning})
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store.ClearReference("nope").status().code(),
            absl::StatusCode::kNotFound);
  // A malformed request on an unknown model: the request's problem first.
  EXPECT_EQ(store.SetReference("nope", {.source = ReferenceSource::kExplicit})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DriftReferenceTest, ClearRemovesItAndResetKeepsIt) {
  ASSERT_TRUE(
      store.SetReference("m", {.source = ReferenceSource::kRunning}).ok());
  absl::StatusOr<BatchNormModel> reset = store.Reset("m");
  ASSERT_TRUE(reset.ok());
  ASSERT_TRUE(reset->reference.has_value());
  EXPECT_EQ(reset->reference->mean, (std::vector<double>{1, 2}));
  absl::StatusOr<BatchNormModel> cleared = store.ClearReference("m");
  ASSERT_TRUE(cleared.ok());
  EXPECT_FALSE(cleared->reference.has_value());
  EXPECT_EQ(cleared->generation, reset->generation + 1);
}

TEST_F(DriftReferenceTest, MergeKeepsTheTargetsReference) {
  ASSERT_TRUE(
      store.SetReference("m", {.source = ReferenceSource::kRunning}).ok());
  BatchNormModel source = *store.Get("m");
  source.reference->mean = {100, 200};
  absl::StatusOr<BatchNormModel> merged = store.Merge("m", source);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->reference->mean, (std::vector<double>{1, 2}));
}

TEST_F(DriftReferenceTest, CheckpointImportSetsTheRunningStatistics) {
  absl::StatusOr<BatchNormModel> model =
      store.Create({.name = "ckpt",
                    .num_features = 2,
                    .running_mean = {0.5, -0.5},
                    .running_var = {2, 3},
                    .reference_from_running = true});
  ASSERT_TRUE(model.ok());
  ASSERT_TRUE(model->reference.has_value());
  EXPECT_EQ(model->reference->source, ReferenceSource::kCheckpoint);
  EXPECT_EQ(model->reference->mean, (std::vector<double>{0.5, -0.5}));
  EXPECT_EQ(model->reference->var, (std::vector<double>{2, 3}));
}

TEST_F(DriftReferenceTest, ImportedStatesCarryAValidatedReference) {
  ModelStateSpec state{.config = {.name = "i", .num_features = 2}};
  state.reference = DriftReference{.source = ReferenceSource::kExplicit,
                                   .set_unix_nanos = 42,
                                   .mean = {1, 2},
                                   .var = {3, 4}};
  absl::StatusOr<BatchNormModel> model = MakeModelFromState(state, "model.");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->reference->set_unix_nanos, 42);
  state.reference->var = {3, -4};
  EXPECT_EQ(
      MakeModelFromState(state, "model.").status().message().substr(0, 25),
      "model.reference.var[1]: -");
  state.reference->var = {3};
  EXPECT_FALSE(MakeModelFromState(state, "model.").ok());
  state.reference->var = {3, 4};
  state.reference->set_unix_nanos = -1;
  EXPECT_FALSE(MakeModelFromState(state, "model.").ok());
}

}  // namespace
}  // namespace normd

namespace normd {
namespace {

// A model of 100 channels named "w" costs ModelFootprintBytes(100, 1); its
// reference and window drift_bytes_per_channel (here 56) more a channel.
TEST(DriftReferenceBudgetTest, AReferenceIsChargedToMaxModelBytes) {
  const int64_t model = ModelFootprintBytes(100, 1);
  const int64_t drift = 100 * 56;
  ModelStore store(
      {.max_model_bytes = model + drift - 1, .drift_bytes_per_channel = 56});
  ASSERT_TRUE(store.Create({.name = "w", .num_features = 100}).ok());
  EXPECT_EQ(store.model_bytes(), model);

  // One byte short: refused, naming the flag, and nothing changes.
  absl::StatusOr<BatchNormModel> refused =
      store.SetReference("w", {.source = ReferenceSource::kRunning});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(
      absl::StrContains(refused.status().message(), "--max_model_bytes"))
      << refused.status();
  EXPECT_FALSE(store.Get("w")->reference.has_value());
  EXPECT_EQ(store.Get("w")->generation, 1u);
  EXPECT_EQ(store.model_bytes(), model);
  // A model created with one is refused the same way where it would fit
  // without one.
  EXPECT_EQ(
      store
          .Create(
              {.name = "v", .num_features = 90, .reference_from_running = true})
          .status()
          .code(),
      absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store.Create({.name = "v", .num_features = 90}).ok());
}

TEST(DriftReferenceBudgetTest, SetClearDeleteAndImportBookTheCharge) {
  const int64_t model = ModelFootprintBytes(100, 1);
  const int64_t drift = 100 * 56;
  ModelStore store(
      {.max_model_bytes = 2 * (model + drift), .drift_bytes_per_channel = 56});
  ASSERT_TRUE(store.Create({.name = "w", .num_features = 100}).ok());
  ASSERT_TRUE(
      store.SetReference("w", {.source = ReferenceSource::kRunning}).ok());
  EXPECT_EQ(store.model_bytes(), model + drift);
  // Setting it again replaces it: charged once.
  ASSERT_TRUE(
      store.SetReference("w", {.source = ReferenceSource::kRunning}).ok());
  EXPECT_EQ(store.model_bytes(), model + drift);
  ASSERT_TRUE(store.ClearReference("w").ok());
  EXPECT_EQ(store.model_bytes(), model);

  // Created with one, and imported (Put) in place of one without.
  ASSERT_TRUE(store
                  .Create({.name = "x",
                           .num_features = 100,
                           .reference_from_running = true})
                  .ok());
  EXPECT_EQ(store.model_bytes(), 2 * model + drift);
  BatchNormModel with_reference = *store.Get("x");
  with_reference.name = "w";
  ASSERT_TRUE(store.Put(with_reference, /*create_only=*/false).ok());
  EXPECT_EQ(store.model_bytes(), 2 * (model + drift));
  ASSERT_TRUE(store.Delete("x").ok());
  ASSERT_TRUE(store.Delete("w").ok());
  EXPECT_EQ(store.model_bytes(), 0);
}

}  // namespace
}  // namespace normd
