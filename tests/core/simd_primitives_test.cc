// The SIMD primitives every kernel is built from, tested on each Highway
// target compiled in, as Highway's own tests are (HWY_EXPORT_AND_TEST_P: one
// test instance per target): ops-inl.h's fused multiply-add rounded once,
// fp64-to-fp32 rounding, partial loads and stores, and the folds against
// fold.h's scalar order; half-inl.h's 16-bit conversions against the scalar
// definitions in half.h, for every one of the 65,536 patterns and for fp32
// values at and around every rounding midpoint. The kernels' same-bits
// promise rests on each of these giving the scalar bits on every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/core/simd_primitives_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

// After foreach_target.h.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "server/core/half.h"
#include "server/core/simd/fold.h"
#include "server/core/simd/half-inl.h"
#include "server/core/simd/ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;

// fp32 triples whose products and sums round differently once than twice:
// random values of every sign and a range of magnitudes, products near
// half-way cases, and cancellation.
std::vector<float> MulAddOperands(size_t triples) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  std::vector<float> v(3 * triples);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = std::ldexp(mantissa(gen), exponent(gen)) * (gen() % 2 ? -1 : 1);
  }
  for (size_t t = 0; t + 1 < triples; t += 7) {
    // c = -(a * b) rounded: the fused result is the product's exact error.
    v[3 * t + 2] = -(v[3 * t] * v[3 * t + 1]);
  }
  return v;
}

void TestExactMulAddRoundsOnce() {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t triples = 4096 * lanes;
  const std::vector<float> v = MulAddOperands(triples);
  std::vector<float> a(lanes), b(lanes), c(lanes), out(lanes);
  for (size_t t = 0; t < triples; t += lanes) {
    for (size_t j = 0; j < lanes; ++j) {
      a[j] = v[3 * (t + j)];
      b[j] = v[3 * (t + j) + 1];
      c[j] = v[3 * (t + j) + 2];
    }
    hn::StoreU(ExactMulAdd(d, hn::LoadU(d, a.data()), hn::LoadU(d, b.data()),
                           hn::LoadU(d, c.data())),
               d, out.data());
    for (size_t j = 0; j < lanes; ++j) {
      const float want = std::fma(a[j], b[j], c[j]);
      ASSERT_EQ(std::bit_cast<uint32_t>(out[j]), std::bit_cast<uint32_t>(want))
          << a[j] << " * " << b[j] << " + " << c[j];
    }
  }
}

void TestRoundToFloatIsACastThatOverflowsToInfinity() {
  const hn::ScalableTag<double> dd;
  const size_t lanes = hn::Lanes(dd);
  const double specials[] = {0.0,
                             -0.0,
                             1.0 / 3.0,
                             1.0 + 0x1p-24,  // Half-way: to even.
                             1.0 + 0x1p-24 + 0x1p-50,
                             3.4028235677973366e38,  // Past FLT_MAX.
                             1e300,
                             -1e300,
                             1e-46,  // Below half the smallest subnormal.
                             0x1p-149,
                             std::numeric_limits<double>::infinity()};
  std::mt19937_64 gen(3);
  std::vector<double> values(specials, specials + std::size(specials));
  for (int i = 0; i < 4000; ++i) {
    values.push_back(std::ldexp(static_cast<double>(gen() >> 11) * 0x1p-53,
                                static_cast<int>(gen() % 300) - 150));
  }
  std::vector<double> in(lanes);
  std::vector<float> out(lanes);
  for (size_t i = 0; i < values.size(); ++i) {
    std::fill(in.begin(), in.end(), values[i]);
    const auto rounded = RoundToFloat(dd, hn::LoadU(dd, in.data()));
    hn::StoreU(rounded, hn::Rebind<float, decltype(dd)>(), out.data());
    const float want = static_cast<float>(values[i]);
    ASSERT_EQ(std::bit_cast<uint32_t>(out[0]), std::bit_cast<uint32_t>(want))
        << values[i];
  }
}

template <typename T>
void CheckPartialLoadsAndStores() {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  const T sentinel = static_cast<T>(0x55);
  std::vector<T> whole(lanes), loaded(lanes), sink(lanes + 1);
  for (size_t j = 0; j < lanes; ++j) whole[j] = static_cast<T>(j + 1);
  for (size_t count = 0; count < lanes; ++count) {
    SCOPED_TRACE(count);
    // Loads from exactly `count` elements (a sanitizer sees any read past
    // them): those in the first lanes, zeros after them.
    const std::vector<T> source(whole.begin(), whole.begin() + count);
    hn::StoreU(LoadPart(d, source.data(), count), d, loaded.data());
    for (size_t j = 0; j < lanes; ++j) {
      EXPECT_EQ(loaded[j], j < count ? whole[j] : T{0}) << j;
    }
    // Stores: the first `count` lanes, nothing after them.
    std::fill(sink.begin(), sink.end(), sentinel);
    StoreHead(d, hn::LoadU(d, whole.data()), sink.data(), count);
    for (size_t j = 0; j <= lanes; ++j) {
      EXPECT_EQ(sink[j], j < count ? whole[j] : sentinel) << j;
    }
  }
}

void TestPartialLoadsAndStoresTouchOnlyTheirLanes() {
  CheckPartialLoadsAndStores<uint16_t>();
  CheckPartialLoadsAndStores<float>();
  CheckPartialLoadsAndStores<double>();
}

