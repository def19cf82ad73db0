// The concurrency proof: 16 threads x 200 Fits on 2 models of a real normd,
// plus readers. No acknowledged update is lost (num_batches_tracked exact),
// and the pooled statistics equal an offline fp64 computation over every
// value sent, whatever order the server applied them in.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/tensor_io.h"
#include "tests/reference.h"
#include "tests/server_process.h"

namespace normd {
namespace {

using ::normd::client::MakeTensor;
using ::normd::client::NormdClient;
using ::normd::testing::RelErr;

constexpr int kWriters = 16;
constexpr int kFitsPerWriter = 200;
constexpr int kReaders = 4;
constexpr int64_t kRows = 8;
constexpr int64_t kChannels = 3;

// The batch writer `w` sends as its fit `i`: deterministic, distinct, with a
// large offset so that a lost or doubled update shows in the statistics.
std::vector<double> Batch(int w, int i) {
  return testing::RandomValues<double>(kRows * kChannels, 1000 * w + i, 1e3 + w,
                                       1.0 + i % 7);
}

std::string ModelOf(int w, int i) { return (w + i) % 2 == 0 ? "even" : "odd"; }

TEST(ConcurrencyTest, ParallelFitsLoseNothingAndPooledStatsAreExact) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(NORMD_BINARY)) << server.log();
  auto client = NormdClient::Connect(server.target());
  // "even" keeps a cumulative average, which is order-independent, so its
  // running statistics can be checked too.
  v1::CreateModelRequest create;
  create.set_name("even");
  create.set_num_features(kChannels);
  create.set_cumulative_average(true);
  ASSERT_TRUE(client->CreateModel(create).ok());

  std::atomic<bool> writers_done = false;
  std::atomic<int> failures = 0;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < kFitsPerWriter; ++i) {
        v1::FitRequest request;
        request.set_model(ModelOf(w, i));
        *request.mutable_input() =
            MakeTensor({kRows, kChannels}, Batch(w, i), v1::FLOAT64);
        if (!client->Fit(request).ok()) ++failures;
      }
    });
  }
  std::vector<std::thread> readers;
  std::atomic<int> reads = 0;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&, r] {
      uint64_t last_generation = 0;
      const std::string name = r % 2 == 0 ? "even" : "odd";
      while (!writers_done) {
        auto model = client->GetModel(name);
        if (!model.ok()) continue;  // "odd" may not exist yet.
        ++reads;
        // Every change is one training step: generation and counter agree,
        // and never go back.
        const uint64_t created_at = 1;
        if (model->generation() !=
                created_at +
                    static_cast<uint64_t>(model->num_batches_tracked()) ||
            model->generation() < last_generation ||
            model->sample_count() != kRows * model->num_batches_tracked()) {
          ++failures;
        }
        last_generation = model->generation();
        if (!client->ListModels().ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  writers_done = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_GT(reads, 0);

  // Offline fp64 reference over every value each model received.
  for (const std::string name : {"even", "odd"}) {
    SCOPED_TRACE(name);
    std::vector<double> all;
    std::vector<testing::RefStats> batches;
    for (int w = 0; w < kWriters; ++w) {
      for (int i = 0; i < kFitsPerWriter; ++i) {
        if (ModelOf(w, i) != name) continue;
        const std::vector<double> batch = Batch(w, i);
        all.insert(all.end(), batch.begin(), batch.end());
        batches.push_back(
            testing::ReferenceChannelStats(batch, kRows, kChannels, 1));
      }
    }
    const int64_t fits = static_cast<int64_t>(batches.size());
    const auto pooled = testing::ReferenceChannelStats(
        all, static_cast<int64_t>(all.size()) / kChannels, kChannels, 1);
    auto model = client->GetModel(name);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(model->num_batches_tracked(), fits);
    EXPECT_EQ(model->sample_count(), fits * kRows);
    EXPECT_EQ(model->generation(), static_cast<uint64_t>(fits) + 1);
    for (int c = 0; c < kChannels; ++c) {
      EXPECT_LE(RelErr(model->mean(c), pooled.mean[c]), 1e-12);
      EXPECT_LE(RelErr(model->var(c), pooled.var[c]), 1e-12);
    }
    if (name == "even") {
      // Cumulative average = the mean of the batch means / unbiased vars.
      for (int c = 0; c < kChannels; ++c) {
        long double mean_sum = 0, var_sum = 0;
        for (const auto& b : batches) {
          mean_sum += b.mean[c];
          var_sum += b.var[c] * kRows / (kRows - 1);
        }
        EXPECT_LE(RelErr(model->running_mean(c),
                         static_cast<double>(mean_sum / fits)),
                  1e-12);
        EXPECT_LE(
            RelErr(model->running_var(c), static_cast<double>(var_sum / fits)),
            1e-12);
      }
    }
  }
  client.reset();  // An idle sync client would not ack the GOAWAY ping.
  EXPECT_EQ(server.Stop(), 0);
}

}  // namespace
}  // namespace normd
