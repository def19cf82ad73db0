// The reply budget of the model calls: ImportModel and MergeModel whose
// reply (the model with its six arrays of C doubles) would pass
// --max_message_bytes are refused with RESOURCE_EXHAUSTED before anything
// changes, even when what they were sent is small (a state with two
// arrays); under the budget the same calls go through.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/service/service.h"
#include "tests/testing/service_stack.h"

namespace normd {
namespace {

using testing::ServiceStack;
using testing::ServiceStackOptions;

// A received state of `channels` channels with running statistics only.
ModelStateSpec RunningStatsOnly(const std::string& name, int64_t channels) {
  ModelStateSpec state;
  state.config.name = name;
  state.config.num_features = channels;
  state.config.running_mean.assign(channels, 0.5);
  state.config.running_var.assign(channels, 2.0);
  state.config.num_batches_tracked = 3;
  return state;
}

// 1000 channels: a reply of about 6 x 8 x 1000 = 48 KB against a 20 KB
// budget (the two arrays sent are 16 KB).
constexpr int64_t kChannels = 1000;
constexpr int64_t kBudget = 20000;

TEST(ReplyBudgetTest, ImportWhoseReplyIsTooLargeChangesNothing) {
  ServiceStack stack(ServiceStackOptions{.max_message_bytes = kBudget});
  absl::StatusOr<BatchNormModel> refused = stack.service.ImportModel(
      RunningStatsOnly("wide", kChannels), "", /*create_only=*/false);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  EXPECT_NE(refused.status().message().find("--max_message_bytes = 20000"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("refused before anything was "
                                            "changed"),
            std::string::npos);
  EXPECT_TRUE(stack.service.ListModels().empty());
  // Within the budget: imported as sent.
  ServiceStack roomy(ServiceStackOptions{.max_message_bytes = 100000});
  absl::StatusOr<BatchNormModel> imported = roomy.service.ImportModel(
      RunningStatsOnly("wide", kChannels), "", /*create_only=*/false);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->running_var[kChannels - 1], 2.0);
  EXPECT_EQ(imported->num_batches_tracked, 3);
}

TEST(ReplyBudgetTest, MergeWhoseReplyIsTooLargeChangesNothing) {
  ServiceStack stack(ServiceStackOptions{.max_message_bytes = kBudget});
  // The target model, put in the store directly (a create through the
  // service would be refused the same way).
  ASSERT_TRUE(stack.engine.store()
                  .Create(ModelSpec{.name = "m", .num_features = kChannels})
                  .ok());
  const BatchNormModel before = *stack.service.GetModel("m");
  absl::StatusOr<BatchNormModel> refused =
      stack.service.MergeModel("m", RunningStatsOnly("part", kChannels));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  const BatchNormModel after = *stack.service.GetModel("m");
  EXPECT_EQ(after.generation, before.generation);
  EXPECT_EQ(after.num_batches_tracked, before.num_batches_tracked);
  EXPECT_EQ(after.running_var, before.running_var);
}

}  // namespace
}  // namespace normd
