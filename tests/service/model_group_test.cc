// A model's group and the service's checks on it: CreateModels routed by a
// group creates only that group's models (and nothing when one is outside),
// without the routing header any names go together, and ListModels by group
// lists exactly the names G and G.<rest>.
#include "server/service/model_group.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "tests/testing/service_stack.h"

namespace normd {
namespace {

using testing::ServiceStack;

ModelSpec Spec(const std::string& name) {
  return ModelSpec{.name = name, .num_features = 2};
}

std::vector<std::string> Names(const std::vector<BatchNormModel>& models) {
  std::vector<std::string> names;
  for (const BatchNormModel& m : models) names.push_back(m.name);
  return names;
}

TEST(ModelGroupTest, GroupIsTheNameUpToTheFirstDot) {
  EXPECT_EQ(ModelGroup("resnet.layer1.0.bn1"), "resnet");
  EXPECT_EQ(ModelGroup("m"), "m");
  EXPECT_EQ(ModelGroup("a-b_c.x"), "a-b_c");
  EXPECT_TRUE(ValidateGroup("resnet", "group").ok());
  EXPECT_EQ(ValidateGroup("a.b", "group").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateGroup("", "group").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelGroupTest, RoutedCreateModelsTakesOneGroupOnly) {
  ServiceStack stack;
  const std::vector<ModelSpec> checkpoint = {Spec("r18.bn1"),
                                             Spec("r18.layer1.0.bn1")};
  ASSERT_TRUE(stack.service.CreateModels(checkpoint, "r18").ok());
  const std::vector<ModelSpec> mixed = {Spec("a.bn1"), Spec("b.bn1")};
  absl::StatusOr<std::vector<BatchNormModel>> refused =
      stack.service.CreateModels(mixed, "a");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("models[1].name: 'b.bn1' is in "
                                            "group 'b'"),
            std::string::npos)
      << refused.status();
  // All or nothing: a.bn1 was not created either.
  EXPECT_EQ(Names(stack.service.ListModels()),
            (std::vector<std::string>{"r18.bn1", "r18.layer1.0.bn1"}));
  // A routing header that is not a group is refused, naming the header.
  absl::StatusOr<std::vector<BatchNormModel>> bad_header =
      stack.service.CreateModels(checkpoint, "r18.bn1");
  EXPECT_EQ(bad_header.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_header.status().message().find(kRoutingGroupHeader),
            std::string::npos);
  // Straight to one replica (no header): several groups in one call.
  EXPECT_TRUE(stack.service.CreateModels(mixed, std::nullopt).ok());
}

TEST(ModelGroupTest, ListModelsByGroupListsThatGroupOnly) {
  ServiceStack stack;
  for (const char* name : {"p", "p.bn1", "p.layer.bn2", "pp.bn1", "q.p"}) {
    ASSERT_TRUE(stack.service.CreateModel(Spec(name)).ok()) << name;
  }
  absl::StatusOr<std::vector<BatchNormModel>> group =
      stack.service.ListModels("p");
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(Names(*group),
            (std::vector<std::string>{"p", "p.bn1", "p.layer.bn2"}));
  absl::StatusOr<std::vector<BatchNormModel>> all =
      stack.service.ListModels("");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 5u);
  EXPECT_EQ(stack.service.ListModels("p.bn1").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace normd
