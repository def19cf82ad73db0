// Cases and checks shared by the core's tests (tests/core): request builders,
// the layouts and GroupNorm cases, 16-bit patterns decoded from the formats'
// definitions, and the GroupNorm/InstanceNorm reference check. Test-only.
#ifndef NORMD_TESTS_TESTING_CORE_CASES_H_
#define NORMD_TESTS_TESTING_CORE_CASES_H_

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "server/core/engine.h"
#include "server/core/moments.h"
#include "tests/testing/input_view.h"
#include "tests/testing/reference.h"

namespace normd::testing {

// Whether `got` is `want` bit for bit (count, mean and M2), for the tests
// that hold a reduction to the same bits across targets, batches or paths;
// a failure prints both in hex floating point.
inline ::testing::AssertionResult SameBits(const Moments& got,
                                           const Moments& want) {
  if (got.count == want.count &&
      std::bit_cast<uint64_t>(got.mean) == std::bit_cast<uint64_t>(want.mean) &&
      std::bit_cast<uint64_t>(got.m2) == std::bit_cast<uint64_t>(want.m2)) {
    return ::testing::AssertionSuccess();
  }
  char text[160];
  std::snprintf(text, sizeof(text), "(%lld, %a, %a) vs (%lld, %a, %a)",
                static_cast<long long>(got.count), got.mean, got.m2,
                static_cast<long long>(want.count), want.mean, want.m2);
  return ::testing::AssertionFailure() << text;
}

// A training BatchNorm request for model `model` on x.
template <typename T>
NormalizeSpec TrainingSpec(const std::string& model, const std::vector<T>& x,
                           Shape shape, int32_t axis) {
  NormalizeSpec spec;
  spec.mode = NormMode::kBatchNorm;
  spec.model = model;
  spec.training = true;
  spec.channel_axis = axis;
  spec.input = View(x, std::move(shape));
  return spec;
}

// How close the statistics of T data must be to the fp64 reference: the
// mean relative to its scale |mean| + std, the variance relative.
// - fp32 data goes through the fp32-SIMD blocks: d = x - shift (exact near
//   the shift), d^2 rounded once, at most 16 terms a lane summed in fp32,
//   then flushed to fp64 (server/core/moments.h). Were every rounding of one
//   sign, the variance could err by 17 u and the mean by 16 u of max |d|;
//   they are independent roundings of either sign, and the suite's tensors
//   (a few thousand values a channel at most) stay within 1 u of the scale
//   for the mean and 8 u for the variance, the bounds held here.
// - fp64 data takes the exact two-pass fp64 path, held to the fp64 bar:
//   1e-12 relative for the variance, 1e-13 of the scale for the mean. The
//   sums' worst case, lane_terms u as in Fp64OutputBound, passes 1e-13
//   past about 7,000 values a channel; their roundings, of either sign,
//   stay far below it. A value narrowed to fp32 errs by 6e-8.
template <typename T>
constexpr double kMeanTolerance = std::is_same_v<T, float> ? kU32 : 1e-13;

template <typename T>
constexpr double kVarTolerance = std::is_same_v<T, float> ? 8 * kU32 : 1e-12;

// Expects m to match the reference mean and biased variance within the
// tolerances of T.
template <typename T>
void ExpectStatsNear(const Moments& m, double ref_mean, double ref_var) {
  const double scale = std::abs(ref_mean) + std::sqrt(ref_var);
  EXPECT_LE(std::abs(m.mean - ref_mean), kMeanTolerance<T> * scale);
  if (m.count > 1) {
    EXPECT_LE(RelErr(m.BiasedVariance(), ref_var), kVarTolerance<T>);
  }
}

// A layout case: shape, channel axis, and [outer, C, inner] as expected.
struct LayoutCase {
  const char* name;
  Shape shape;
  int32_t axis;
  int64_t outer, channels, inner;
};

// One case of each layout normd accepts.
inline std::vector<LayoutCase> Layouts() {
  return {
      {"NC", {64, 5}, 1, 64, 5, 1},
      {"NCL", {8, 3, 50}, 1, 8, 3, 50},
      {"NCHW", {4, 3, 40, 40}, 1, 4, 3, 1600},
      {"NHWC", {4, 20, 20, 6}, -1, 1600, 6, 1},
      {"NCDHW", {2, 4, 6, 7, 8}, 1, 2, 4, 336},
      {"NDHWC", {2, 5, 6, 7, 3}, -1, 420, 3, 1},
      {"NLC_axis2", {6, 300, 7}, 2, 1800, 7, 1},
      {"wide_C", {3, 5000}, 1, 3, 5000, 1},
  };
}

// A 1-D affine parameter (weight or bias) holding `values`.
inline AffineParam Param(std::vector<double> values) {
  AffineParam p;
  p.shape = {static_cast<int64_t>(values.size())};
  p.values = std::move(values);
  return p;
}

// The largest |y[i] - ref[i]|.
template <typename T>
double MaxAbsDiff(const std::vector<T>& y, const std::vector<double>& ref) {
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(y[i]) - ref[i]));
  }
  return worst;
}

