// LayerNorm against the fp64 reference, its BERT-style variant, and IEEE
// non-finite values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "server/core/engine.h"
#include "tests/testing/core_cases.h"

namespace normd {
namespace {

using ::normd::testing::Fp32OutputBound;
using ::normd::testing::Fp64OutputBound;
using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceLayerNorm;
using ::normd::testing::View;

TEST(LayerNormTest, MatchesReferenceWithAffine) {
  for (int k : {1, 2, 3}) {
    const Shape shape = {3, 4, 5, 6};
    int64_t n = 1;
    for (int i = 4 - k; i < 4; ++i) n *= shape[i];
    const auto x = RandomValues<float>(360, 5 + k, 2.0, 4.0);
    std::vector<double> w(n), b(n);
    for (int64_t j = 0; j < n; ++j) {
      w[j] = 1.0 + 0.01 * static_cast<double>(j);
      b[j] = 0.5 - 0.02 * static_cast<double>(j);
    }
    NormalizeSpec spec;
    spec.mode = NormMode::kLayerNorm;
    spec.normalized_ndim = k;
    spec.input = View(x, shape);
    spec.weight = AffineParam{Shape(shape.end() - k, shape.end()), w};
    spec.bias = AffineParam{Shape(shape.end() - k, shape.end()), b};
    Engine engine;
    std::vector<float> y(360);
    ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
    const auto ref = ReferenceLayerNorm(x, n, 1e-5, w, b);
    for (int64_t i = 0; i < 360; ++i) {
      const int64_t j = i % n;
      ASSERT_LE(std::abs(y[i] - ref[i]), Fp32OutputBound(ref[i], b[j], w[j]))
          << k << " " << i;
    }
    // A weight of the wrong shape names the field.
    spec.weight = AffineParam{{n + 1}, std::vector<double>(n + 1, 1.0)};
    auto status = engine.Normalize(spec, y.data()).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("weight.shape"), std::string::npos);
  }
}

// fp64 LayerNorm against long double, within Fp64OutputBound: rows short
// and long (one lane term to thousands), data offset by 50 sigma (kappa
// about 60), with eps at its default and at 0.1.
TEST(LayerNormTest, Float64MatchesLongDoubleToFp64Accuracy) {
  Engine engine;
  for (int64_t n : {1, 2, 7, 768, 40000}) {
    const int64_t rows = n > 10000 ? 2 : 9;
    const auto x = RandomValues<double>(rows * n, 11, 50.0, 1.0);
    std::vector<double> w(n), b(n);
    for (int64_t j = 0; j < n; ++j) {
      w[j] = 0.5 + 0.001 * static_cast<double>(j % 1500);
      b[j] = -0.25 + 0.01 * static_cast<double>(j % 50);
    }
    for (double eps : {1e-5, 0.1}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " eps " << eps);
      NormalizeSpec spec;
      spec.mode = NormMode::kLayerNorm;
      spec.input = View(x, {rows, n});
      spec.weight = AffineParam{{n}, w};
      spec.bias = AffineParam{{n}, b};
      spec.eps = eps;
      std::vector<double> y(x.size());
      ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
      const auto ref = ReferenceLayerNorm(x, n, eps, w, b);
      const int64_t lane_terms = (n + 7) / 8;
      // kappa: max|x| / sigma, sigma >= sqrt(eps) and about 1 here (n > 1).
      const double kappa = n == 1 ? 55.0 / std::sqrt(eps) : 60.0;
      for (int64_t i = 0; i < rows * n; ++i) {
        const int64_t j = i % n;
        ASSERT_LE(std::abs(y[i] - ref[i]),
                  Fp64OutputBound(ref[i], b[j], w[j], lane_terms, kappa))
            << i;
      }
    }
  }
}

TEST(LayerNormTest, BertStyleUsesUnbiasedStdOutsideTheRoot) {
  const std::vector<double> x = {1, 2, 3, 4};
  NormalizeSpec spec;
  spec.mode = NormMode::kLayerNorm;
  spec.layer_norm_style = LayerNormStyle::kBertUnbiasedStd;
  spec.input = View(x, {1, 4});
  std::vector<double> y(4);
  Engine engine;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  const double std_unbiased = std::sqrt(5.0 / 3.0);
  EXPECT_NEAR(y[0], -1.5 / (std_unbiased + 1e-6), 1e-15);
  EXPECT_NEAR(y[3], 1.5 / (std_unbiased + 1e-6), 1e-15);
}

TEST(LayerNormTest, NonFiniteValuesPassThroughAsIeee) {
  const std::vector<float> x = {
      1, std::numeric_limits<float>::infinity(), 3, 4, 5, 6};
  NormalizeSpec spec;
  spec.mode = NormMode::kLayerNorm;
  spec.input = View(x, {2, 3});
  std::vector<float> y(6);
  Engine engine;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  EXPECT_TRUE(std::isnan(y[0]));  // Row 0 has an Inf: NaN as in PyTorch.
  EXPECT_NEAR(y[3], -1.0 / std::sqrt(2.0 / 3.0 + 1e-5), 1e-6);
}

}  // namespace
}  // namespace normd
