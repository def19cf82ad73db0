// WEIGHT_NORM (torch.nn.utils.weight_norm) against the long-double
// reference and examples worked by hand: every axis, g in both shapes or
// absent, every dtype, extreme scales, zero and non-finite slices, and the
// fields it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "server/core/engine.h"
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
using ::normd::testing::ReferenceWeightNorm;
using ::normd::testing::View;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

template <typename T>
absl::StatusOr<std::vector<T>> WeightNorm(const std::vector<T>& v,
                                          const Shape& shape,
                                          std::optional<int32_t> axis,
                                          std::optional<AffineParam> g) {
  NormalizeSpec spec;
  spec.mode = NormMode::kWeightNorm;
  spec.input = View(v, shape);
  spec.channel_axis = axis;
  spec.weight = std::move(g);
  std::vector<T> w(v.size());
  Engine engine;
  const auto result = engine.Normalize(spec, w.data());
  if (!result.ok()) return result.status();
  return w;
}

// [outer, C, inner] of `shape` around `axis` (non-negative).
ChannelLayout Around(const Shape& shape, int axis) {
  ChannelLayout l{1, shape[axis], 1};
  for (int d = 0; d < axis; ++d) l.outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) l.inner *= shape[d];
  return l;
}

template <typename T>
void CheckAgainstReference(double tolerance) {
  // Linear and Conv2d weights, a long run, at every axis (negative too).
  for (const Shape& shape :
       {Shape{64, 33}, Shape{8, 3, 3, 3}, Shape{2, 40000}, Shape{300, 7, 5}}) {
    const int rank = static_cast<int>(shape.size());
    for (int axis = -rank; axis < rank; ++axis) {
      SCOPED_TRACE(::testing::Message()
                   << ShapeString(shape) << " axis " << axis);
      const int resolved = axis < 0 ? axis + rank : axis;
      const ChannelLayout l = Around(shape, resolved);
      const auto v = RandomValues<T>(l.NumElements(), 3, 0.2, 1.0);
      const auto g = RandomValues<double>(l.channels, 4, 1.0, 0.5);
      // g as [C] and as PyTorch's parameter shape.
      Shape parameter(rank, 1);
      parameter[resolved] = l.channels;
      const auto ref = ReferenceWeightNorm(v, l.outer, l.channels, l.inner, g);
      for (const Shape& g_shape : {Shape{l.channels}, parameter}) {
        const auto w = WeightNorm(v, shape, axis, AffineParam{g_shape, g});
        ASSERT_TRUE(w.ok()) << w.status();
        double worst = 0;
        for (size_t i = 0; i < v.size(); ++i) {
          worst = std::max(worst, std::abs((*w)[i] - ref[i]) /
                                      std::max(std::abs(ref[i]), 1e-30));
        }
        EXPECT_LE(worst, tolerance);
      }
    }
  }
}

// fp32: g / ||v|| rounded once to float, then one product: 4 ulps.
TEST(WeightNormTest, MatchesReferenceFloat32) {
  CheckAgainstReference<float>(4 * kU32);
}

TEST(WeightNormTest, MatchesReferenceFloat64) {
  // A few ulps: the norm, g / norm, and the product each round once.
  CheckAgainstReference<double>(4e-15);
}

TEST(WeightNormTest, HandWorkedExamples) {
  // v = [[3, 4], [0, 5]]. dim 0: row norms 5 and 5; g = [2, 10] gives
  // [[1.2, 1.6], [0, 10]]. dim 1: column norms 3 and sqrt(41).
  const std::vector<double> v = {3, 4, 0, 5};
  auto rows = WeightNorm(v, {2, 2}, std::nullopt, Param({2, 10}));
  ASSERT_TRUE(rows.ok());
  EXPECT_DOUBLE_EQ((*rows)[0], 1.2);
  EXPECT_DOUBLE_EQ((*rows)[1], 1.6);
  EXPECT_EQ((*rows)[2], 0.0);
  EXPECT_DOUBLE_EQ((*rows)[3], 10.0);
  auto columns = WeightNorm(v, {2, 2}, 1, Param({1, 1}));
  ASSERT_TRUE(columns.ok());
  EXPECT_DOUBLE_EQ((*columns)[0], 1.0);
  EXPECT_DOUBLE_EQ((*columns)[1], 4 / std::sqrt(41.0));
  EXPECT_EQ((*columns)[2], 0.0);
  EXPECT_DOUBLE_EQ((*columns)[3], 5 / std::sqrt(41.0));
  // A rank-1 v at dim 0: every value is its own slice, so w = g * sign(v).
  auto vector = WeightNorm(std::vector<float>{-2, 0.5f}, {2}, 0, Param({3, 4}));
  ASSERT_TRUE(vector.ok());
  EXPECT_EQ((*vector)[0], -3.0f);
  EXPECT_EQ((*vector)[1], 4.0f);
}