// The value of a 16-bit floating-point pattern with `exponent_bits` and
// `mantissa_bits`, computed from the format's fields with ldexp
// (independent of the bit tricks in half.h).
inline double PatternValue(uint16_t h, int exponent_bits, int mantissa_bits) {
  const int max_exponent = (1 << exponent_bits) - 1;
  const int bias = max_exponent / 2;
  const int exponent = (h >> mantissa_bits) & max_exponent;
  const int mantissa = h & ((1 << mantissa_bits) - 1);
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == max_exponent) {
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  }
  if (exponent == 0) {
    return sign * std::ldexp(mantissa, 1 - bias - mantissa_bits);
  }
  return sign * std::ldexp((1 << mantissa_bits) + mantissa,
                           exponent - bias - mantissa_bits);
}

// bfloat16: 8 exponent bits, 7 mantissa bits; IEEE binary16: 5 and 10.
inline double HalfValue(DType dtype, uint16_t h) {
  return dtype == DType::kBFloat16 ? PatternValue(h, 8, 7)
                                   : PatternValue(h, 5, 10);
}

// Expects each 16-bit y[i] of `dtype` within one rounding of the format of
// ref[i] (half an ulp), plus the fp32 computation's own error before it (4
// u32 relative: the L2 and weight-norm kernels' bound, derived in their
// tests), or half the spacing of float16's subnormals (2^-24 apart whatever
// the value). The format's rounding dominates: these checks catch errors of
// the format's ulp (a wrong conversion, a wrong element), not fp32-sized
// ones, which the fp32 tests hold.
inline void ExpectWithinHalfRounding(DType dtype,
                                     const std::vector<uint16_t>& y,
                                     const std::vector<double>& ref) {
  const double half_ulp = dtype == DType::kBFloat16 ? 0x1p-8 : 0x1p-11;
  const double half_spacing = dtype == DType::kBFloat16 ? 0 : 0x1p-25;
  ASSERT_EQ(y.size(), ref.size());
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_LE(std::abs(HalfValue(dtype, y[i]) - ref[i]),
              std::abs(ref[i]) * (half_ulp + 4 * kU32) + half_spacing)
        << i;
  }
}

// Expects `status` to be INVALID_ARGUMENT with a message that starts with
// "<field>:" and contains `detail`.
inline void ExpectInvalidNaming(const absl::Status& status,
                                const std::string& field,
                                const std::string& detail = "") {
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_EQ(status.message().substr(0, field.size() + 1), field + ":")
      << status;
  EXPECT_NE(status.message().find(detail), std::string::npos) << status;
}

// A GroupNorm case: shape, channel axis as sent, and the number of groups.
struct GroupCase {
  Shape shape;
  int32_t axis;  // As sent; 1 = NCHW, -1 = channels-last.
  int64_t groups;
};

// The channel axis of `c`, counted from the front.
inline int ResolvedAxis(const GroupCase& c) {
  return c.axis < 0 ? static_cast<int>(c.shape.size()) + c.axis : c.axis;
}

