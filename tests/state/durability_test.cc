// Durable state end to end: a real normd with --state_dir is killed with
// SIGKILL during a storm of Fits from 16 clients and restarted on the same
// directory. Every acknowledged Fit is in the recovered state, and the state
// equals an fp64 replay of a prefix of the order the server applied the Fits
// in (observed through the `generation` each acknowledgement carries), the
// prefix completed only by Fits that were in flight at the kill. A damaged
// state directory stops start-up with an error naming the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/tensor_io.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "tests/testing/reference.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"

namespace normd {
namespace {

namespace fs = std::filesystem;
using ::normd::client::MakeTensor;
using ::normd::client::NormdClient;
using ::normd::testing::RelErr;

constexpr int kClients = 16;
constexpr int kModels = 4;
constexpr int64_t kRows = 6;
constexpr int64_t kChannels = 5;
constexpr double kMomentum = 0.1;

std::string FreshDir(const std::string& name) {
  return testing::FreshTempDir("normd_durability", name);
}

std::vector<double> Batch(int client, int i) {
  return testing::RandomValues<double>(kRows * kChannels, 7919 * client + i,
                                       100.0 * (client % kModels), 1.0 + i % 5);
}

std::string ModelName(int k) { return "model-" + std::to_string(k); }

// What the clients saw: per model, acknowledged batches by the generation
// their acknowledgement reported, and batches whose call failed (they may or
// may not have been applied).
struct Observed {
  std::mutex mu;
  std::map<std::string, std::map<uint64_t, std::vector<double>>> acked;
  std::map<std::string, std::vector<std::vector<double>>> in_flight;
  std::atomic<int> acks = 0;
};

// Fits from kClients threads until the first failure of each.
std::vector<std::thread> StartStorm(const std::string& target,
                                    Observed& observed) {
  std::vector<std::thread> threads;
  for (int t = 0; t < kClients; ++t) {
    threads.emplace_back([&observed, target, t] {
      auto client = NormdClient::Connect(target);
      const std::string model = ModelName(t % kModels);
      for (int i = 0;; ++i) {
        v1::FitRequest request;
        request.set_model(model);
        const std::vector<double> batch = Batch(t, i);
        *request.mutable_input() =
            MakeTensor({kRows, kChannels}, batch, v1::FLOAT64);
        auto response = client->Fit(request);
        std::lock_guard<std::mutex> lock(observed.mu);
        if (!response.ok()) {
          observed.in_flight[model].push_back(batch);
          return;
        }
        observed.acked[model][response->model().generation()] = batch;
        ++observed.acks;
      }
    });
  }
  return threads;
}

bool Matches(const v1::ModelState& state,
             const std::vector<std::vector<double>>& order) {
  const auto running =
      testing::ReferenceRunningStats(order, kRows, kChannels, kMomentum);
  std::vector<double> all;
  for (const auto& b : order) all.insert(all.end(), b.begin(), b.end());
  const auto pooled = testing::ReferenceChannelStats(
      all, static_cast<int64_t>(order.size()) * kRows, kChannels, 1);
  // Errors relative to the data's scale, not to the value: model-0's data is
  // centred on 0, and its pooled mean can land within 1e-5 of 0 (where fp64
  // rounding of 3e-17 is a 1e-12 relative error) once in a few hundred
  // storms. The batches' standard deviations are at least 1; a replay in the
  // core of 450-650 batches lands within 3e-15 of the reference on this
  // scale.
  constexpr double kScale = 1.0;
  for (int c = 0; c < kChannels; ++c) {
    if (RelErr(state.running_mean(c), running.mean[c], kScale) > 1e-12 ||
        RelErr(state.running_var(c), running.var[c], kScale) > 1e-12 ||
        RelErr(state.mean(c), pooled.mean[c], kScale) > 1e-12 ||
        RelErr(state.var(c), pooled.var[c], kScale) > 1e-12) {
      return false;
    }
  }
  return true;
}

// True if `state` is the replay of some prefix of the applied order: the
// acknowledged batches at the positions their generations name, the other
// positions filled by distinct in-flight batches.
bool IsReplayOfAPrefix(const v1::ModelState& state,
                       const std::map<uint64_t, std::vector<double>>& acked,
                       const std::vector<std::vector<double>>& in_flight) {
  const uint64_t steps = state.generation() - 1;  // Created at generation 1.
  if (state.num_batches_tracked() != static_cast<int64_t>(steps) ||
      state.sample_count() != static_cast<int64_t>(steps) * kRows) {
    return false;
  }
  std::vector<uint64_t> gaps;
  for (uint64_t g = 2; g <= steps + 1; ++g) {
    if (!acked.contains(g)) gaps.push_back(g);
  }
  if (gaps.size() > in_flight.size()) return false;
  // Try every assignment of in-flight batches to the gaps (a handful).
  std::vector<int> pick(in_flight.size());
  for (size_t i = 0; i < pick.size(); ++i) pick[i] = static_cast<int>(i);
  do {
    std::vector<std::vector<double>> order;
    size_t next_gap = 0;
    for (uint64_t g = 2; g <= steps + 1; ++g) {
      auto it = acked.find(g);
      order.push_back(it != acked.end() ? it->second
                                        : in_flight[pick[next_gap++]]);
    }
    if (Matches(state, order)) return true;
  } while (std::next_permutation(pick.begin(), pick.end()));
  return false;
}

// One storm from kClients clients into a fresh normd on `dir`, SIGKILL,
// restart on `dir`, check every model.
void KillDuringStormAndCheck(const std::string& dir) {
  Observed observed;
  {
    testing::ServerProcess server;
    ASSERT_TRUE(server.Start(
        NORMD_BINARY, {"--state_dir=" + dir, "--snapshot_log_bytes=65536"}))
        << server.log();
    std::vector<std::thread> storm = StartStorm(server.target(), observed);
    // Long enough for several snapshots and log rotations.
    for (int i = 0; i < 600 && observed.acks < 2000; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(server.Stop(SIGKILL), 128 + SIGKILL);
    for (auto& t : storm) t.join();
  }
  ASSERT_GE(observed.acks, 1000);
  testing::ServerProcess restarted;
  ASSERT_TRUE(restarted.Start(NORMD_BINARY, {"--state_dir=" + dir}))
      << restarted.log();
  auto client = NormdClient::Connect(restarted.target());
  int in_flight_applied = 0;
  for (int k = 0; k < kModels; ++k) {
    const std::string name = ModelName(k);
    SCOPED_TRACE(name);
    auto state = client->GetModel(name);
    ASSERT_TRUE(state.ok()) << state.status();
    const auto& acked = observed.acked[name];
    ASSERT_FALSE(acked.empty());
    // Every acknowledged Fit is in the state...
    EXPECT_GE(state->generation(), acked.rbegin()->first);
    in_flight_applied +=
        static_cast<int>(state->generation() - 1 - acked.size());
    // ...which is exactly a replay of a prefix of the applied order.
    EXPECT_TRUE(IsReplayOfAPrefix(*state, acked, observed.in_flight[name]));
  }
  std::cout << "acknowledged Fits: " << observed.acks
            << ", in-flight Fits found applied after the kill: "
            << in_flight_applied << "\n";
  client.reset();
  EXPECT_EQ(restarted.Stop(), 0);
}

// Three rounds: where the kill lands is luck, and a bug may need a few.
TEST(DurabilityTest, KillDuringFitStormLosesNoAcknowledgedFit) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    KillDuringStormAndCheck(FreshDir("kill" + std::to_string(round)));
  }
}

TEST(DurabilityTest, GracefulRestartKeepsEverything) {
  const std::string dir = FreshDir("graceful");
  std::optional<v1::ModelState> before;
  {
    testing::ServerProcess server;
    ASSERT_TRUE(server.Start(NORMD_BINARY, {"--state_dir=" + dir}))
        << server.log();
    auto client = NormdClient::Connect(server.target());
    v1::CreateModelRequest create;
    create.set_name("kept");
    create.set_num_features(kChannels);
    create.set_cumulative_average(true);
    ASSERT_TRUE(client->CreateModel(create).ok());
    for (int i = 0; i < 5; ++i) {
      v1::FitRequest fit;
      fit.set_model("kept");
      *fit.mutable_input() =
          MakeTensor({kRows, kChannels}, Batch(0, i), v1::FLOAT64);
      ASSERT_TRUE(client->Fit(fit).ok());
    }
    v1::FitRequest other;
    other.set_model("deleted");
    *other.mutable_input() =
        MakeTensor({kRows, kChannels}, Batch(1, 0), v1::FLOAT64);
    ASSERT_TRUE(client->Fit(other).ok());
    ASSERT_TRUE(client->DeleteModel("deleted").ok());
    // Training steps on a NormalizeStream are answered once durable.
    std::vector<v1::NormalizeRequest> steps(2);
    for (int i = 0; i < 2; ++i) {
      steps[i].set_mode(v1::BATCH_NORM);
      steps[i].set_model("streamed");
      steps[i].set_training(true);
      *steps[i].mutable_input() =
          MakeTensor({kRows, kChannels}, Batch(2, i), v1::FLOAT64);
    }
    auto streamed = client->NormalizeStream(steps);
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    ASSERT_EQ(streamed->size(), 2u);
    EXPECT_FALSE((*streamed)[1].has_error());
    EXPECT_EQ((*streamed)[1].model().num_batches_tracked(), 2);
    auto state = client->GetModel("kept");
    ASSERT_TRUE(state.ok());
    before = *state;
    client.reset();
    EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
  }
  testing::ServerProcess restarted;
  ASSERT_TRUE(restarted.Start(NORMD_BINARY, {"--state_dir=" + dir}))
      << restarted.log();
  // The final snapshot holds everything: nothing left to replay.
  EXPECT_NE(restarted.log().find("2 models recovered"), std::string::npos)
      << restarted.log();
  EXPECT_NE(restarted.log().find("+ 0 log records"), std::string::npos)
      << restarted.log();
  auto client = NormdClient::Connect(restarted.target());
  auto after = client->GetModel("kept");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->SerializeAsString(), before->SerializeAsString());
  EXPECT_EQ(client->GetModel("deleted").status().code(),
            absl::StatusCode::kNotFound);
  auto streamed = client->GetModel("streamed");
  ASSERT_TRUE(streamed.ok());
  EXPECT_EQ(streamed->num_batches_tracked(), 2);
  client.reset();
  EXPECT_EQ(restarted.Stop(), 0);
}

