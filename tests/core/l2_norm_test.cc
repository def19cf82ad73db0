// L2_NORM (F.normalize) against the long-double reference and examples
// worked by hand: every dtype, rows short and long, scales where a naive
// sum of squares overflows or underflows, zero rows, NaN and Inf, and the
// fields it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "server/core/engine.h"
#include "server/core/euclidean_norm.h"
#include "server/core/half.h"
#include "tests/testing/core_cases.h"
#include "tests/testing/input_view.h"

namespace normd {
namespace {

using ::normd::testing::ExpectInvalidNaming;
using ::normd::testing::ExpectWithinHalfRounding;
using ::normd::testing::HalfValue;
using ::normd::testing::kU32;
using ::normd::testing::kU64;
using ::normd::testing::Param;
using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceL2Norm;
using ::normd::testing::View;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The largest |y - ref| relative to the largest |ref|.
template <typename T>
double MaxRelativeDiff(const std::vector<T>& y,
                       const std::vector<double>& ref) {
  double largest = 0, diff = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    largest = std::max(largest, std::abs(ref[i]));
    diff = std::max(diff, std::abs(static_cast<double>(y[i]) - ref[i]));
  }
  return diff / largest;
}

template <typename T>
std::vector<T> L2(const std::vector<T>& x, Shape shape,
                  std::optional<double> eps = std::nullopt,
                  int32_t normalized_ndim = 0) {
  NormalizeSpec spec;
  spec.mode = NormMode::kL2Norm;
  spec.input = View(x, std::move(shape));
  spec.eps = eps;
  spec.normalized_ndim = normalized_ndim;
  std::vector<T> y(x.size());
  Engine engine;
  const auto result = engine.Normalize(spec, y.data());
  EXPECT_TRUE(result.ok()) << result.status();
  return y;
}

template <typename T>
void CheckAgainstReference(double tolerance) {
  for (int64_t n : {1, 7, 129, 768, 4096, 40000}) {
    SCOPED_TRACE(n);
    const int64_t rows = n > 10000 ? 3 : 13;
    for (double offset : {0.0, 1e4}) {
      const auto x = RandomValues<T>(rows * n, 5, offset, 1.0);
      EXPECT_LE(MaxRelativeDiff(L2(x, {rows, n}), ReferenceL2Norm(x, n, 1e-12)),
                tolerance);
    }
  }
}

// y = x * (1 / max(||x||, eps)): the scale rounds once to the data's type
// and the product once (2 u), and the norm errs as its moments do. fp32:
// the moments' d^2 round in fp32 lanes, at worst 17 u of M2 (8.5 u of the
// norm) if every rounding went one way; independent roundings average out,
// and these seeds stay under 0.6 u: 3 u in all. A scale narrowed or
// computed in fp32 errs by several ulps more.
TEST(L2NormTest, MatchesReferenceFloat32) {
  CheckAgainstReference<float>(3 * kU32);
}

// fp64: the norm sqrt(M2 + n mean^2) from exact two-pass moments is within
// 2 u (the sum, the product, the square root), the scale and the product
// round once each (4 u), and the long-double reference itself rounds to
// fp64 (up to 2 u on a 128-bit long double): 6 u. An fp64 value narrowed to
// fp32 errs 2^29 times as much.
TEST(L2NormTest, MatchesReferenceFloat64) {
  CheckAgainstReference<double>(6 * kU64);
}

TEST(L2NormTest, HandWorkedExamples) {
  // {3, 4}: norm 5. {0, 0}: stays zero. {1e-13, 0}: the norm is below eps
  // 1e-12, so x / 1e-12. {-0, 2}: the signed zero is kept.
  const std::vector<double> x = {3, 4, 0, 0, 1e-13, 0, -0.0, 2};
  const std::vector<double> y = L2(x, {4, 2});
  EXPECT_DOUBLE_EQ(y[0], 0.6);
  EXPECT_DOUBLE_EQ(y[1], 0.8);
  EXPECT_EQ(y[2], 0.0);
  EXPECT_EQ(y[3], 0.0);
  // 1e-13, 1e-12, 1 / eps, the product and 0.1 each round once: 5 u.
  EXPECT_NEAR(y[4], 0.1, 5 * kU64 * 0.1);
  EXPECT_EQ(y[5], 0.0);
  EXPECT_TRUE(std::signbit(y[6]));
  EXPECT_DOUBLE_EQ(y[7], 1.0);
  // Two normalized dims: the 2x2 block {1, 2, 2, 4} has norm 5.
  const std::vector<float> block = {1, 2, 2, 4};
  const std::vector<float> z = L2(block, {1, 2, 2}, std::nullopt, 2);
  EXPECT_FLOAT_EQ(z[0], 0.2f);
  EXPECT_FLOAT_EQ(z[3], 0.8f);
}

// Scales where fp32 squares overflow (1e30) or underflow (1e-30), and fp64
// squares overflow (1e200) or underflow (1e-200, 1e-305, where some values
// are subnormal). At the small scales the norm is below eps: x / eps,
// unless eps is smaller still. fp32: the blocks whose squares leave fp32's
// range are redone in fp64, so the bound is MatchesReferenceFloat32's 3 u.
// fp64: squares past fp64's range send the norm to the scan, largest *
// sqrt(sum (v / largest)^2), summed serially: n - 1 roundings of the sum
// and 2 of each term at worst, (n + 1) / 2 u of the norm after the square
// root, plus 1 for the product by largest, 2 for the scale and the output
// and 2 for the reference (MatchesReferenceFloat64): (n + 11) / 2 u.
TEST(L2NormTest, ExtremeScalesKeepFullPrecision) {
  constexpr int64_t n = 3000;
  for (double scale : {1e30, 1e-30}) {
    for (double eps : {1e-12, 1e-45}) {
      SCOPED_TRACE(::testing::Message() << scale << " eps " << eps);
      auto x = RandomValues<float>(5 * n, 6, 0.0, 1.0);
      for (float& v : x) v *= static_cast<float>(scale);
      EXPECT_LE(MaxRelativeDiff(L2(x, {5, n}, eps), ReferenceL2Norm(x, n, eps)),
                3 * kU32);
    }
  }
  for (double scale : {1e200, 1e-200, 1e-305}) {
    SCOPED_TRACE(scale);
    auto x = RandomValues<double>(5 * n, 7, 0.5, 1.0);
    for (double& v : x) v *= scale;
    EXPECT_LE(
        MaxRelativeDiff(L2(x, {5, n}, 1e-320), ReferenceL2Norm(x, n, 1e-320)),
        (n + 11) / 2.0 * kU64);
  }
}

// PyTorch's IEEE results: a NaN makes its row NaN; an Inf (without NaN)
// makes the norm Inf, so finite values become signed zeros and the Inf
// itself NaN (Inf / Inf).
TEST(L2NormTest, NanAndInfAsPyTorch) {
  for (int64_t n : {5, 300}) {
    SCOPED_TRACE(n);
    std::vector<float> x = RandomValues<float>(3 * n, 8, 0.0, 1.0);
    x[1] = kNaN;
    x[n + 2] = -kInf;
    x[n + 3] = -1.0f;
    const std::vector<float> y = L2(x, {3, n});
    for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(std::isnan(y[j])) << j;
    for (int64_t j = 0; j < n; ++j) {
      if (j == 2) {
        EXPECT_TRUE(std::isnan(y[n + j]));
      } else {
        EXPECT_EQ(y[n + j], 0.0f) << j;
        EXPECT_EQ(std::signbit(y[n + j]), std::signbit(x[n + j])) << j;
      }
    }
    const auto ref = ReferenceL2Norm(
        std::vector<float>(x.begin() + 2 * n, x.end()), n, 1e-12);
    for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(y[2 * n + j], ref[j], 1e-7);
  }
}

// 16-bit rows: within half an ulp of the output format (plus the fp32
// rounding before it), or half the spacing of float16's subnormals, of the
// reference of the decoded input.
TEST(L2NormTest, HalfDtypesWithinTheirRounding) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t n : {3, 100, 5000}) {
      SCOPED_TRACE(::testing::Message() << static_cast<int>(dtype) << " " << n);
      const auto wide = RandomValues<double>(4 * n, 9, 1.0, 2.0);
      std::vector<uint16_t> x;
      std::vector<double> decoded;
      for (double v : wide) {
        x.push_back(DoubleToHalf(dtype, v));
        decoded.push_back(HalfValue(dtype, x.back()));
      }
      NormalizeSpec spec;
      spec.mode = NormMode::kL2Norm;
      spec.input = View(x, {4, n}, dtype);
      std::vector<uint16_t> y(x.size());
      Engine engine;
      ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
      const auto ref = ReferenceL2Norm(decoded, n, 1e-12);
      ExpectWithinHalfRounding(dtype, y, ref);
    }
  }
}