// The number of elements of a tensor of `shape`.
inline int64_t NumElementsOf(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Every case twice: as the machine runs it, and on one thread, where the
// batches of 4 or more samples of several rows (the last three cases) take
// the one-sample-per-task path (FusedGroupSamples).
// Each y[i] within Fp32OutputBound / Fp64OutputBound (reference.h) of
// ref[i], channel `axis` of `shape` picking its weight and bias (empty: 1
// and 0); sets of `set_size` values; kappa the data's max|x| / sigma.
template <typename T>
void ExpectWithinOutputBound(const std::vector<T>& y,
                             const std::vector<double>& ref,
                             const std::vector<int64_t>& shape, int axis,
                             const std::vector<double>& w,
                             const std::vector<double>& b, int64_t set_size,
                             double kappa) {
  int64_t inner = 1;
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t channels = shape[axis];
  for (size_t i = 0; i < y.size(); ++i) {
    const int64_t c = (static_cast<int64_t>(i) / inner) % channels;
    const double weight = w.empty() ? 1.0 : w[c];
    const double bias = b.empty() ? 0.0 : b[c];
    const double bound =
        std::is_same_v<T, float>
            ? Fp32OutputBound(ref[i], bias, weight)
            : Fp64OutputBound(ref[i], bias, weight, (set_size + 7) / 8, kappa);
    ASSERT_LE(std::abs(static_cast<double>(y[i]) - ref[i]), bound)
        << "element " << i;
  }
}

template <typename T>
void CheckGroupNorm(NormMode mode) {
  const GroupCase cases[] = {
      {{3, 6, 5, 7}, 1, 3},    {{2, 5, 6, 4}, -1, 2},    {{2, 3, 8, 5}, 2, 4},
      {{4, 8, 3000}, 1, 2},    {{2, 64, 64, 32}, -1, 8}, {{5, 12}, 1, 3},
      {{1, 4, 3, 3, 3}, 1, 4}, {{2, 6, 2}, 1, 1},        {{5, 9, 7, 6}, -1, 3},
      {{4, 3, 6, 5}, 2, 2},    {{6, 40, 33, 16}, -1, 4},
  };
  Engine engine;
  for (int threads : {0, 1}) {
    std::optional<tbb::global_control> one_thread;
    if (threads == 1) {
      one_thread.emplace(tbb::global_control::max_allowed_parallelism, 1);
    }
    for (const GroupCase& c : cases) {
      const int axis = ResolvedAxis(c);
      const int64_t channels = c.shape[axis];
      const int64_t groups = mode == NormMode::kGroupNorm ? c.groups : channels;
      if (mode == NormMode::kInstanceNorm &&
          NumElementsOf(c.shape) / (c.shape[0] * channels) == 1) {
        continue;  // One spatial value: refused (OneValuePerGroup...).
      }
      SCOPED_TRACE(::testing::Message()
                   << "shape dims " << c.shape.size() << " N " << c.shape[0]
                   << " axis " << c.axis << " C " << channels << " G " << groups
                   << " threads " << threads);
      const auto x = RandomValues<T>(NumElementsOf(c.shape), 5, 3.0, 2.0);
      std::vector<double> w(channels), b(channels);
      for (int64_t ch = 0; ch < channels; ++ch) {
        w[ch] = 0.5 + 0.25 * ch;
        b[ch] = -1.0 + 0.5 * ch;
      }
      NormalizeSpec spec;
      spec.mode = mode;
      spec.input = View(x, c.shape);
      spec.channel_axis = c.axis;
      if (mode == NormMode::kGroupNorm) spec.num_groups = groups;
      spec.weight = Param(w);
      spec.bias = Param(b);
      std::vector<T> y(x.size());
      auto result = engine.Normalize(spec, y.data());
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_FALSE(result->has_value());  // Stateless.
      const auto ref = ReferenceGroupNorm(x, c.shape, axis, groups, 1e-5, w, b);
      // Sets of (C / G) x spatial values; the data is N(3, 2), within 8
      // sigma: kappa (3 + 16) / 2.
      const int64_t set_size = NumElementsOf(c.shape) / (c.shape[0] * groups);
      constexpr double kKappa = 9.5;
      ExpectWithinOutputBound(y, ref, c.shape, axis, w, b, set_size, kKappa);
      // Without affine parameters: plain normalized values.
      spec.weight.reset();
      spec.bias.reset();
      ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
      ExpectWithinOutputBound(
          y, ReferenceGroupNorm(x, c.shape, axis, groups, 1e-5, {}, {}),
          c.shape, axis, {}, {}, set_size, kKappa);
    }
  }
}

}  // namespace normd::testing

#endif  // NORMD_TESTS_TESTING_CORE_CASES_H_
