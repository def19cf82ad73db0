// Channel-axis resolution for every layout normd accepts.
#include <gtest/gtest.h>

#include "server/core/engine.h"
#include "tests/testing/core_cases.h"

namespace normd {
namespace {

using ::normd::testing::LayoutCase;
using ::normd::testing::Layouts;

TEST(LayoutTest, ResolveChannelAxis) {
  for (const LayoutCase& c : Layouts()) {
    auto layout = ResolveChannelAxis(c.shape, c.axis);
    ASSERT_TRUE(layout.ok()) << c.name;
    EXPECT_EQ(layout->outer, c.outer) << c.name;
    EXPECT_EQ(layout->channels, c.channels) << c.name;
    EXPECT_EQ(layout->inner, c.inner) << c.name;
  }
  EXPECT_EQ(ResolveChannelAxis({2, 3}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveChannelAxis({2, 3}, -2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveChannelAxis({2, 3}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveChannelAxis({5}, std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveNormalizedDims({2, 3}, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveNormalizedDims({2, 3}, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace normd
