// ModelStore::CreateAll, the core of CreateModels and of normctl
// import-checkpoint: every model is created, exactly as CreateModel would
// make it, in one log record, or none is, whatever is wrong and wherever in
// the set it is.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/core/model.h"
#include "server/core/model_store.h"
#include "server/core/mutation_log.h"

namespace normd {
namespace {

// Keeps what a store logs: each record's kind and the names it creates.
class RecordingLog final : public MutationLog {
 public:
  absl::Status Healthy() override { return absl::OkStatus(); }
  uint64_t Append(const Mutation& mutation) override {
    kinds.push_back(mutation.kind);
    std::vector<std::string> names;
    for (const BatchNormModel& model : mutation.models) {
      names.push_back(model.name);
    }
    created.push_back(names);
    return kinds.size();
  }
  absl::Status WaitDurable(uint64_t) override { return absl::OkStatus(); }
  void OnDurable(uint64_t, std::function<void(absl::Status)> done) override {
    done(absl::OkStatus());
  }
  std::vector<Mutation::Kind> kinds;
  std::vector<std::vector<std::string>> created;
};

// Three layers as a checkpoint gives them: statistics, affine and counter.
std::vector<ModelSpec> ThreeLayers() {
  return {
      {.name = "net.bn1",
       .num_features = 2,
       .momentum = 0.01,
       .eps = 1e-3,
       .running_mean = {0.5, -0.25},
       .running_var = {2.0, 0.125},
       .weight = {1.5, 0.75},
       .bias = {0.0, 1.0},
       .num_batches_tracked = 7},
      {.name = "net.layer1.0.bn1",
       .num_features = 3,
       .cumulative_average = true,
       .running_mean = {1, 2, 3},
       .running_var = {4, 5, 6}},
      {.name = "net.head.bn", .num_features = 1},
  };
}

TEST(CreateAllTest, CreatesEveryModelAsCreateWouldInOneRecord) {
  ModelStore store;
  RecordingLog log;
  store.SetMutationLog(&log);
  const std::vector<ModelSpec> specs = ThreeLayers();
  absl::StatusOr<std::vector<BatchNormModel>> created = store.CreateAll(specs);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_EQ(created->size(), 3u);
  ASSERT_EQ(log.kinds, std::vector<Mutation::Kind>{Mutation::Kind::kCreateAll});
  EXPECT_EQ(log.created[0], (std::vector<std::string>{
                                "net.bn1", "net.layer1.0.bn1", "net.head.bn"}));
  // Each equals what Create makes of its spec alone, on a store of its own.
  for (size_t i = 0; i < specs.size(); ++i) {
    ModelStore alone;
    absl::StatusOr<BatchNormModel> expected = alone.Create(specs[i]);
    ASSERT_TRUE(expected.ok()) << expected.status();
    absl::StatusOr<BatchNormModel> held = store.Get(specs[i].name);
    ASSERT_TRUE(held.ok()) << held.status();
    for (const BatchNormModel* model : {&(*created)[i], &*held}) {
      EXPECT_EQ(model->name, expected->name);
      EXPECT_EQ(model->num_features, expected->num_features);
      EXPECT_EQ(model->momentum, expected->momentum);
      EXPECT_EQ(model->cumulative_average, expected->cumulative_average);
      EXPECT_EQ(model->eps, expected->eps);
      EXPECT_EQ(model->running_mean, expected->running_mean);
      EXPECT_EQ(model->running_var, expected->running_var);
      EXPECT_EQ(model->weight, expected->weight);
      EXPECT_EQ(model->bias, expected->bias);
      EXPECT_EQ(model->num_batches_tracked, expected->num_batches_tracked);
      EXPECT_EQ(model->generation, 1u);
    }
  }
  // Hand-checked: the first layer's defaults were overridden, the third's
  // are PyTorch's.
  EXPECT_EQ(store.Get("net.head.bn")->running_var, std::vector<double>{1.0});
  EXPECT_EQ(store.Get("net.bn1")->momentum, 0.01);
  EXPECT_EQ(store.model_bytes(), ModelFootprintBytes(2, 7) +
                                     ModelFootprintBytes(3, 16) +
                                     ModelFootprintBytes(1, 11));
}

struct RefusedCase {
  std::string what;
  std::function<void(std::vector<ModelSpec>&)> spoil;
  absl::StatusCode code;
  std::string message_start;  // The field it names.
  std::string mentions;       // The model, the layer or the flag.
};

// Whatever is wrong, wherever: the error names it, and nothing is created,
// logged or charged.
TEST(CreateAllTest, AnyProblemCreatesNothing) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<RefusedCase> cases = {
      {"no models", [](auto& s) { s.clear(); },
       absl::StatusCode::kInvalidArgument, "models:", "at least one"},
      {"negative variance in the last",
       [](auto& s) { s[2].running_var = {-1.0}; },
       absl::StatusCode::kInvalidArgument, "models[2].running_var",
       "net.head.bn"},
      {"NaN mean in the second", [nan](auto& s) { s[1].running_mean[1] = nan; },
       absl::StatusCode::kInvalidArgument, "models[1].running_mean",
       "net.layer1.0.bn1"},
      {"arrays disagree on C",
       [](auto& s) {
         s[0].weight = {1, 2, 3};
       },
       absl::StatusCode::kInvalidArgument, "models[0].weight", "net.bn1"},
      {"bad name", [](auto& s) { s[1].name = "net.layer 1"; },
       absl::StatusCode::kInvalidArgument, "models[1].name", "net.layer 1"},
      {"built-in name", [](auto& s) { s[1].name = "layer_norm"; },
       absl::StatusCode::kInvalidArgument, "models[1].name", "layer_norm"},
      {"a name twice", [](auto& s) { s[2].name = "net.bn1"; },
       absl::StatusCode::kInvalidArgument, "models[2].name", "twice"},
      {"momentum out of range", [](auto& s) { s[0].momentum = 1.5; },
       absl::StatusCode::kInvalidArgument, "models[0].momentum", "net.bn1"},
      {"an existing name", [](auto& s) { s[1].name = "held"; },
       absl::StatusCode::kAlreadyExists, "models[1].name", "'held'"},
      {"wider than --max_num_features",
       [](auto& s) { s[2].num_features = 1001; },
       absl::StatusCode::kResourceExhausted, "models[2].num_features",
       "--max_num_features"},
      {"past --max_model_bytes together",
       [](auto& s) {
         for (int i = 0; i < 3; ++i) {
           s[i] = {.name = "wide" + std::to_string(i), .num_features = 1000};
         }
       },
       absl::StatusCode::kResourceExhausted, "models:", "--max_model_bytes"},
      {"past --max_models together",
       [](auto& s) {
         for (int i = 3; i < 10; ++i) {
           s.push_back({.name = "more" + std::to_string(i), .num_features = 1});
         }
       },
       absl::StatusCode::kResourceExhausted, "model:", "--max_models"},
  };
  for (const RefusedCase& c : cases) {
    SCOPED_TRACE(c.what);
    ModelStore store({.max_models = 8,
                      .max_num_features = 1000,
                      .max_model_bytes = 2 * ModelFootprintBytes(1000, 5)});
    ASSERT_TRUE(store.Create({.name = "held", .num_features = 2}).ok());
    RecordingLog log;
    store.SetMutationLog(&log);
    const int64_t bytes = store.model_bytes();
    std::vector<ModelSpec> specs = ThreeLayers();
    c.spoil(specs);
    const absl::Status status = store.CreateAll(specs).status();
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_EQ(status.message().substr(0, c.message_start.size()),
              c.message_start)
        << status;
    EXPECT_NE(status.message().find(c.mentions), std::string::npos) << status;
    EXPECT_EQ(store.size(), 1);
    EXPECT_EQ(store.model_bytes(), bytes);
    EXPECT_TRUE(log.kinds.empty());
  }
}

// --max_models=0, a replica for the stateless modes: nothing is created,
// and the message says why.
TEST(CreateAllTest, NoModelsAtAllSaysTheReplicaKeepsNone) {
  ModelStore store({.max_models = 0});
  const absl::Status one =
      store.Create({.name = "m", .num_features = 2}).status();
  EXPECT_EQ(one.code(), absl::StatusCode::kResourceExhausted) << one;
  EXPECT_NE(one.message().find("keeps no BatchNorm models (--max_models=0"),
            std::string::npos)
      << one;
  EXPECT_EQ(store.CreateAll(ThreeLayers()).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.size(), 0);
}

// A malformed model is reported before a limit, wherever the two are.
TEST(CreateAllTest, MalformedIsReportedBeforeALimit) {
  ModelStore store({.max_num_features = 10});
  std::vector<ModelSpec> specs = ThreeLayers();
  specs[0].num_features = 11;
  specs[0].running_mean = specs[0].running_var = specs[0].weight =
      specs[0].bias = {};
  specs[2].eps = 0.0;
  const absl::Status status = store.CreateAll(specs).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message().substr(0, 13), "models[2].eps") << status;
}

}  // namespace
}  // namespace normd