// A full disk: the log segment normd moves to next is /dev/full. The Fit
// before is acknowledged and kept; then health turns NOT_SERVING, changes get
// UNAVAILABLE, reads still work, and normd_state_writable drops to 0.
TEST(DurabilityTest, FullDiskTakesTheServerOutOfServiceAndKeepsItsState) {
  const std::string dir = FreshDir("full");
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(NORMD_BINARY,
                           {"--state_dir=" + dir, "--snapshot_log_bytes=1"}))
      << server.log();
  // Records 1 and 2 are the model's creation and its step; whichever way the
  // snapshots they trigger interleave with them, the segment after record 2
  // is segment 3, and the step is durable (and acknowledged) before it.
  const std::string next = dir + "/wal-00000000000000000003.log";
  fs::create_symlink("/dev/full", next);
  auto client = NormdClient::Connect(server.target());
  v1::FitRequest fit;
  fit.set_model("kept");
  *fit.mutable_input() =
      MakeTensor({kRows, kChannels}, Batch(0, 0), v1::FLOAT64);
  ASSERT_TRUE(client->Fit(fit).ok());
  auto health = client->Health();
  for (int i = 0; i < 100 && health.ok() &&
                  *health == grpc::health::v1::HealthCheckResponse::SERVING;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    health = client->Health();
  }
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  const absl::Status refused = client->Fit(fit).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  auto state = client->GetModel("kept");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->num_batches_tracked(), 1);
  EXPECT_NE(testing::HttpGet(server.metrics_port(), "/metrics")
                .find("normd_state_writable 0"),
            std::string::npos);
  EXPECT_NE(server.log().find("NOT_SERVING"), std::string::npos)
      << server.log();
  // The Open Inference Protocol says the same: REST ready is 503 (live
  // stays 200) and gRPC ServerReady false...
  const std::string ready =
      testing::HttpGetResponse(server.http_port(), "/v2/health/ready");
  EXPECT_NE(ready.find(" 503 "), std::string::npos) << ready;
  const std::string live =
      testing::HttpGetResponse(server.http_port(), "/v2/health/live");
  EXPECT_NE(live.find(" 200 "), std::string::npos) << live;
  auto oip = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    inference::ServerReadyResponse response;
    ASSERT_TRUE(
        oip->ServerReady(&context, inference::ServerReadyRequest(), &response)
            .ok());
    EXPECT_FALSE(response.ready());
  }
  // ... while what needs no disk is still served: LayerNorm and reads.
  v1::NormalizeRequest layer_norm;
  layer_norm.set_mode(v1::LAYER_NORM);
  *layer_norm.mutable_input() = MakeTensor({1, 2}, {1.0, 3.0}, v1::FLOAT64);
  absl::StatusOr<v1::NormalizeResponse> normalized =
      client->Normalize(layer_norm);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  double y[2];
  std::memcpy(y, normalized->output().data().data(), sizeof(y));
  EXPECT_NEAR(y[0], -1 / std::sqrt(1 + 1e-5), 1e-15);  // Hand-worked.
  client.reset();
  EXPECT_EQ(server.Stop(SIGKILL), 128 + SIGKILL);

  fs::remove(next);
  testing::ServerProcess restarted;
  ASSERT_TRUE(restarted.Start(NORMD_BINARY, {"--state_dir=" + dir}))
      << restarted.log();
  auto after = NormdClient::Connect(restarted.target())->GetModel("kept");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->num_batches_tracked(), 1);
}