// Without g, PyTorch's initial g = ||v|| gives w = v: bit for bit, signed
// zeros included, in every dtype.
TEST(WeightNormTest, WithoutGainTheOutputIsTheInput) {
  auto v = RandomValues<float>(6 * 50, 5, 0.0, 3.0);
  v[7] = -0.0f;
  v[8] = 0.0f;
  for (int32_t axis : {0, 1, -1}) {
    const auto w = WeightNorm(v, {6, 50}, axis, std::nullopt);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(std::memcmp(w->data(), v.data(), v.size() * sizeof(float)), 0)
        << axis;
  }
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<uint16_t> h;
    for (float f : v) h.push_back(FloatToHalf(dtype, f));
    NormalizeSpec spec;
    spec.mode = NormMode::kWeightNorm;
    spec.input = View(h, {6, 50}, dtype);
    std::vector<uint16_t> w(h.size());
    Engine engine;
    ASSERT_TRUE(engine.Normalize(spec, w.data()).ok());
    EXPECT_EQ(w, h) << static_cast<int>(dtype);
  }
}

// PyTorch: a zero slice divides by a zero norm, a NaN or Inf makes the norm
// NaN or Inf. With or without g, a zero or NaN slice is NaN. An infinite
// norm with a finite g scales by 0 (finite values become signed zeros, the
// Inf NaN); without g, by Inf / Inf: NaN.
TEST(WeightNormTest, ZeroAndNonFiniteSlicesAsPyTorch) {
  std::vector<double> v = {
      0, 0,    0,  // zero slice
      1, kNaN, 2, 1, -std::numeric_limits<double>::infinity(), -3, 1, 2, 2};
  for (bool with_g : {false, true}) {
    SCOPED_TRACE(with_g);
    const auto w =
        WeightNorm(v, {4, 3}, 0,
                   with_g ? std::optional<AffineParam>(Param({2, 2, 2, 6}))
                          : std::nullopt);
    ASSERT_TRUE(w.ok());
    for (int j = 0; j < 6; ++j) EXPECT_TRUE(std::isnan((*w)[j])) << j;
    if (with_g) {
      EXPECT_EQ((*w)[6], 0.0);
      EXPECT_TRUE(std::isnan((*w)[7]));
      EXPECT_EQ((*w)[8], 0.0);
      EXPECT_TRUE(std::signbit((*w)[8]));
    } else {
      for (int j = 6; j < 9; ++j) EXPECT_TRUE(std::isnan((*w)[j])) << j;
    }
    const double g = with_g ? 6.0 : 3.0;
    EXPECT_DOUBLE_EQ((*w)[9], g / 3);
    EXPECT_DOUBLE_EQ((*w)[10], 2 * g / 3);
  }
}

