// Mergeable statistics (MergeModelStatistics, MakeModelFromState and the
// store's Put / Merge): data fitted in parts and merged equals the same data
// fitted into one model, against a long-double reference over all of it.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "server/core/model.h"
#include "server/core/model_store.h"
#include "server/core/moments.h"
#include "tests/testing/reference.h"

namespace normd {
namespace {

using testing::RandomValues;
using testing::RelErr;

constexpr int64_t kChannels = 3;
constexpr int64_t kRows = 50;

// Batches of [kRows, kChannels]; part p has its own offset and scale, so
// that the parts' means differ by far more than their spreads (the case
// where merging by sums of squares would lose digits).
std::vector<std::vector<double>> MakePart(int part, int batches) {
  std::vector<std::vector<double>> out;
  for (int b = 0; b < batches; ++b) {
    out.push_back(RandomValues<double>(kRows * kChannels, 100 * part + b,
                                       1e4 * (part + 1), 0.5 + part));
  }
  return out;
}

void Fit(BatchNormModel& model, const std::vector<double>& batch) {
  const ChannelLayout layout{.outer = kRows, .channels = kChannels, .inner = 1};
  ASSERT_TRUE(
      ApplyTrainingStep(model, ChannelMoments(batch.data(), layout)).ok());
}

BatchNormModel FittedModel(const std::string& name, bool cumulative,
                           const std::vector<std::vector<double>>& batches) {
  BatchNormModel model = MakeDefaultModel(name, kChannels);
  model.cumulative_average = cumulative;
  for (const auto& batch : batches) Fit(model, batch);
  return model;
}

// The three parts' batches, and all of them in order.
struct Data {
  std::vector<std::vector<std::vector<double>>> parts = {
      MakePart(0, 4), MakePart(1, 7), MakePart(2, 2)};
  std::vector<std::vector<double>> all() const {
    std::vector<std::vector<double>> out;
    for (const auto& part : parts)
      out.insert(out.end(), part.begin(), part.end());
    return out;
  }
};

TEST(ModelMergeTest, PartsMergedEqualEverythingFittedInOne) {
  const Data data;
  for (bool cumulative : {false, true}) {
    SCOPED_TRACE(cumulative ? "cumulative_average" : "momentum 0.1");
    BatchNormModel merged = FittedModel("m", cumulative, data.parts[0]);
    std::vector<BatchNormModel> sources;
    for (int p = 1; p < 3; ++p) {
      sources.push_back(FittedModel("other", cumulative, data.parts[p]));
    }
    const uint64_t generation = merged.generation;
    for (const BatchNormModel& source : sources) {
      ASSERT_TRUE(MergeModelStatistics(merged, source).ok());
    }
    const BatchNormModel whole = FittedModel("m", cumulative, data.all());

    // Counts: exact.
    EXPECT_EQ(merged.num_batches_tracked, 13);
    EXPECT_EQ(merged.sample_count, 13 * kRows);
    EXPECT_EQ(merged.num_batches_tracked, whole.num_batches_tracked);
    EXPECT_EQ(merged.sample_count, whole.sample_count);
    EXPECT_EQ(merged.generation, generation + 2);
    EXPECT_EQ(merged.name, "m");

    // Pooled statistics: the long-double reference over all values.
    std::vector<double> flat;
    for (const auto& batch : data.all()) {
      flat.insert(flat.end(), batch.begin(), batch.end());
    }
    const testing::RefStats ref =
        testing::ReferenceChannelStats(flat, 13 * kRows, kChannels, 1);
    const std::vector<double> mean = merged.PooledMean();
    const std::vector<double> var = merged.PooledVariance();
    for (int64_t c = 0; c < kChannels; ++c) {
      EXPECT_LE(RelErr(mean[c], ref.mean[c]), 1e-12) << c;
      EXPECT_LE(RelErr(var[c], ref.var[c]), 1e-12) << c;
      EXPECT_LE(RelErr(mean[c], whole.PooledMean()[c]), 1e-12) << c;
      EXPECT_LE(RelErr(var[c], whole.PooledVariance()[c]), 1e-12) << c;
    }

    // Running statistics: the average of the parts' running statistics
    // weighted by their batch counts, computed here from per-part
    // references; for cumulative_average that is also the whole's.
    std::vector<long double> expect_mean(kChannels, 0),
        expect_var(kChannels, 0);
    for (const auto& part : data.parts) {
      std::vector<double> part_mean(kChannels, 0), part_var(kChannels, 1);
      if (cumulative) {  // The average of the batches' mean / unbiased var.
        for (int64_t c = 0; c < kChannels; ++c) part_mean[c] = part_var[c] = 0;
        for (const auto& batch : part) {
          const testing::RefStats s =
              testing::ReferenceChannelStats(batch, kRows, kChannels, 1);
          for (int64_t c = 0; c < kChannels; ++c) {
            part_mean[c] += s.mean[c] / part.size();
            part_var[c] += s.var[c] * kRows / (kRows - 1) / part.size();
          }
        }
      } else {
        const testing::RunningStats r =
            testing::ReferenceRunningStats(part, kRows, kChannels, 0.1);
        part_mean = r.mean;
        part_var = r.var;
      }
      for (int64_t c = 0; c < kChannels; ++c) {
        expect_mean[c] +=
            static_cast<long double>(part_mean[c]) * part.size() / 13;
        expect_var[c] +=
            static_cast<long double>(part_var[c]) * part.size() / 13;
      }
    }
    for (int64_t c = 0; c < kChannels; ++c) {
      EXPECT_LE(RelErr(merged.running_mean[c], expect_mean[c]), 1e-12) << c;
      EXPECT_LE(RelErr(merged.running_var[c], expect_var[c]), 1e-12) << c;
      if (cumulative) {
        EXPECT_LE(RelErr(merged.running_mean[c], whole.running_mean[c]), 1e-12);
        EXPECT_LE(RelErr(merged.running_var[c], whole.running_var[c]), 1e-12);
      }
    }
  }
}

TEST(ModelMergeTest, WeightsFallBackToSampleCountsThenKeepTheTarget) {
  // Neither side counted a batch (InstanceNorm steps, or batches of one
  // row): the running statistics are weighted by sample_count.
  BatchNormModel into = MakeDefaultModel("m", 1);
  BatchNormModel source = MakeDefaultModel("s", 1);
  into.running_mean = {1.0};
  source.running_mean = {4.0};
  const std::vector<Moments> one_row = {{.count = 1, .mean = 0, .m2 = 0}};
  ASSERT_TRUE(ApplyTrainingStep(into, one_row).ok());
  ASSERT_TRUE(ApplyTrainingStep(source, one_row).ok());
  ASSERT_TRUE(ApplyTrainingStep(source, one_row).ok());
  ASSERT_EQ(into.num_batches_tracked + source.num_batches_tracked, 0);
  ASSERT_TRUE(MergeModelStatistics(into, source).ok());
  EXPECT_DOUBLE_EQ(into.running_mean[0], (1.0 * 1 + 4.0 * 2) / 3);
  EXPECT_EQ(into.sample_count, 3);

  // Nothing on either side: the target's running statistics stay.
  BatchNormModel empty_into = MakeDefaultModel("m", 1);
  empty_into.running_var = {7.0};
  BatchNormModel empty_source = MakeDefaultModel("s", 1);
  ASSERT_TRUE(MergeModelStatistics(empty_into, empty_source).ok());
  EXPECT_EQ(empty_into.running_var[0], 7.0);
  EXPECT_TRUE(empty_into.pooled.empty());
  EXPECT_EQ(empty_into.generation, 2u);
}

TEST(ModelMergeTest, MismatchedModelsAreRefusedUntouched) {
  const Data data;
  BatchNormModel into = FittedModel("m", false, data.parts[0]);
  const BatchNormModel before = into;
  BatchNormModel wider = MakeDefaultModel("w", kChannels + 1);
  absl::Status status = MergeModelStatistics(into, wider);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("source.num_features"), std::string::npos);
  BatchNormModel cumulative = FittedModel("c", true, data.parts[1]);
  status = MergeModelStatistics(into, cumulative);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("source.cumulative_average"),
            std::string::npos);
  EXPECT_EQ(into.generation, before.generation);
  EXPECT_EQ(into.running_mean, before.running_mean);
  EXPECT_EQ(into.PooledVariance(), before.PooledVariance());
}

