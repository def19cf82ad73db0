// NORMD_SIMD_TARGET's parsing and effect: each target this CPU runs can be
// picked and is then the one that runs; unknown names, names not compiled
// in and targets the CPU lacks are refused with the variable named, and
// change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "server/core/simd/target.h"

namespace normd {
namespace {

// Undoes RestrictSimdTarget: every target enabled again.
void Unrestrict() {
  hwy::DisableTargets(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

class SimdTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv(kSimdTargetVariable) != nullptr) {
      GTEST_SKIP() << "this run is restricted by " << kSimdTargetVariable;
    }
  }
  void TearDown() override { Unrestrict(); }
};

TEST_F(SimdTargetTest, EveryAvailableTargetCanBePickedAndThenRuns) {
  const std::vector<std::string> available = AvailableSimdTargets();
  ASSERT_FALSE(available.empty());
  EXPECT_EQ(ActiveSimdTarget(), available.front()) << "the best runs first";
#if defined(__x86_64__)
  EXPECT_EQ(available.back(), "scalar") << "the fallback is always there";
  // Every x86-64 CPU normd runs on has SSE4 (x86-64-v2), where it is
  // compiled in (NORMD_SIMD_SKIP may leave it out).
  if ((HWY_TARGETS & HWY_SSE4) != 0) {
    EXPECT_NE(std::find(available.begin(), available.end(), "sse4"),
              available.end());
  }
#endif
  for (const std::string& name : available) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(RestrictSimdTarget(name).ok());
    EXPECT_EQ(ActiveSimdTarget(), name);
    EXPECT_EQ(AvailableSimdTargets(), std::vector<std::string>{name});
    Unrestrict();
  }
}

TEST_F(SimdTargetTest, BadNamesAreRefusedNamingTheVariableAndChangeNothing) {
  const std::string before = ActiveSimdTarget();
  const absl::Status unknown = RestrictSimdTarget("avx9");
  EXPECT_TRUE(absl::IsInvalidArgument(unknown));
  EXPECT_EQ(unknown.message(),
            "NORMD_SIMD_TARGET=avx9: unknown SIMD target; one of avx3, avx2, "
            "sse4, sve, neon, scalar");
  EXPECT_TRUE(absl::IsInvalidArgument(RestrictSimdTarget("")));
  EXPECT_TRUE(absl::IsInvalidArgument(RestrictSimdTarget("AVX2")))
      << "names are lower case, as documented";
#if defined(__x86_64__) || defined(__aarch64__)
#if defined(__x86_64__)
  const char* const kOtherArch = "neon";
#else
  const char* const kOtherArch = "avx2";
#endif
  const absl::Status other_arch = RestrictSimdTarget(kOtherArch);
  EXPECT_TRUE(absl::IsInvalidArgument(other_arch));
  EXPECT_NE(
      other_arch.message().find(std::string("NORMD_SIMD_TARGET=") + kOtherArch +
                                ": not compiled into this build"),
      absl::string_view::npos)
      << other_arch.message();
#endif
  EXPECT_EQ(ActiveSimdTarget(), before);
  EXPECT_EQ(AvailableSimdTargets().front(), before);
}

TEST_F(SimdTargetTest, TargetsTheCpuLacksAreRefused) {
  const std::vector<std::string> available = AvailableSimdTargets();
  bool refused_one = false;
  for (const std::string& name : SimdTargetNames()) {
    if (std::find(available.begin(), available.end(), name) !=
        available.end()) {
      continue;
    }
    const absl::Status status = RestrictSimdTarget(name);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << name;
    EXPECT_EQ(status.message().rfind("NORMD_SIMD_TARGET=" + name + ": ", 0), 0u)
        << status.message();
    refused_one = true;
  }
  EXPECT_TRUE(refused_one) << "no CPU runs both x86 and ARM targets";
  EXPECT_EQ(AvailableSimdTargets(), available);
}

}  // namespace
}  // namespace normd
