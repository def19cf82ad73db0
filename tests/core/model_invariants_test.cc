// What the store accepts, it can recover: ValidateModel's invariants, the
// counter checks of every change, the store's refusal (OUT_OF_RANGE, nothing
// changed or logged) of results that would not validate, the memory budget
// (--max_num_features, --max_model_bytes), --max_rank, and error messages
// that stay short and show whole characters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/engine.h"
#include "server/core/model.h"
#include "server/core/model_store.h"
#include "server/core/mutation_log.h"
#include "server/core/tensor.h"

namespace normd {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr uint64_t kUint64Max = std::numeric_limits<uint64_t>::max();

// A valid model of two channels with pooled statistics of 4 values.
BatchNormModel Fitted() {
  BatchNormModel model = MakeDefaultModel("m", 2);
  EXPECT_TRUE(ApplyTrainingStep(
                  model, std::vector<Moments>{{4, 1.0, 2.0}, {4, -1.0, 3.0}})
                  .ok());
  return model;
}

bool SameModel(const BatchNormModel& a, const BatchNormModel& b) {
  auto key = [](const BatchNormModel& m) {
    std::vector<double> pooled;
    for (const Moments& p : m.pooled) {
      pooled.insert(pooled.end(), {double(p.count), p.mean, p.m2});
    }
    return std::tuple(m.name, m.num_features, m.momentum, m.eps,
                      m.num_batches_tracked, m.sample_count, m.running_mean,
                      m.running_var, m.weight, m.bias, pooled, m.generation);
  };
  return key(a) == key(b);
}

TEST(ValidateModelTest, NamesEveryBrokenInvariant) {
  ASSERT_TRUE(ValidateModel(Fitted()).ok());
  ASSERT_TRUE(ValidateModel(MakeDefaultModel("fresh", 3)).ok());
  const std::vector<
      std::pair<std::function<void(BatchNormModel&)>, std::string>>
      breaks = {
          {[](BatchNormModel& m) { m.name = "bad name"; }, "name"},
          {[](BatchNormModel& m) { m.num_features = 0; }, "num_features"},
          {[](BatchNormModel& m) { m.momentum = 1.5; }, "momentum"},
          {[](BatchNormModel& m) { m.momentum = NAN; }, "momentum"},
          {[](BatchNormModel& m) { m.eps = 0; }, "eps"},
          {[](BatchNormModel& m) { m.num_batches_tracked = -1; },
           "num_batches_tracked"},
          {[](BatchNormModel& m) { m.sample_count = -4; }, "sample_count"},
          {[](BatchNormModel& m) { m.running_mean[1] = INFINITY; },
           "running_mean[1]"},
          {[](BatchNormModel& m) { m.running_var[0] = -1; }, "running_var[0]"},
          {[](BatchNormModel& m) { m.weight.pop_back(); }, "weight"},
          {[](BatchNormModel& m) { m.bias[0] = NAN; }, "bias[0]"},
          {[](BatchNormModel& m) { m.pooled.clear(); }, "mean"},
          {[](BatchNormModel& m) { m.pooled[1].count = 3; }, "mean[1]"},
          {[](BatchNormModel& m) { m.pooled[0].mean = NAN; }, "mean[0]"},
          {[](BatchNormModel& m) { m.pooled[1].m2 = INFINITY; }, "var[1]"},
          {[](BatchNormModel& m) { m.pooled[0].m2 = -1; }, "var[0]"},
          {[](BatchNormModel& m) { m.generation = 0; }, "generation"},
      };
  for (const auto& [change, field] : breaks) {
    BatchNormModel model = Fitted();
    change(model);
    const absl::Status status = ValidateModel(model);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_EQ(status.message().substr(0, field.size()), field) << status;
  }
}

TEST(ModelStepsTest, CountersThatWouldOverflowAreRefusedUntouched) {
  const std::vector<Moments> batch = {{2, 0.5, 1.0}, {2, 0.0, 2.0}};
  struct Case {
    std::function<void(BatchNormModel&)> setup;
    std::function<absl::Status(BatchNormModel&)> change;
    std::string field;
  };
  const BatchNormModel source = Fitted();
  const std::vector<Case> cases = {
      {[](BatchNormModel& m) { m.num_batches_tracked = kInt64Max; },
       [&](BatchNormModel& m) { return ApplyTrainingStep(m, batch); },
       "num_batches_tracked"},
      {[](BatchNormModel& m) {
         m.sample_count = kInt64Max - 1;
         for (Moments& p : m.pooled) p.count = m.sample_count;
       },
       [&](BatchNormModel& m) { return ApplyTrainingStep(m, batch); },
       "sample_count"},
      {[](BatchNormModel& m) { m.generation = kUint64Max; },
       [&](BatchNormModel& m) { return ApplyTrainingStep(m, batch); },
       "generation"},
      {[](BatchNormModel& m) { m.generation = kUint64Max; },
       [&](BatchNormModel& m) {
         return ApplyInstanceStep(m, batch, std::vector<double>(4, 1.0));
       },
       "generation"},
      {[](BatchNormModel& m) { m.generation = kUint64Max; },
       [](BatchNormModel& m) { return ResetStatistics(m); }, "generation"},
      {[](BatchNormModel& m) {
         m.sample_count = kInt64Max - 2;
         for (Moments& p : m.pooled) p.count = m.sample_count;
       },
       [&](BatchNormModel& m) { return MergeModelStatistics(m, source); },
       "sample_count"},
      {[](BatchNormModel& m) { m.num_batches_tracked = kInt64Max; },
       [&](BatchNormModel& m) {
         BatchNormModel counted = source;
         counted.num_batches_tracked = 1;
         return MergeModelStatistics(m, counted);
       },
       "num_batches_tracked"},
  };
  for (const Case& c : cases) {
    BatchNormModel model = Fitted();
    c.setup(model);
    const BatchNormModel before = model;
    const absl::Status status = c.change(model);
    EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << c.field;
    EXPECT_EQ(status.message().substr(0, c.field.size()), c.field) << status;
    EXPECT_TRUE(SameModel(model, before)) << c.field;
  }
}

// At a counter's limit a model refuses to train; ResetModel clears the
// counts (not the generation), and training goes on from them. A
// generation at its limit is the one counter a reset cannot clear.
TEST(ModelStepsTest, ResetThenTrainAtACounterLimit) {
  const std::vector<Moments> batch = {{2, 0.5, 1.0}, {2, 0.0, 2.0}};
  BatchNormModel model = Fitted();
  model.num_batches_tracked = kInt64Max;
  model.sample_count = kInt64Max - 1;
  for (Moments& p : model.pooled) p.count = model.sample_count;
  ASSERT_EQ(ApplyTrainingStep(model, batch).code(),
            absl::StatusCode::kOutOfRange);
  const uint64_t generation = model.generation;
  ASSERT_TRUE(ResetStatistics(model).ok());
  EXPECT_EQ(model.num_batches_tracked, 0);
  EXPECT_EQ(model.sample_count, 0);
  EXPECT_EQ(model.generation, generation + 1);
  ASSERT_TRUE(ApplyTrainingStep(model, batch).ok());
  EXPECT_EQ(model.num_batches_tracked, 1);
  EXPECT_EQ(model.sample_count, 2);
  // Momentum 0.1 from the reset's 0 / 1: 0.1 * 0.5 and 0.9 + 0.1 * (2 * 1 /
  // (2 - 1)): the biased variance M2 / 2 = 0.5, unbiased 1.
  EXPECT_DOUBLE_EQ(model.running_mean[0], 0.05);
  EXPECT_DOUBLE_EQ(model.running_var[0], 0.9 + 0.1 * 1.0);
  EXPECT_TRUE(ValidateModel(model).ok());

  BatchNormModel last = Fitted();
  last.generation = kUint64Max - 1;
  ASSERT_TRUE(ResetStatistics(last).ok());  // The generation's last step.
  EXPECT_EQ(last.generation, kUint64Max);
  const BatchNormModel before = last;
  const absl::Status status = ApplyTrainingStep(last, batch);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(status.message().substr(0, 10), "generation") << status;
  EXPECT_TRUE(SameModel(last, before));
}

TEST(ModelStepsTest, BatchMomentsMustBeWhatAReductionGives) {
  for (const std::vector<Moments>& batch :
       {std::vector<Moments>{{-1, 0, 0}, {-1, 0, 0}},
        std::vector<Moments>{{0, 0, 0}, {0, 0, 0}},
        std::vector<Moments>{{2, NAN, 0}, {2, 0, 0}},
        std::vector<Moments>{{2, 0, -1}, {2, 0, 0}},
        std::vector<Moments>{{2, 0, 0}, {3, 0, 0}}}) {
    BatchNormModel model = Fitted();
    const BatchNormModel before = model;
    const absl::Status status = ApplyTrainingStep(model, batch);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message().substr(0, 6), "batch[") << status;
    EXPECT_TRUE(SameModel(model, before));
  }
}

