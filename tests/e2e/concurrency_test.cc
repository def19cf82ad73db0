// The concurrency proof: 64 client threads x 500 requests against a real
// normd (with durable state), mixing Fit, training Normalize, eval Normalize
// and GetModel on 8 models with Fit, Reset and Delete of other models.
//  * No acknowledged update is lost or doubled: every model's
//    num_batches_tracked equals the updates acknowledged for it, and the
//    generations the acknowledgements carried are exactly 2..n+1.
//  * The pooled statistics equal an offline fp64 computation over every value
//    sent (within 1e-12 relative), whatever order the server applied them in.
//  * The running statistics equal a serial fp64 replay of the batches in the
//    order the server applied them, which the generations make observable.
//  * A restart on the state directory recovers exactly the same models.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/tensor_io.h"
#include "tests/testing/reference.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"

namespace normd {
namespace {

using ::normd::client::MakeTensor;
using ::normd::client::NormdClient;
using ::normd::testing::RelErr;

constexpr int kThreads = 64;
constexpr int kRequestsPerThread = 500;
constexpr int kModels = 8;
constexpr int64_t kRows = 4;
constexpr int64_t kChannels = 3;
constexpr double kMomentum = 0.1;

std::string Tracked(int k) { return "tracked-" + std::to_string(k); }
std::string Other(int k) { return "other-" + std::to_string(k); }

// Deterministic, distinct batches with a large offset, so that a lost or
// doubled update shows in the statistics.
std::vector<double> Batch(int thread, int i) {
  return testing::RandomValues<double>(kRows * kChannels, 100003 * thread + i,
                                       1e3 + thread, 1.0 + i % 7);
}

// Updates acknowledged for one model: batch by the generation it produced.
struct Applied {
  std::mutex mu;
  std::map<std::string, std::map<uint64_t, std::vector<double>>> by_model;
  std::atomic<int> duplicate_generations = 0;

  void Record(const v1::ModelState& state, std::vector<double> batch) {
    std::lock_guard<std::mutex> lock(mu);
    if (!by_model[state.name()]
             .emplace(state.generation(), std::move(batch))
             .second) {
      ++duplicate_generations;
    }
  }
};

std::map<std::string, std::string> Fingerprint(NormdClient& client) {
  std::map<std::string, std::string> out;
  auto list = client.ListModels();
  EXPECT_TRUE(list.ok());
  for (const auto& m : list->models()) {
    auto full = client.GetModel(m.name());
    EXPECT_TRUE(full.ok());
    out[m.name()] = full->SerializeAsString();
  }
  return out;
}

// The first failure of any thread, and how many there were.
struct Failures {
  std::mutex mu;
  std::atomic<int> count = 0;
  std::string first;

  void Add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (count++ == 0) first = what;
  }
};

// Thread t's request i: 4 in 10 a Fit of a tracked model, 2 a training
// Normalize of one, 1 an eval Normalize, 1 a GetModel, 1 a Fit of another
// model (created on first use), 1 a Reset or Delete of another model.
void SendMixedRequest(NormdClient& client, int t, int i, Applied& applied,
                      Failures& failures) {
  const std::string model = Tracked((t + i) % kModels);
  const std::vector<double> batch = Batch(t, i);
  switch (i % 10) {
    case 0:
    case 1:
    case 2:
    case 3: {  // Fit.
      v1::FitRequest fit;
      fit.set_model(model);
      *fit.mutable_input() = MakeTensor({kRows, kChannels}, batch, v1::FLOAT64);
      auto response = client.Fit(fit);
      if (!response.ok()) {
        failures.Add("Fit: " + response.status().ToString());
      } else {
        applied.Record(response->model(), batch);
      }
      break;
    }
    case 4:
    case 5: {  // Training Normalize.
      v1::NormalizeRequest train;
      train.set_mode(v1::BATCH_NORM);
      train.set_model(model);
      train.set_training(true);
      *train.mutable_input() =
          MakeTensor({kRows, kChannels}, batch, v1::FLOAT64);
      auto response = client.Normalize(train);
      if (!response.ok()) {
        failures.Add("training: " + response.status().ToString());
      } else {
        applied.Record(response->model(), batch);
      }
      break;
    }
    case 6: {  // Eval Normalize.
      v1::NormalizeRequest eval;
      eval.set_mode(v1::BATCH_NORM);
      eval.set_model(model);
      *eval.mutable_input() =
          MakeTensor({kRows, kChannels}, batch, v1::FLOAT64);
      auto response = client.Normalize(eval);
      if (!response.ok() ||
          response->output().data().size() != batch.size() * 8) {
        failures.Add("eval: " + response.status().ToString());
      }
      break;
    }
    case 7: {  // GetModel: generation and counter agree.
      auto state = client.GetModel(model);
      if (!state.ok() ||
          state->generation() !=
              1 + static_cast<uint64_t>(state->num_batches_tracked())) {
        failures.Add("Get: " + state.status().ToString());
      }
      break;
    }
    case 8: {  // Fit another model (created on first use).
      v1::FitRequest fit;
      fit.set_model(Other(t % 4));
      *fit.mutable_input() = MakeTensor({kRows, kChannels}, batch, v1::FLOAT64);
      auto response = client.Fit(fit);
      if (!response.ok())
        failures.Add("Fit other: " + response.status().ToString());
      break;
    }
    case 9: {  // Reset or Delete another model (it may be gone).
      const absl::Status s = i % 20 == 9
                                 ? client.ResetModel(Other(t % 4)).status()
                                 : client.DeleteModel(Other(t % 4));
      if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
        failures.Add("Reset/Delete other: " + s.ToString());
      }
      break;
    }
  }
}