TEST(DurabilityTest, DamagedStateStopsStartUpNamingTheFile) {
  const std::string dir = FreshDir("damaged");
  {
    testing::ServerProcess server;
    ASSERT_TRUE(server.Start(NORMD_BINARY, {"--state_dir=" + dir}));
    auto client = NormdClient::Connect(server.target());
    v1::FitRequest fit;
    fit.set_model("m");
    *fit.mutable_input() =
        MakeTensor({kRows, kChannels}, Batch(0, 0), v1::FLOAT64);
    ASSERT_TRUE(client->Fit(fit).ok());
    client.reset();
    EXPECT_EQ(server.Stop(SIGTERM), 0);
  }
  std::string snapshot;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".snap") snapshot = e.path().string();
  }
  ASSERT_FALSE(snapshot.empty());
  {
    std::fstream f(snapshot, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('\x7f');
  }
  testing::ServerProcess server;
  EXPECT_FALSE(server.Start(NORMD_BINARY, {"--state_dir=" + dir}));
  EXPECT_NE(server.log().find(snapshot), std::string::npos) << server.log();
  EXPECT_NE(server.log().find("corrupt"), std::string::npos) << server.log();
}

// docs/reliability.md: a restart with a smaller --max_model_bytes keeps
// every recovered model, logs a warning, and refuses new models until
// enough are deleted.
TEST(DurabilityTest, RestartUnderASmallerModelBudgetKeepsEveryModel) {
  const std::string dir = FreshDir("smaller_budget");
  constexpr int kHeld = 5;
  constexpr int64_t kWide = 1000;  // About 56 KB charged per model.
  auto create = [](NormdClient& client, const std::string& name) {
    v1::CreateModelRequest request;
    request.set_name(name);
    request.set_num_features(kWide);
    return client.CreateModel(request).status();
  };
  {
    testing::ServerProcess server;
    ASSERT_TRUE(server.Start(NORMD_BINARY, {"--state_dir=" + dir}));
    auto client = NormdClient::Connect(server.target());
    for (int k = 0; k < kHeld; ++k) {
      ASSERT_TRUE(create(*client, ModelName(k)).ok());
    }
    client.reset();
    EXPECT_EQ(server.Stop(SIGTERM), 0);
  }
  // A budget of about two of them.
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(NORMD_BINARY,
                           {"--state_dir=" + dir, "--max_model_bytes=120000"}))
      << server.log();
  EXPECT_NE(server.log().find("more than --max_model_bytes = 120000"),
            std::string::npos)
      << server.log();
  auto client = NormdClient::Connect(server.target());
  absl::StatusOr<v1::ListModelsResponse> list = client->ListModels();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->models_size(), kHeld);
  for (int k = 0; k < kHeld; ++k) {
    absl::StatusOr<v1::ModelState> model = client->GetModel(ModelName(k));
    EXPECT_TRUE(model.ok() && model->num_features() == kWide) << k;
  }
  const absl::Status refused = create(*client, "one-more");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("--max_model_bytes"), std::string::npos)
      << refused;
  // Fits on held models go on (they were charged when created).
  v1::FitRequest fit;
  fit.set_model(ModelName(0));
  *fit.mutable_input() = MakeTensor(
      {2, kWide}, testing::RandomValues<double>(2 * kWide, 3), v1::FLOAT64);
  EXPECT_TRUE(client->Fit(fit).ok());
  // Below the budget again, a model can be created.
  for (int k = 1; k < kHeld; ++k) {
    ASSERT_TRUE(client->DeleteModel(ModelName(k)).ok());
  }
  EXPECT_TRUE(create(*client, "one-more").ok());
  client.reset();
  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace normd