TEST(ModelStepsTest, AveragesNearTheTopOfTheRangeStayFinite) {
  BatchNormModel into = MakeDefaultModel("m", 1);
  into.running_mean = {1.7e308};
  into.running_var = {1.7e308};
  into.num_batches_tracked = 3;
  BatchNormModel source = into;
  ASSERT_TRUE(MergeModelStatistics(into, source).ok());
  EXPECT_EQ(into.running_mean[0], 1.7e308);
  EXPECT_EQ(into.running_var[0], 1.7e308);
}

// Keeps the mutations a store logs.
class CountingLog final : public MutationLog {
 public:
  absl::Status Healthy() override { return absl::OkStatus(); }
  uint64_t Append(const Mutation& mutation) override {
    kinds.push_back(mutation.kind);
    return kinds.size();
  }
  absl::Status WaitDurable(uint64_t) override { return absl::OkStatus(); }
  void OnDurable(uint64_t, std::function<void(absl::Status)> done) override {
    done(absl::OkStatus());
  }
  std::vector<Mutation::Kind> kinds;
};

TEST(ModelStoreInvariantsTest, ResultsThatWouldNotValidateAreRefusedUnlogged) {
  ModelStore store;
  CountingLog log;
  store.SetMutationLog(&log);
  absl::StatusOr<BatchNormModel> high =
      MakeModelFromState({.config = {.name = "high", .num_features = 1},
                          .sample_count = 1,
                          .pooled_mean = {1e200},
                          .pooled_m2 = {0.0}},
                         "");
  ASSERT_TRUE(high.ok()) << high.status();
  ASSERT_TRUE(store.Put(*high, /*create_only=*/true).ok());
  const size_t logged = log.kinds.size();
  // Chan's formula: (2e200)^2 overflows, so the pooled M2 would be inf.
  absl::StatusOr<BatchNormModel> result =
      store.Train("high", std::vector<Moments>{{1, -1e200, 0.0}});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(result.status().message().substr(0, 7), "var[0]:")
      << result.status();
  BatchNormModel low = *high;
  low.pooled[0].mean = -1e200;
  EXPECT_EQ(store.Merge("high", low).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(log.kinds.size(), logged);
  EXPECT_TRUE(SameModel(*store.Get("high"), *high));

  // A first step that is refused creates nothing, and logs nothing.
  EXPECT_EQ(store.Train("new", std::vector<Moments>{{0, 0, 0}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Get("new").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(log.kinds.size(), logged);
  // An accepted first step logs the creation, then the step.
  ASSERT_TRUE(store.Train("new", std::vector<Moments>{{2, 0, 1}}).ok());
  EXPECT_EQ(log.kinds.size(), logged + 2);
  EXPECT_EQ(log.kinds[logged], Mutation::Kind::kCreate);
  EXPECT_EQ(log.kinds[logged + 1], Mutation::Kind::kTrain);

  // Put validates what it is given.
  BatchNormModel broken = MakeDefaultModel("broken", 1);
  broken.running_var = {-1};
  EXPECT_EQ(store.Put(broken, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelStoreInvariantsTest, TheBudgetChargesWholeModelsAndNamesItsFlag) {
  const int64_t one = ModelFootprintBytes(100, 1);
  ASSERT_EQ(one, 256 + 1 + 56 * 100);
  ModelStore store({.max_models = 100,
                    .max_num_features = 1000,
                    .max_model_bytes = 2 * one + 10});
  ASSERT_TRUE(store.Create({.name = "a", .num_features = 100}).ok());
  EXPECT_EQ(store.model_bytes(), one);
  ASSERT_TRUE(store.Train("b", std::vector<Moments>(100, {2, 0, 1})).ok());
  EXPECT_EQ(store.model_bytes(), 2 * one);
  // Training a held model never needs more budget.
  ASSERT_TRUE(store.Train("a", std::vector<Moments>(100, {2, 0, 1})).ok());
  for (const absl::Status& refused :
       {store.Create({.name = "c", .num_features = 100}).status(),
        store.Train("c", std::vector<Moments>(100, {2, 0, 1})).status(),
        store.Put(MakeDefaultModel("c", 100), false).status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(refused.message().find("--max_model_bytes"), std::string::npos)
        << refused;
  }
  EXPECT_EQ(store.Get("c").status().code(), absl::StatusCode::kNotFound);
  // Replacing a model is charged the difference.
  EXPECT_TRUE(store.Put(MakeDefaultModel("a", 100), false).ok());
  EXPECT_EQ(store.Put(MakeDefaultModel("a", 101), false).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store.Delete("b").ok());
  EXPECT_EQ(store.model_bytes(), one);
  EXPECT_TRUE(store.Create({.name = "c", .num_features = 100}).ok());
  const absl::Status wide =
      store.Create({.name = "wide", .num_features = 1001}).status();
  EXPECT_EQ(wide.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(wide.message().find("--max_num_features"), std::string::npos);
}

TEST(MessagesTest, NameErrorsShowWholeCharacters) {
  const auto message = [](const std::string& name) {
    return std::string(ValidateModelName(name, "name").message());
  };
  EXPECT_NE(message("caf\xc3\xa9").find("U+00E9 '\xc3\xa9' at byte 3"),
            std::string::npos)
      << message("caf\xc3\xa9");
  EXPECT_NE(message("a\xf0\x9f\x98\x80").find("U+1F600"), std::string::npos);
  EXPECT_NE(message("a\x01").find("U+0001 at byte 1"), std::string::npos)
      << message("a\x01");
  EXPECT_NE(message("a b").find("U+0020 ' '"), std::string::npos);
  EXPECT_NE(message("x\xff").find("byte 0xFF (not UTF-8)"), std::string::npos);
  // An overlong encoding and a lone continuation byte are not UTF-8.
  EXPECT_NE(message("x\xc0\xaf").find("byte 0xC0 (not UTF-8)"),
            std::string::npos);
  EXPECT_NE(message("x\x80").find("byte 0x80 (not UTF-8)"), std::string::npos);
}

TEST(MessagesTest, LongShapesAreAbbreviated) {
  EXPECT_EQ(ShapeString({2, 3, 4}), "[2,3,4]");
  const std::vector<int64_t> tall(100000, 1);
  const std::string shown = ShapeString(tall);
  EXPECT_EQ(shown, "[1,1,1,1,1,1,1,1,...,1,1] (rank 100000)");
}

TEST(EngineLimitsTest, RanksPastTheLimitAreRefusedNamingTheFlag) {
  Engine engine({}, /*max_rank=*/4);
  const std::vector<double> values(1, 1.0);
  FitSpec fit;
  fit.model = "m";
  fit.input = {.dtype = DType::kFloat64,
               .shape = {1, 1, 1, 1, 1},
               .data = values.data(),
               .size = 1};
  const absl::Status status = engine.Fit(fit).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("input.shape: rank 5"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("--max_rank"), std::string::npos);
  NormalizeSpec normalize;
  normalize.input = fit.input;
  normalize.input.shape = {1, 1, 1, 1};
  normalize.weight = AffineParam{.shape = {1, 1, 1, 1, 1}, .values = {1.0}};
  std::vector<double> out(1);
  const absl::Status weight = engine.Normalize(normalize, out.data()).status();
  EXPECT_NE(weight.message().find("weight.shape: rank 5"), std::string::npos)
      << weight;
}

// The Open Inference Protocol's built-in model names: no way of creating a
// store model takes one, and nothing is stored; a recovered model keeps it.
TEST(ReservedNamesTest, NoStoreModelIsCreatedUnderABuiltInName) {
  for (const char* name : {"layer_norm", "rms_norm", "group_norm",
                           "instance_norm", "l2_norm", "weight_norm"}) {
    Engine engine;
    const absl::Status created =
        engine.store().Create({.name = name, .num_features = 2}).status();
    EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << created;
    EXPECT_NE(created.message().find(
                  absl::StrCat("name: \"", name, "\" is reserved")),
              std::string::npos)
        << created;
    EXPECT_EQ(
        engine.store().Put(MakeDefaultModel(name, 2), false).status().code(),
        absl::StatusCode::kInvalidArgument);
    const std::vector<double> values = {1, 2, 3, 4};
    FitSpec fit;
    fit.model = name;
    fit.input = {.dtype = DType::kFloat64,
                 .shape = {2, 2},
                 .data = values.data(),
                 .size = 4};
    const absl::Status fitted = engine.Fit(fit).status();
    EXPECT_EQ(fitted.code(), absl::StatusCode::kInvalidArgument) << fitted;
    EXPECT_NE(fitted.message().find("model: \""), std::string::npos) << fitted;
    EXPECT_EQ(engine.store().size(), 0);
    engine.store().Restore(MakeDefaultModel(name, 2));
    EXPECT_TRUE(engine.store().Get(name).ok());
  }
  Engine engine;
  EXPECT_TRUE(engine.store()
                  .Create({.name = "layer_norm.bn1", .num_features = 2})
                  .ok());
}

}  // namespace
}  // namespace normd