template <int N, typename T>
void CheckFoldArray(std::mt19937_64& gen) {
  std::uniform_real_distribution<T> value(-1e3, 1e3);
  for (int round = 0; round < 200; ++round) {
    T values[N], scalar[N];
    for (int j = 0; j < N; ++j) {
      // Magnitudes far apart, so that another order of additions rounds
      // differently.
      values[j] = value(gen) * (j % 3 == 0 ? T{1e8} : T{1});
      scalar[j] = values[j];
    }
    fold::FoldHalves<N>(scalar);
    const T sum = FoldArray<N>(values);
    ASSERT_EQ(std::memcmp(&sum, &scalar[0], sizeof(T)), 0) << N;
  }
}

void TestFoldsAddInFoldsScalarOrder() {
  std::mt19937_64 gen(11);
  CheckFoldArray<8, double>(gen);
  CheckFoldArray<16, double>(gen);
  CheckFoldArray<32, double>(gen);
  CheckFoldArray<16, float>(gen);
  CheckFoldArray<64, float>(gen);
  std::uniform_real_distribution<float> value(-1e3f, 1e3f);
  float rows[256];
  for (int round = 0; round < 200; ++round) {
    for (int j = 0; j < 256; ++j) {
      rows[j] = value(gen) * (j % 5 == 0 ? 1e6f : 1.0f);
    }
    float got_f[16], want_f[16];
    double got_d[16], want_d[16];
    SixteenRowSums(rows, got_f);
    fold::SixteenRowSums(rows, want_f);
    SixteenRowSums(rows, got_d);
    fold::SixteenRowSums(rows, want_d);
    ASSERT_EQ(std::memcmp(got_f, want_f, sizeof(got_f)), 0);
    ASSERT_EQ(std::memcmp(got_d, want_d, sizeof(got_d)), 0);
  }
}

// Every 16-bit pattern of kType widened on this target against half.h's
// scalar definition (float16 NaNs quieted, as the instructions do).
template <DType kType>
void CheckWidenEveryPattern() {
  const hn::ScalableTag<float> df;
  const HalfBitsTag<decltype(df)> dh;
  const size_t lanes = hn::Lanes(df);
  std::vector<uint16_t> patterns(lanes);
  std::vector<float> out(lanes);
  for (uint32_t first = 0; first < 65536; first += lanes) {
    for (size_t j = 0; j < lanes; ++j) {
      patterns[j] = static_cast<uint16_t>((first + j) & 0xffff);
    }
    hn::StoreU(WidenHalfBits<kType>(df, hn::LoadU(dh, patterns.data())), df,
               out.data());
    for (size_t j = 0; j < lanes; ++j) {
      const float want = HalfToFloat(kType, patterns[j]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(out[j])) << patterns[j];
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(out[j]),
                  std::bit_cast<uint32_t>(want))
            << patterns[j];
      }
    }
  }
}

// fp32 values narrowed on this target against half.h's scalar rounding:
// every 16-bit value, the midpoints between neighbours and one fp32 ulp
// either side of them (to nearest, ties to even), overflow, and NaNs with
// payloads (the canonical NaN).
template <DType kType>
void CheckNarrowAtEveryMidpoint() {
  const hn::ScalableTag<float> df;
  const HalfBitsTag<decltype(df)> dh;
  const size_t lanes = hn::Lanes(df);
  std::vector<float> values;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float v = HalfToFloat(kType, static_cast<uint16_t>(h));
    const float next = HalfToFloat(kType, static_cast<uint16_t>(h + 1));
    values.push_back(v);
    if (std::isfinite(v) && std::isfinite(next) && (h & 0x7fff) != 0x7fff &&
        std::signbit(v) == std::signbit(next)) {
      const float mid = v + (next - v) / 2;
      values.push_back(mid);
      values.push_back(std::nextafter(mid, 0.0f));
      values.push_back(std::nextafter(mid, 2 * mid));
    }
  }
  values.push_back(std::numeric_limits<float>::max());
  values.push_back(std::bit_cast<float>(0x7fc01234u));  // A quiet NaN.
  values.push_back(std::bit_cast<float>(0xff812345u));  // A signalling one.
  while (values.size() % lanes != 0) values.push_back(0.0f);
  std::vector<uint16_t> out(lanes);
  for (size_t i = 0; i < values.size(); i += lanes) {
    hn::StoreU(NarrowToHalfBits<kType>(df, hn::LoadU(df, values.data() + i)),
               dh, out.data());
    for (size_t j = 0; j < lanes; ++j) {
      ASSERT_EQ(out[j], FloatToHalf(kType, values[i + j]))
          << values[i + j] << " (bits " << std::hex
          << std::bit_cast<uint32_t>(values[i + j]) << ")";
    }
  }
}

void TestHalfConversionsEqualTheScalarDefinitions() {
  CheckWidenEveryPattern<DType::kBFloat16>();
  CheckWidenEveryPattern<DType::kFloat16>();
  CheckNarrowAtEveryMidpoint<DType::kBFloat16>();
  CheckNarrowAtEveryMidpoint<DType::kFloat16>();
}

}  // namespace
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {
namespace {

HWY_BEFORE_TEST(SimdOpsTest);
HWY_EXPORT_AND_TEST_P(SimdOpsTest, TestExactMulAddRoundsOnce);
HWY_EXPORT_AND_TEST_P(SimdOpsTest,
                      TestRoundToFloatIsACastThatOverflowsToInfinity);
HWY_EXPORT_AND_TEST_P(SimdOpsTest,
                      TestPartialLoadsAndStoresTouchOnlyTheirLanes);
HWY_EXPORT_AND_TEST_P(SimdOpsTest, TestFoldsAddInFoldsScalarOrder);

HWY_BEFORE_TEST(SimdHalfTest);
HWY_EXPORT_AND_TEST_P(SimdHalfTest,
                      TestHalfConversionsEqualTheScalarDefinitions);

}  // namespace
}  // namespace normd
#endif  // HWY_ONCE