TEST(L2NormTest, MomentsAndScanAgree) {
  // The norm from the moments and the scaled scan over the same values.
  const auto x = RandomValues<double>(10000, 10, 3.0, 2.0);
  const ChannelLayout row{1, 1, 10000};
  const Moments m = ContiguousMoments(x.data(), 10000);
  const double from_moments =
      EuclideanNorm(m, DType::kFloat64, x.data(), row, 0);
  EXPECT_NEAR(from_moments,
              ScannedEuclideanNorm(DType::kFloat64, x.data(), row, 0),
              1e-13 * from_moments);
  // Channel 1 of [2, 3, 2]: values 2, 3, 8, 9 (x[i] = i).
  std::vector<float> t(12);
  for (int i = 0; i < 12; ++i) t[i] = static_cast<float>(i);
  EXPECT_DOUBLE_EQ(ScannedEuclideanNorm(DType::kFloat32, t.data(),
                                        ChannelLayout{2, 3, 2}, 1),
                   std::sqrt(4.0 + 9 + 64 + 81));
}

TEST(L2NormTest, RefusesWhatItDoesNotTake) {
  const std::vector<float> x(12, 1.0f);
  Engine engine;
  std::vector<float> y(12, 7.0f);
  auto expect_invalid = [&](NormalizeSpec spec, const std::string& field) {
    spec.mode = NormMode::kL2Norm;
    if (spec.input.data == nullptr) spec.input = View(x, {3, 4});
    ExpectInvalidNaming(engine.Normalize(spec, y.data()).status(), field);
  };
  NormalizeSpec spec;
  spec.weight = Param({1, 1, 1, 1});
  expect_invalid(spec, "weight");
  spec = {};
  spec.bias = Param({0, 0, 0, 0});
  expect_invalid(spec, "bias");
  spec = {};
  spec.model = "m";
  expect_invalid(spec, "model");
  spec = {};
  spec.channel_axis = 1;
  expect_invalid(spec, "channel_axis");
  for (double eps : {0.0, -1e-12, kNaN, kInf}) {
    spec = {};
    spec.eps = eps;
    expect_invalid(spec, "eps");
  }
  spec = {};
  spec.normalized_ndim = 3;
  expect_invalid(spec, "normalized_ndim");
  for (float v : y) EXPECT_EQ(v, 7.0f);  // Nothing was written.
}

}  // namespace
}  // namespace normd