ModelStateSpec ValidState() {
  ModelStateSpec state;
  state.config.name = "imported";
  state.config.num_features = 2;
  state.config.momentum = 0.3;
  state.config.eps = 1e-3;
  state.config.running_mean = {1, 2};
  state.config.running_var = {3, 4};
  state.config.num_batches_tracked = 5;
  state.sample_count = 10;
  state.pooled_mean = {0.5, -0.5};
  state.pooled_m2 = {20, 30};
  state.generation = 9;
  return state;
}

TEST(ModelMergeTest, StateBuildsTheModelExactly) {
  absl::StatusOr<BatchNormModel> model = MakeModelFromState(ValidState(), "");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->momentum, 0.3);
  EXPECT_EQ(model->eps, 1e-3);
  EXPECT_EQ(model->num_batches_tracked, 5);
  EXPECT_EQ(model->sample_count, 10);
  EXPECT_EQ(model->generation, 9u);
  EXPECT_EQ(model->weight, (std::vector<double>{1, 1}));  // Default.
  ASSERT_EQ(model->pooled.size(), 2u);
  EXPECT_EQ(model->pooled[1].count, 10);
  EXPECT_EQ(model->pooled[1].mean, -0.5);
  EXPECT_EQ(model->pooled[1].m2, 30);
  // Without pooled_m2, the biased variance times the count.
  ModelStateSpec by_var = ValidState();
  by_var.pooled_m2.clear();
  by_var.pooled_var = {2, 3};
  model = MakeModelFromState(by_var, "");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->pooled[0].m2, 20);
  EXPECT_EQ(model->pooled[1].m2, 30);
  // Generation 0 (hand-written) reads as a new model's 1.
  ModelStateSpec fresh = ValidState();
  fresh.generation = 0;
  EXPECT_EQ(MakeModelFromState(fresh, "")->generation, 1u);
}