// Scales whose squares overflow or underflow fp32 (1e±30) and fp64
// (1e±200): as precise as at scale 1. fp32: g / ||v|| rounded once to
// float, then one product: 4 ulps. fp64: the norm from exact two-pass
// moments in 8 lanes of at most ceil(n / 8) terms (n = 144 values per
// slice), then a division and a product: 2 u (18 + 8).
TEST(WeightNormTest, ExtremeScalesKeepFullPrecision) {
  const Shape shape{16, 9, 3, 3};
  const ChannelLayout l = Around(shape, 0);
  const auto g = RandomValues<double>(16, 6, 1.0, 0.5);
  for (double scale : {1e30, 1e-30}) {
    auto v = RandomValues<float>(l.NumElements(), 7, 0.0, 1.0);
    for (float& x : v) x *= static_cast<float>(scale);
    const auto w = WeightNorm(v, shape, 0, Param(g));
    ASSERT_TRUE(w.ok());
    const auto ref = ReferenceWeightNorm(v, l.outer, l.channels, l.inner, g);
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_NEAR((*w)[i], ref[i], 4 * kU32 * std::abs(ref[i])) << scale;
    }
  }
  for (double scale : {1e200, 1e-200}) {
    auto v = RandomValues<double>(l.NumElements(), 8, 0.0, 1.0);
    for (double& x : v) x *= scale;
    const auto w = WeightNorm(v, shape, 1, Param(std::vector<double>(9, 2.0)));
    ASSERT_TRUE(w.ok());
    const ChannelLayout l1 = Around(shape, 1);
    const auto ref = ReferenceWeightNorm(v, l1.outer, l1.channels, l1.inner,
                                         std::vector<double>(9, 2.0));
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_NEAR((*w)[i], ref[i], 2 * kU64 * (18 + 8) * std::abs(ref[i]))
          << scale;
    }
  }
}

// 16-bit v: within half an ulp of the output format (plus fp32's rounding),
// or half the spacing of float16's subnormals.
TEST(WeightNormTest, HalfDtypesWithinTheirRounding) {
  const Shape shape{32, 16, 3};
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int axis : {0, 1, 2}) {
      SCOPED_TRACE(::testing::Message() << static_cast<int>(dtype) << axis);
      const ChannelLayout l = Around(shape, axis);
      std::vector<uint16_t> v;
      std::vector<double> decoded;
      for (double x : RandomValues<double>(l.NumElements(), 9, 0.0, 1.0)) {
        v.push_back(DoubleToHalf(dtype, x));
        decoded.push_back(HalfValue(dtype, v.back()));
      }
      const auto g = RandomValues<double>(l.channels, 10, 1.0, 0.3);
      NormalizeSpec spec;
      spec.mode = NormMode::kWeightNorm;
      spec.input = View(v, shape, dtype);
      spec.channel_axis = axis;
      spec.weight = Param(g);
      std::vector<uint16_t> w(v.size());
      Engine engine;
      ASSERT_TRUE(engine.Normalize(spec, w.data()).ok());
      const auto ref =
          ReferenceWeightNorm(decoded, l.outer, l.channels, l.inner, g);
      ExpectWithinHalfRounding(dtype, w, ref);
    }
  }
}

TEST(WeightNormTest, RefusesWhatItDoesNotTake) {
  const std::vector<float> v(24, 1.0f);
  Engine engine;
  std::vector<float> w(24, 7.0f);
  auto expect_invalid = [&](NormalizeSpec spec, const std::string& field,
                            const std::string& detail) {
    spec.mode = NormMode::kWeightNorm;
    if (spec.input.data == nullptr) spec.input = View(v, {4, 3, 2});
    ExpectInvalidNaming(engine.Normalize(spec, w.data()).status(), field,
                        detail);
  };
  NormalizeSpec spec;
  spec.bias = Param({0, 0, 0, 0});
  expect_invalid(spec, "bias", "no bias");
  spec = {};
  spec.eps = 1e-5;
  expect_invalid(spec, "eps", "has none");
  spec = {};
  spec.model = "m";
  expect_invalid(spec, "model", "stateless");
  spec = {};
  spec.normalized_ndim = 1;
  expect_invalid(spec, "normalized_ndim", "channel_axis");
  for (int32_t axis : {3, -4}) {
    spec = {};
    spec.channel_axis = axis;
    expect_invalid(spec, "channel_axis", "out of range");
  }
  spec = {};
  spec.weight = Param({1, 1, 1});  // C is 4 at axis 0.
  expect_invalid(spec, "weight.shape", "must be [4] or [4,1,1]");
  spec = {};
  spec.weight = AffineParam{{1, 4, 1}, std::vector<double>(4, 1.0)};
  expect_invalid(spec, "weight.shape", "must be [4] or [4,1,1]");
  spec = {};
  spec.input = View(std::vector<float>{1.0f}, {});
  spec.input.data = v.data();
  expect_invalid(spec, "input.shape", "rank >= 1");
  for (float x : w) EXPECT_EQ(x, 7.0f);  // Nothing was written.
}

}  // namespace
}  // namespace normd
