// The fp32 and fp64 row affines on every SIMD target: the bits of their
// formulas computed one value at a time (each step rounded, nothing fused),
// at every tail length, with and without weight / bias, in place too.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/testing/core_cases.h"
#include "tests/testing/reference.h"
#include "tests/testing/row_affine_calls.h"
#include "tests/testing/simd_targets.h"

namespace normd {
namespace {

using ::normd::testing::Bits;
using ::normd::testing::ForEachSimdTarget;
using ::normd::testing::RandomValues;

TEST(RowAffineTest, FloatAndDoubleRowsAreTheirFormulasOnEveryTarget) {
  const auto wide = RandomValues<double>(3 * 67, 43, 1e4, 3.0);
  const double mean = 1e4 + 0.123456789;
  const double scale = 0.37;
  ForEachSimdTarget([&](const std::string&) {
    for (int64_t n : {1, 2, 7, 8, 9, 16, 17, 31, 67}) {
      for (bool with_weight : {false, true}) {
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << "n " << n << " weight " << with_weight << " bias "
                       << with_bias);
          // fp32: the mean split as hi + lo.
          const std::vector<float> x(wide.begin(), wide.begin() + n);
          const std::vector<float> w(wide.begin() + 67, wide.begin() + 67 + n);
          const std::vector<float> b(wide.begin() + 134,
                                     wide.begin() + 134 + n);
          const auto hi = static_cast<float>(mean);
          const auto lo = static_cast<float>(mean - hi);
          const auto fscale = static_cast<float>(scale);
          std::vector<float> y(n), in_place = x;
          const float* wp = with_weight ? w.data() : nullptr;
          const float* bp = with_bias ? b.data() : nullptr;
          FloatRowAffine(x.data(), y.data(), n, hi, lo, fscale, wp, bp);
          FloatRowAffine(in_place.data(), in_place.data(), n, hi, lo, fscale,
                         wp, bp);
          for (int64_t j = 0; j < n; ++j) {
            float want = ((x[j] - hi) - lo) * fscale;
            if (with_weight) want = want * w[j];
            if (with_bias) want = want + b[j];
            ASSERT_EQ(Bits(y[j]), Bits(want)) << "fp32 j " << j;
            ASSERT_EQ(Bits(in_place[j]), Bits(want));
          }
          // fp64.
          const std::vector<double> xd(wide.begin(), wide.begin() + n);
          const std::vector<double> wd(wide.begin() + 67,
                                       wide.begin() + 67 + n);
          const std::vector<double> bd(wide.begin() + 134,
                                       wide.begin() + 134 + n);
          std::vector<double> yd(n);
          DoubleRowAffine(xd.data(), yd.data(), n, mean, scale,
                          with_weight ? wd.data() : nullptr,
                          with_bias ? bd.data() : nullptr);
          for (int64_t j = 0; j < n; ++j) {
            double want = (xd[j] - mean) * scale;
            if (with_weight) want = want * wd[j];
            if (with_bias) want = want + bd[j];
            ASSERT_EQ(Bits(yd[j]), Bits(want)) << "fp64 j " << j;
          }
        }
      }
    }
  });
}

// The 16-bit rows' fused multiply-add is exact on every target, including
// SSE4 and scalar, which have no FMA instruction (simd/ops-inl.h): with
// hi = lo = 0 and scale = 1 the row affine is y = fma(x, weight, bias), here
// for random bit patterns (every exponent: overflow, subnormal products and
// sums, exact cancellation, infinities) and a few hand-picked ties.
TEST(RowAffineTest, FusedMultiplyAddIsExactOnEveryTarget) {
  std::mt19937 gen(17);
  constexpr int64_t kN = 200000;
  std::vector<float> x(kN), w(kN), b(kN);
  auto random_float = [&] {
    return std::bit_cast<float>(static_cast<uint32_t>(gen()));
  };
  for (int64_t i = 0; i < kN; ++i) {
    x[i] = random_float();
    w[i] = random_float();
    // Half the sums near the product, so that they cancel or round at a tie.
    b[i] = i % 2 == 0 ? random_float()
                      : -x[i] * w[i] * (1.0f + 0x1p-23f * (i % 7));
  }
  // 1 + 2^-23 squared is 1 + 2^-22 + 2^-46: with -1 - 2^-22 added, only the
  // 2^-46 remains, which an unfused multiply-add rounds away.
  x[0] = w[0] = 1.0f + 0x1p-23f;
  b[0] = -(1.0f + 0x1p-22f);
  // A product just past FLT_MAX that the sum brings back in range.
  x[1] = 0x1.fffffep127f;
  w[1] = 1.5f;
  b[1] = -0x1.fffffep127f;
  ForEachSimdTarget([&](const std::string&) {
    std::vector<float> y(kN);
    HalfRowAffine(x.data(), y.data(), kN, 0.0f, 0.0f, 1.0f, w.data(), b.data());
    int64_t differ = 0;
    for (int64_t i = 0; i < kN; ++i) {
      const float want = std::fma(x[i], w[i], b[i]);
      if (std::isnan(want)) {
        if (!std::isnan(y[i]) && differ++ < 5) ADD_FAILURE() << "NaN at " << i;
        continue;
      }
      if (Bits(y[i]) != Bits(want) && differ++ < 5) {
        ADD_FAILURE() << "fma(" << x[i] << ", " << w[i] << ", " << b[i]
                      << ") = " << want << ", got " << y[i];
      }
    }
    EXPECT_EQ(differ, 0);
  });
}

}  // namespace
}  // namespace normd