TEST(ModelMergeTest, InvalidStatesNameTheirField) {
  struct Case {
    const char* field;
    void (*change)(ModelStateSpec&);
  };
  const Case cases[] = {
      {"model.name", [](ModelStateSpec& s) { s.config.name = "a b"; }},
      {"model.num_features",
       [](ModelStateSpec& s) { s.config.num_features = 0; }},
      {"model.momentum", [](ModelStateSpec& s) { s.config.momentum = -0.5; }},
      {"model.eps", [](ModelStateSpec& s) { s.config.eps = 0; }},
      {"model.running_var[1]",
       [](ModelStateSpec& s) { s.config.running_var[1] = -1; }},
      {"model.num_batches_tracked",
       [](ModelStateSpec& s) { s.config.num_batches_tracked = -1; }},
      {"model.sample_count", [](ModelStateSpec& s) { s.sample_count = -1; }},
      {"model.mean", [](ModelStateSpec& s) { s.sample_count = 0; }},
      {"model.mean", [](ModelStateSpec& s) { s.pooled_mean.pop_back(); }},
      {"model.pooled_m2", [](ModelStateSpec& s) { s.pooled_m2.clear(); }},
      {"model.pooled_m2[0]", [](ModelStateSpec& s) { s.pooled_m2[0] = -1; }},
      {"model.var[1]",
       [](ModelStateSpec& s) {
         s.pooled_m2.clear();
         s.pooled_var = {1, std::nan("")};
       }},
      {"model.mean[1]", [](ModelStateSpec& s) { s.pooled_mean[1] = INFINITY; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    ModelStateSpec state = ValidState();
    c.change(state);
    const absl::Status status = ValidateModelState(state, "model.");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message().rfind(c.field, 0), 0u) << status.message();
    EXPECT_EQ(MakeModelFromState(state, "model.").status(), status);
  }
}

TEST(ModelStoreMergeTest, PutCreatesReplacesAndKeepsGenerationsRising) {
  ModelStore store(ModelStoreOptions{.max_models = 2, .max_num_features = 8});
  BatchNormModel model = *MakeModelFromState(ValidState(), "");
  absl::StatusOr<BatchNormModel> put = store.Put(model, /*create_only=*/true);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->generation, 9u);  // As exported.
  EXPECT_EQ(store.Put(model, /*create_only=*/true).status().code(),
            absl::StatusCode::kAlreadyExists);
  // Replacing with an older generation still moves it forward.
  model.generation = 3;
  model.running_mean = {7, 8};
  put = store.Put(model, /*create_only=*/false);
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(put->generation, 10u);
  EXPECT_EQ(store.Get("imported")->running_mean, (std::vector<double>{7, 8}));
  // Limits apply to new names only.
  model.name = "second";
  ASSERT_TRUE(store.Put(model, false).ok());
  model.name = "third";
  EXPECT_EQ(store.Put(model, false).status().code(),
            absl::StatusCode::kResourceExhausted);
  model.name = "second";
  EXPECT_TRUE(store.Put(model, false).ok());
  EXPECT_EQ(store.CheckNumFeatures(9, "model.num_features").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store.CheckNumFeatures(8, "model.num_features").ok());
}

TEST(ModelStoreMergeTest, MergeNeedsTheTargetAndLeavesItOnRefusal) {
  ModelStore store;
  const Data data;
  const BatchNormModel source = FittedModel("s", false, data.parts[1]);
  EXPECT_EQ(store.Merge("absent", source).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(store.Put(FittedModel("m", false, data.parts[0]), false).ok());
  absl::StatusOr<BatchNormModel> merged = store.Merge("m", source);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->name, "m");
  EXPECT_EQ(merged->sample_count, 11 * kRows);
  EXPECT_EQ(store.Get("m")->sample_count, 11 * kRows);
  const BatchNormModel cumulative = FittedModel("c", true, data.parts[2]);
  EXPECT_EQ(store.Merge("m", cumulative).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Get("m")->generation, merged->generation);
}

}  // namespace
}  // namespace normd