// Every tracked model against its acknowledged updates: the counters, the
// generations 2..n+1, the pooled statistics against fp64 over every value
// and the running ones against a serial replay in generation order. The
// number of updates acknowledged.
int64_t ExpectEveryModelMatchesItsReplay(NormdClient& client,
                                         Applied& applied) {
  int64_t total_updates = 0;
  for (int k = 0; k < kModels; ++k) {
    const std::string name = Tracked(k);
    SCOPED_TRACE(name);
    const auto& by_generation = applied.by_model[name];
    const auto updates = static_cast<int64_t>(by_generation.size());
    total_updates += updates;
    auto state = client.GetModel(name);
    EXPECT_TRUE(state.ok()) << state.status();
    if (!state.ok() || by_generation.empty()) continue;
    EXPECT_EQ(state->num_batches_tracked(), updates);
    EXPECT_EQ(state->sample_count(), updates * kRows);
    EXPECT_EQ(state->generation(), static_cast<uint64_t>(updates) + 1);
    // The acknowledged generations are exactly 2..n+1: the applied order.
    EXPECT_EQ(by_generation.begin()->first, 2u);
    EXPECT_EQ(by_generation.rbegin()->first,
              static_cast<uint64_t>(updates) + 1);
    std::vector<std::vector<double>> order;
    std::vector<double> all;
    for (const auto& [generation, batch] : by_generation) {
      order.push_back(batch);
      all.insert(all.end(), batch.begin(), batch.end());
    }
    const auto pooled =
        testing::ReferenceChannelStats(all, updates * kRows, kChannels, 1);
    const auto running =
        testing::ReferenceRunningStats(order, kRows, kChannels, kMomentum);
    for (int c = 0; c < kChannels; ++c) {
      EXPECT_LE(RelErr(state->mean(c), pooled.mean[c]), 1e-12);
      EXPECT_LE(RelErr(state->var(c), pooled.var[c]), 1e-12);
      EXPECT_LE(RelErr(state->running_mean(c), running.mean[c]), 1e-12);
      EXPECT_LE(RelErr(state->running_var(c), running.var[c]), 1e-12);
    }
  }
  return total_updates;
}

TEST(ConcurrencyTest, MixedLoadLosesNothingAndMatchesSerialReplay) {
  const std::string dir = testing::FreshTempDir("normd_concurrency", "state");
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(NORMD_BINARY, {"--state_dir=" + dir}))
      << server.log();
  auto setup = NormdClient::Connect(server.target());
  for (int k = 0; k < kModels; ++k) {
    v1::CreateModelRequest create;
    create.set_name(Tracked(k));
    create.set_num_features(kChannels);
    ASSERT_TRUE(setup->CreateModel(create).ok());
  }

  Applied applied;
  Failures failures;
  // Eight threads share each connection, as a client pool would.
  std::vector<std::unique_ptr<NormdClient>> clients;
  for (int c = 0; c < kThreads / 8; ++c) {
    clients.push_back(NormdClient::Connect(server.target()));
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRequestsPerThread; ++i) {
        SendMixedRequest(*clients[t % clients.size()], t, i, applied, failures);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.count, 0) << failures.first;
  EXPECT_EQ(applied.duplicate_generations, 0);
  // 6 of every 10 requests update a tracked model.
  EXPECT_EQ(ExpectEveryModelMatchesItsReplay(*setup, applied),
            kThreads * kRequestsPerThread * 6 / 10);

  // Everything acknowledged is durable: a restart recovers the same models.
  const auto before = Fingerprint(*setup);
  setup.reset();
  clients.clear();
  EXPECT_EQ(server.Stop(SIGKILL), 128 + SIGKILL);
  testing::ServerProcess restarted;
  ASSERT_TRUE(restarted.Start(NORMD_BINARY, {"--state_dir=" + dir}))
      << restarted.log();
  auto client = NormdClient::Connect(restarted.target());
  EXPECT_EQ(Fingerprint(*client), before);
  client.reset();
  EXPECT_EQ(restarted.Stop(), 0);
}

}  // namespace
}  // namespace normd
