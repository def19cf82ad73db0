// RMSNorm against the fp64 reference and a hand-worked example.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "server/core/engine.h"
#include "tests/testing/core_cases.h"

namespace normd {
namespace {

using ::normd::testing::Fp32OutputBound;
using ::normd::testing::Fp64OutputBound;
using ::normd::testing::MaxAbsDiff;
using ::normd::testing::Param;
using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceRmsNorm;
using ::normd::testing::View;

// Within Fp32OutputBound / Fp64OutputBound of the long-double reference
// (RMSNorm subtracts no mean: kappa is 1).
template <typename T>
void ExpectWithinBound(const std::vector<T>& y, const std::vector<double>& ref,
                       const std::vector<double>& w,
                       const std::vector<double>& b, int64_t n) {
  for (size_t i = 0; i < y.size(); ++i) {
    const size_t j = i % n;
    const double bias = b.empty() ? 0.0 : b[j];
    const double bound =
        sizeof(T) == 4 ? Fp32OutputBound(ref[i], bias, w[j])
                       : Fp64OutputBound(ref[i], bias, w[j], (n + 7) / 8, 1.0);
    ASSERT_LE(std::abs(static_cast<double>(y[i]) - ref[i]), bound) << i;
  }
}

template <typename T>
void CheckRmsNorm() {
  Engine engine;
  for (int64_t n : {1, 7, 768, 4096, 40000}) {
    SCOPED_TRACE(n);
    const int64_t rows = n > 10000 ? 2 : 13;
    const auto x = RandomValues<T>(rows * n, 8, 0.5, 2.0);
    std::vector<double> w(n), b(n);
    for (int64_t j = 0; j < n; ++j) {
      w[j] = 1.0 + 0.001 * (j % 100);
      b[j] = 0.01 * (j % 7);
    }
    NormalizeSpec spec;
    spec.mode = NormMode::kRmsNorm;
    spec.input = View(x, {rows, n});
    spec.weight = Param(w);
    std::vector<T> y(x.size());
    ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
    ExpectWithinBound(y, ReferenceRmsNorm(x, n, 1e-5, w, {}), w, {}, n);
    spec.bias = Param(b);
    spec.eps = 1e-3;
    ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
    ExpectWithinBound(y, ReferenceRmsNorm(x, n, 1e-3, w, b), w, b, n);
  }
}

TEST(RmsNormTest, MatchesReferenceFloat32) { CheckRmsNorm<float>(); }

TEST(RmsNormTest, MatchesReferenceFloat64) { CheckRmsNorm<double>(); }

TEST(RmsNormTest, HandWorkedExample) {
  // Row {3, 4}: mean(x^2) = 12.5; y = x / sqrt(12.5 + eps).
  const std::vector<double> x = {3, 4, -1, 1};
  NormalizeSpec spec;
  spec.mode = NormMode::kRmsNorm;
  spec.eps = 1e-6;
  spec.input = View(x, {2, 2});
  std::vector<double> y(4);
  Engine engine;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  EXPECT_NEAR(y[0], 3 / std::sqrt(12.5 + 1e-6), 1e-15);
  EXPECT_NEAR(y[1], 4 / std::sqrt(12.5 + 1e-6), 1e-15);
  EXPECT_NEAR(y[2], -1 / std::sqrt(1 + 1e-6), 1e-15);
}

TEST(RmsNormTest, LargeMeanOffsetKeepsFullPrecision) {
  // mean(x^2) is dominated by the mean^2 here; it is computed from exact
  // moments (M2 / n + mean^2), not from fp32 sums of squares.
  const auto x = RandomValues<float>(1 << 20, 4, 1e4, 1.0);
  NormalizeSpec spec;
  spec.mode = NormMode::kRmsNorm;
  spec.input = View(x, {1, 1 << 20});
  std::vector<float> y(x.size());
  Engine engine;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  EXPECT_LE(MaxAbsDiff(y, ReferenceRmsNorm(x, 1 << 20, 1e-5, {}, {})), 3e-7);
}

}  // namespace
}  // namespace normd
