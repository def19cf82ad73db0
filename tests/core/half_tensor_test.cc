// 16-bit tensors in every mode: within the format's rounding of the fp64
// reference, and bitwise equal across streamed, cached and widened paths.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/engine.h"
#include "server/core/half.h"
#include "server/core/simd/streaming.h"
#include "tests/testing/core_cases.h"
#include "tests/testing/row_affine_calls.h"
#include "tests/testing/simd_targets.h"

namespace normd {
namespace {

using ::normd::testing::ForEachSimdTarget;
using ::normd::testing::GroupCase;
using ::normd::testing::HalfValue;
using ::normd::testing::kU32;
using ::normd::testing::NumElementsOf;
using ::normd::testing::Param;
using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceChannelNormalize;
using ::normd::testing::ReferenceChannelStats;
using ::normd::testing::ReferenceGroupNorm;
using ::normd::testing::ReferenceLayerNorm;
using ::normd::testing::ReferenceRmsNorm;
using ::normd::testing::ResolvedAxis;
using ::normd::testing::View;

// Unit roundoff of the format: the largest relative error of rounding once.
double UnitRoundoff(DType dtype) {
  return dtype == DType::kBFloat16 ? std::ldexp(1, -8) : std::ldexp(1, -11);
}

// Checks a 16-bit output against the fp64 reference of the same (already
// rounded) input: |y - ref| <= u |ref| (the format's rounding) + the fp32
// kernels' error before it + half the smallest subnormal half for results
// that underflow. The fp32 part is reference.h's Fp32OutputBound, 32 u32
// (|y - b| + |w|) + u32 |y|, at most 32 u32 times `magnitude`, a bound on
// |y - b| + |w| + |y| / 32 for the inputs at hand. The format's rounding
// dominates (u is 2^-11 or 2^-8): these checks catch errors of the format's
// ulp, and the fp32 tests the fp32-sized ones.
void ExpectWithinRounding(DType dtype, const std::vector<uint16_t>& y,
                          const std::vector<double>& ref, double magnitude) {
  const double u = UnitRoundoff(dtype);
  const double tiny = dtype == DType::kFloat16 ? std::ldexp(1, -24) : 0.0;
  int bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double got = HalfValue(dtype, y[i]);
    const double bound =
        u * std::abs(ref[i]) + 32 * kU32 * magnitude + tiny / 2;
    if (!(std::abs(got - ref[i]) <= bound) && ++bad < 5) {
      ADD_FAILURE() << DTypeName(dtype) << " element " << i << ": " << got
                    << " vs reference " << ref[i] << " (bound " << bound << ")";
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(HalfTensorTest, EveryModeStaysWithinTheFormatsRounding) {
  Engine engine;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Shape shape = {4, 6, 9, 10};
    const int64_t n = NumElementsOf(shape);
    // Inputs rounded to the format; the reference computes from them.
    const auto wide = RandomValues<double>(n, 17, 2.0, 3.0);
    std::vector<uint16_t> x(n);
    std::vector<double> xv(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = DoubleToHalf(dtype, wide[i]);
      xv[i] = HalfValue(dtype, x[i]);
    }
    const std::vector<double> w6 = {0.5, 1, 1.5, 2, 2.5, 3};
    const std::vector<double> b6 = {-1, 0, 1, 2, 3, 4};
    struct Mode {
      const char* name;
      NormMode mode;
      std::vector<double> reference;
    };
    const std::vector<double> w90(90, 1.25), b90(90, 0.5);
    const Mode modes[] = {
        {"layer_norm", NormMode::kLayerNorm,
         ReferenceLayerNorm(xv, 90, 1e-5, w90, b90)},
        {"rms_norm", NormMode::kRmsNorm,
         ReferenceRmsNorm(xv, 90, 1e-5, w90, b90)},
        {"group_norm", NormMode::kGroupNorm,
         ReferenceGroupNorm(xv, shape, 1, 3, 1e-5, w6, b6)},
        {"instance_norm", NormMode::kInstanceNorm,
         ReferenceGroupNorm(xv, shape, 1, 6, 1e-5, w6, b6)},
    };
    for (const Mode& m : modes) {
      SCOPED_TRACE(m.name);
      NormalizeSpec spec;
      spec.mode = m.mode;
      spec.input = View(x, shape, dtype);
      const bool rows =
          m.mode == NormMode::kLayerNorm || m.mode == NormMode::kRmsNorm;
      if (rows) {
        spec.normalized_ndim = 2;
        AffineParam w = Param(w90), b = Param(b90);
        w.shape = b.shape = {9, 10};
        spec.weight = w;
        spec.bias = b;
      } else {
        spec.weight = Param(w6);
        spec.bias = Param(b6);
      }
      if (m.mode == NormMode::kGroupNorm) spec.num_groups = 3;
      std::vector<uint16_t> y(n);
      ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
      // |x - mean| / sigma <= 4 here, |w| <= 3, |b| <= 4.
      ExpectWithinRounding(dtype, y, m.reference, 4 * 3 + 3 + 16.0 / 32);
    }
    // BatchNorm training and eval, and Fit: statistics as of the rounded
    // input, accumulated in fp32/fp64.
    NormalizeSpec train;
    train.mode = NormMode::kBatchNorm;
    train.model = std::string("bn-") + std::string(DTypeName(dtype));
    train.training = true;
    train.input = View(x, shape, dtype);
    std::vector<uint16_t> y(n);
    auto model = engine.Normalize(train, y.data());
    ASSERT_TRUE(model.ok()) << model.status();
    const auto stats = ReferenceChannelStats(xv, 4, 6, 90);
    ExpectWithinRounding(
        dtype, y,
        ReferenceChannelNormalize(xv, 4, 6, 90, stats.mean, stats.var, 1e-5,
                                  std::vector<double>(6, 1),
                                  std::vector<double>(6, 0)),
        4 + 1 + 4.0 / 32);  // |x - mean| / sigma <= 4, w 1, b 0.
    for (int c = 0; c < 6; ++c) {
      EXPECT_NEAR((*model)->PooledMean()[c], stats.mean[c], 1e-12);
      EXPECT_NEAR((*model)->PooledVariance()[c], stats.var[c],
                  1e-12 * stats.var[c]);
    }
    train.training = false;
    ASSERT_TRUE(engine.Normalize(train, y.data()).ok());
    ExpectWithinRounding(
        dtype, y,
        ReferenceChannelNormalize(
            xv, 4, 6, 90, (*model)->running_mean, (*model)->running_var, 1e-5,
            std::vector<double>(6, 1), std::vector<double>(6, 0)),
        4 + 1 + 4.0 / 32);  // |x - mean| / sigma <= 4, w 1, b 0.
    FitSpec fit;
    fit.model = train.model;
    fit.input = train.input;
    auto fitted = engine.Fit(fit);
    ASSERT_TRUE(fitted.ok());
    EXPECT_EQ(fitted->sample_count, 2 * 4 * 90);
    for (int c = 0; c < 6; ++c) {
      EXPECT_NEAR(fitted->PooledVariance()[c], stats.var[c],
                  1e-12 * stats.var[c]);
    }
  }
}

TEST(HalfTensorTest, ShortAndLongRowsAlike) {
  // Rows up to 64Ki elements go through per-thread fp32 buffers a few rows
  // at a time (LayerNormKernel); longer ones one at a time, in pieces
  // over the threads. Both stay within one rounding of the reference, for
  // every piece boundary.
  Engine engine;
  for (int64_t n : {3, 4096, 5000, 70000, 300000}) {
    SCOPED_TRACE(n);
    const int64_t rows = n > 10000 ? 2 : 37;
    const auto wide = RandomValues<double>(rows * n, 19, -4.0, 2.0);
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      std::vector<uint16_t> x(wide.size());
      std::vector<double> xv(wide.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = DoubleToHalf(dtype, wide[i]);
        xv[i] = HalfValue(dtype, x[i]);
      }
      for (NormMode mode : {NormMode::kLayerNorm, NormMode::kRmsNorm}) {
        NormalizeSpec spec;
        spec.mode = mode;
        spec.input = View(x, {rows, n}, dtype);
        std::vector<uint16_t> y(x.size());
        ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
        ExpectWithinRounding(dtype, y,
                             mode == NormMode::kLayerNorm
                                 ? ReferenceLayerNorm(xv, n, 1e-5, {}, {})
                                 : ReferenceRmsNorm(xv, n, 1e-5, {}, {}),
                             // |y| <= 5.5 for these rows, w 1, b 0.
                             5.5 + 1 + 5.5 / 32);
      }
    }
  }
}

// Per-element weights and biases for rows of n values: ramps of 1000
// distinct values, so that a weight applied to the wrong element shows.
std::pair<std::vector<double>, std::vector<double>> RowWeightsAndBiases(
    int64_t n) {
  std::vector<double> w(n), b(n);
  for (int64_t i = 0; i < n; ++i) {
    w[i] = 0.5 + 0.001 * static_cast<double>(i % 1000);
    b[i] = 0.25 - 0.002 * static_cast<double>(i % 1000);
  }
  return {w, b};
}

// Weights and biases (per channel or per element) that give results of
// every magnitude the 16-bit rounding treats apart, from element 1 on as far
// as the vectors reach: subnormal results (weights 1e-39 and 1e-40:
// bfloat16's subnormals span 9.2e-41 to 1.2e-38, the tests' deviations 0.1
// to 30), zeros (weight and bias 0) and overflows to infinity (weight
// 3.3e38: a third of normally distributed data lies beyond 1.03 standard
// deviations, and a third of the RMSNorm rows' x / rms above 1.03).
void AddExtremeWeights(std::vector<double>& w, std::vector<double>& b) {
  const double weights[] = {1e-39, 1e-40, 0.0, 3.3e38};
  for (size_t k = 0; k < 4 && k + 1 < w.size(); ++k) {
    w[k + 1] = weights[k];
    b[k + 1] = 0.0;
  }
}

// Expects bfloat16 `words` to hold a subnormal, a zero and an infinity
// (the results of AddExtremeWeights).
void ExpectExtremeBFloat16Results(const std::vector<uint16_t>& words) {
  auto has = [&](auto predicate) {
    return std::any_of(words.begin(), words.end(), predicate);
  };
  EXPECT_TRUE(has([](uint16_t v) { return (v & 0x7f80) == 0 && (v & 0x7f); }))
      << "no subnormal";
  EXPECT_TRUE(has([](uint16_t v) { return (v & 0x7fff) == 0; })) << "no zero";
  EXPECT_TRUE(has([](uint16_t v) { return (v & 0x7fff) == 0x7f80; }))
      << "no infinity";
}

// Runs body() on every SIMD target: the 16-bit narrowings are different
// code on each (F16C, the integer steps).
template <typename Body>
void OnEverySimdTarget(const Body& body) {
  ForEachSimdTarget([&](const std::string&) { body(); });
}

// Large 16-bit row outputs are narrowed in registers and streamed out;
// they must carry exactly the bits of the cached path (fp32
// results narrowed by FloatToHalf), for every style, with and without
// affine parameters, at aligned and misaligned outputs, for rows that start
// mid-line, and for rows holding a NaN or an infinity. The rows are
// computed from a widened copy or from the input itself, by where the output
// sits against the input (see ReadsHalfRowsDirectly): the outputs below
// start at 0, 1, 5, 32 and 1029 values past a page-aligned copy of the
// input (1, 5 and 32: less than 512 bytes above, so widened; 1029:
// unaligned, read directly), or on the input itself (in place: read
// directly). The cached rows are those of the default SIMD target; every
// run is compared with them on every target, and the weights give results
// of every magnitude (AddExtremeWeights).
TEST(HalfTensorTest, StreamedRowsEqualCachedRowsBitwise) {
  Engine engine;
  // Page-aligned storage for `count` values.
  auto page_aligned = [](std::vector<uint16_t>& storage, int64_t count) {
    storage.assign(count + 2048, 0x5555);
    const auto address = reinterpret_cast<uintptr_t>(storage.data());
    return storage.data() + (4096 - address % 4096) % 4096 / 2;
  };
  // 32, 64 and 128: short rows sixteen at a time where y is 64-byte aligned
  // (offsets 0, 32 and in place); 48: a row at a time.
  for (int64_t n : {3, 32, 48, 64, 128, 768, 771, 4096, 5000}) {
    const int64_t rows = 40000 / n + 3;
    const auto wide = RandomValues<double>(rows * n, 23, 50.0, 4.0);
    auto [w, b] = RowWeightsAndBiases(n);
    AddExtremeWeights(w, b);
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      std::vector<uint16_t> x(wide.size());
      for (size_t i = 0; i < x.size(); ++i) x[i] = DoubleToHalf(dtype, wide[i]);
      // A NaN row and an infinite row (NaN results: the quieting path).
      x[n + n / 2] = dtype == DType::kBFloat16 ? 0x7f81 : 0x7c01;
      x[2 * n] = dtype == DType::kBFloat16 ? 0xff80 : 0xfc00;
      std::vector<uint16_t> x_storage;
      uint16_t* const x_page = page_aligned(x_storage, x.size());
      std::copy(x.begin(), x.end(), x_page);
      for (const auto& mode_and_style :
           {std::pair{NormMode::kLayerNorm, LayerNormStyle::kPyTorch},
            std::pair{NormMode::kLayerNorm, LayerNormStyle::kBertUnbiasedStd},
            std::pair{NormMode::kRmsNorm, LayerNormStyle::kPyTorch}}) {
        // Not a structured binding: clang 14 cannot capture one.
        const NormMode mode = mode_and_style.first;
        const LayerNormStyle style = mode_and_style.second;
        for (bool affine : {false, true}) {
          NormalizeSpec spec;
          spec.mode = mode;
          spec.layer_norm_style = style;
          spec.input = View(x, {rows, n}, dtype);
          spec.input.data = x_page;
          if (affine) {
            spec.weight = Param(w);
            spec.bias = Param(b);
          }
          // offset -1: in place, in a page-aligned copy of x.
          auto run = [&](int64_t threshold, int64_t offset) {
            SetStreamingOutputBytes(threshold);
            std::vector<uint16_t> storage;
            uint16_t* const y =
                page_aligned(storage, std::max<int64_t>(offset, 0) + x.size()) +
                std::max<int64_t>(offset, 0);
            NormalizeSpec call = spec;
            if (offset < 0) {
              std::copy(x.begin(), x.end(), y);
              call.input.data = y;
            }
            EXPECT_TRUE(engine.Normalize(call, y).ok());
            SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
            return std::vector<uint16_t>(y, y + x.size());
          };
          const std::vector<uint16_t> cached =
              run(std::numeric_limits<int64_t>::max(), 0);
          if (affine && dtype == DType::kBFloat16 && n > 4) {
            ExpectExtremeBFloat16Results(cached);
          }
          OnEverySimdTarget([&] {
            EXPECT_EQ(run(std::numeric_limits<int64_t>::max(), 0), cached);
            EXPECT_EQ(run(std::numeric_limits<int64_t>::max(), -1), cached);
            for (int64_t offset : {0, 1, 5, 32, 1029, -1}) {
              EXPECT_EQ(run(0, offset), cached)
                  << DTypeName(dtype) << " n " << n << " mode "
                  << static_cast<int>(mode) << " style "
                  << static_cast<int>(style) << " affine " << affine
                  << " offset " << offset;
            }
          });
        }
      }
    }
  }
}

// Long 16-bit rows go one at a time, each spread over the threads, when
// there are too few to give every thread several, or when they are longer
// than the per-thread buffers (unless computed from the input directly);
// otherwise whole rows per work item. Both must give the same bits: here 2
// and 8 rows of 40000 and 70000 on one thread (whole rows from 4), cached
// and streamed, with and without weights.
TEST(HalfTensorTest, LongRowsOneAtATimeEqualWholeRowsBitwise) {
  tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism,
                                 1);
  Engine engine;
  for (const int64_t kN : {40000, 70000}) {
    const auto wide = RandomValues<double>(8 * kN, 53, 7.0, 3.0);
    const auto weights_and_biases = RowWeightsAndBiases(kN);
    const std::vector<double>& w = weights_and_biases.first;
    const std::vector<double>& b = weights_and_biases.second;
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      std::vector<uint16_t> x(wide.size());
      for (size_t i = 0; i < x.size(); ++i) x[i] = DoubleToHalf(dtype, wide[i]);
      for (NormMode mode : {NormMode::kLayerNorm, NormMode::kRmsNorm}) {
        for (bool affine : {false, true}) {
          for (int64_t threshold : {int64_t{0}, kDefaultStreamingOutputBytes}) {
            auto run = [&](int64_t rows) {
              NormalizeSpec spec;
              spec.mode = mode;
              spec.input = View(x, {rows, kN}, dtype);
              spec.input.size = rows * kN;
              if (affine) {
                spec.weight = Param(w);
                if (mode == NormMode::kLayerNorm) spec.bias = Param(b);
              }
              SetStreamingOutputBytes(threshold);
              std::vector<uint16_t> y(rows * kN, 0x5555);
              EXPECT_TRUE(engine.Normalize(spec, y.data()).ok());
              SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
              return y;
            };
            const std::vector<uint16_t> all = run(8);
            const std::vector<uint16_t> two = run(2);
            EXPECT_TRUE(std::equal(two.begin(), two.end(), all.begin()))
                << DTypeName(dtype) << " n " << kN << " mode "
                << static_cast<int>(mode) << " affine " << affine
                << " threshold " << threshold;
          }
        }
      }
    }
  }
}

// The 16-bit rows' fp32 affine gives, on every SIMD target, the bits of its
// formula computed one value at a time with std::fma (which rounds once),
// with and without weight / bias, at every tail length, in place too.
TEST(HalfTensorTest, HalfRowAffineIsItsFormulaOnEveryTarget) {
  const auto wide = RandomValues<double>(3 * 67, 41, 100.0, 3.0);
  const std::vector<float> x(wide.begin(), wide.begin() + 67);
  const std::vector<float> w(wide.begin() + 67, wide.begin() + 134);
  const std::vector<float> b(wide.begin() + 134, wide.end());
  const double mean = 100.123456789;
  const auto hi = static_cast<float>(mean);
  const auto lo = static_cast<float>(mean - hi);
  ASSERT_NE(lo, 0.0f);
  const float scale = 0.3f;
  ForEachSimdTarget([&](const std::string&) {
    for (int64_t n : {1, 3, 15, 16, 17, 33, 67}) {
      for (const float* weight :
           {static_cast<const float*>(nullptr), w.data()}) {
        for (const float* bias :
             {static_cast<const float*>(nullptr), b.data()}) {
          std::vector<float> got(n);
          HalfRowAffine(x.data(), got.data(), n, hi, lo, scale, weight, bias);
          std::vector<float> in_place(x.begin(), x.begin() + n);
          HalfRowAffine(in_place.data(), in_place.data(), n, hi, lo, scale,
                        weight, bias);
          for (int64_t j = 0; j < n; ++j) {
            const float t = std::fma(x[j] - hi, scale, -(lo * scale));
            float want = t;
            if (weight != nullptr && bias != nullptr) {
              want = std::fma(t, weight[j], bias[j]);
            } else if (weight != nullptr) {
              want = t * weight[j];
            } else if (bias != nullptr) {
              want = t + bias[j];
            }
            ASSERT_EQ(std::bit_cast<uint32_t>(got[j]),
                      std::bit_cast<uint32_t>(want))
                << "n " << n << " j " << j;
            ASSERT_EQ(std::bit_cast<uint32_t>(in_place[j]),
                      std::bit_cast<uint32_t>(want));
            // And the fp64 value within fp32 rounding: x - hi is exact
            // (Sterbenz), lo * scale and the fma round once each (u |t| +
            // u |lo scale|), the weight's product once more (u |t w|) and
            // the bias's sum once (u |y|), or one fma for both: at most
            // u (2 |t w| + |y| + |w|), |lo scale| being below 1.
            const double centred = (x[j] - mean) * scale;
            const double wj = weight != nullptr ? weight[j] : 1.0;
            double expected = centred * wj;
            if (bias != nullptr) expected += bias[j];
            EXPECT_NEAR(got[j], expected,
                        kU32 * (2 * std::abs(centred * wj) +
                                std::abs(expected) + std::abs(wj)));
          }
        }
      }
    }
  });
}

// Finite inputs whose results are NaN: x - mean overflows fp32 (bfloat16
// values near the largest finite one, times weight 0: -Inf * 0), or the scale
// does (a constant row with eps 1e-300: 0 * Inf). The streamed rows skip the
// canonical-NaN fix-up only for rows that provably give no NaN, so these
// must still come out as the canonical NaN, as on the cached path.
TEST(HalfTensorTest, FiniteInputsWithNaNResultsNarrowToTheCanonicalNaN) {
  Engine engine;
  auto run = [&](const NormalizeSpec& spec, int64_t threshold) {
    SetStreamingOutputBytes(threshold);
    std::vector<uint16_t> y(spec.input.size, 0x5555);
    EXPECT_TRUE(engine.Normalize(spec, y.data()).ok());
    SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
    return y;
  };
  constexpr int64_t kN = 40;  // Longer than a line of 32 values.
  const std::vector<double> zeros(kN, 0.0);
  {
    // Row 0: -max, then max: mean ~ 0.9 max, so -max - mean is -Inf in fp32.
    std::vector<uint16_t> x(2 * kN, 0x3f80);  // Row 1: all 1.0.
    x[0] = 0xff7f;
    for (int64_t i = 1; i < kN; ++i) x[i] = 0x7f7f;
    NormalizeSpec spec;
    spec.mode = NormMode::kLayerNorm;
    spec.input = View(x, {2, kN}, DType::kBFloat16);
    spec.weight = Param(zeros);
    const std::vector<uint16_t> cached =
        run(spec, std::numeric_limits<int64_t>::max());
    EXPECT_EQ(cached[0], 0x7fc0);
    for (int64_t i = 1; i < 2 * kN; ++i) EXPECT_EQ(cached[i], 0) << i;
    EXPECT_EQ(run(spec, 0), cached);
  }
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const uint16_t one = dtype == DType::kBFloat16 ? 0x3f80 : 0x3c00;
    const std::vector<uint16_t> x(kN, one);
    NormalizeSpec spec;
    spec.mode = NormMode::kLayerNorm;
    spec.input = View(x, {1, kN}, dtype);
    spec.eps = 1e-300;  // Valid (> 0), but 1 / sqrt(eps) is Inf in fp32.
    const std::vector<uint16_t> cached =
        run(spec, std::numeric_limits<int64_t>::max());
    EXPECT_EQ(cached, std::vector<uint16_t>(
                          kN, dtype == DType::kBFloat16 ? 0x7fc0 : 0x7e00));
    EXPECT_EQ(run(spec, 0), cached) << DTypeName(dtype);
  }
  // The channel modes: channel (or group) 0 holds -max, then max, with
  // weight 0: x - mean overflows to -Inf and -Inf * 0 is NaN, although every
  // input and parameter is finite (bfloat16 only: float16 values are far
  // from fp32's overflow). Channel 1 is all 1.0 (output 0).
  {
    const DType dtype = DType::kBFloat16;
    const uint16_t max = 0x7f7f;
    const uint16_t one = 0x3f80;
    const uint16_t nan = 0x7fc0;
    struct Case {
      NormMode mode;
      Shape shape;
      int32_t axis;
    };
    for (const Case& c : {Case{NormMode::kGroupNorm, {1, 2, kN}, 1},
                          Case{NormMode::kGroupNorm, {1, kN, 2}, -1},
                          Case{NormMode::kInstanceNorm, {1, 2, kN}, 1},
                          Case{NormMode::kBatchNorm, {kN, 2}, 1}}) {
      const bool last = c.axis == -1;
      std::vector<uint16_t> x(2 * kN, one);
      for (int64_t i = 0; i < kN; ++i) {
        x[last ? 2 * i : i] =
            i == 0 ? static_cast<uint16_t>(max | 0x8000) : max;
      }
      // BatchNorm: channel c of row i is x[2i + c], as channels-last.
      if (c.mode == NormMode::kBatchNorm) {
        for (int64_t i = 0; i < kN; ++i) {
          x[2 * i] = i == 0 ? static_cast<uint16_t>(max | 0x8000) : max;
          x[2 * i + 1] = one;
        }
      }
      NormalizeSpec spec;
      spec.mode = c.mode;
      spec.num_groups = c.mode == NormMode::kGroupNorm ? 2 : 0;
      spec.model = c.mode == NormMode::kBatchNorm ? "nan" : "";
      spec.training = c.mode == NormMode::kBatchNorm;
      spec.channel_axis = c.axis;
      spec.input = View(x, c.shape, dtype);
      spec.weight = Param({0.0, 0.0});
      const std::vector<uint16_t> cached =
          run(spec, std::numeric_limits<int64_t>::max());
      const bool transposed = last || c.mode == NormMode::kBatchNorm;
      EXPECT_EQ(cached[0], nan) << DTypeName(dtype);
      EXPECT_EQ(cached[transposed ? 1 : kN], 0) << DTypeName(dtype);
      EXPECT_EQ(run(spec, 0), cached)
          << DTypeName(dtype) << " mode " << static_cast<int>(c.mode);
    }
  }
}

// One channel-mode case: the mode, its shape and axis, and whether it has a
// model (fitted first) and trains it.
struct ChannelModeCase {
  NormMode mode;
  GroupCase shape;
  bool with_model = false;
  bool training = false;
};

// Every channel mode of a 16-bit tensor (GroupNorm, InstanceNorm stateless
// and with a model, BatchNorm training and eval, Fit) reads the 16-bit values
// in place (ChannelMoments, ChannelAffineKernel): outputs and models
// must be the bits of the whole tensor widened to fp32, run as fp32 and
// narrowed (the test does that through the fp32 API and FloatToHalf), in
// every layout and channel count (the kernels' register paths and their
// per-element fallback), streamed or not, into aligned, unaligned and
// in-place outputs, on every SIMD target, and weights that give results of
// every magnitude (AddExtremeWeights).
void ExpectHalfEqualsWidened(const ChannelModeCase& c) {
  const Shape& shape = c.shape.shape;
  const int64_t channels = shape[ResolvedAxis(c.shape)];
  const int64_t n = NumElementsOf(shape);
  const auto values = RandomValues<double>(n, 37, 50.0, 4.0);
  std::vector<double> w(channels), b(channels);
  for (int64_t ch = 0; ch < channels; ++ch) {
    w[ch] = 1.5 - 0.03 * static_cast<double>(ch);
    b[ch] = -0.25 + 0.05 * static_cast<double>(ch);
  }
  AddExtremeWeights(w, b);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<uint16_t> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = DoubleToHalf(dtype, values[i]);
    std::vector<float> wide(n);
    WidenHalf(dtype, x.data(), wide.data(), n);
    auto spec_for = [&](const InputTensor& input) {
      NormalizeSpec spec;
      spec.mode = c.mode;
      spec.model = c.with_model ? "m" : "";
      spec.training = c.training;
      spec.num_groups = c.shape.groups;
      spec.channel_axis = c.shape.axis;
      spec.input = input;
      spec.weight = Param(w);
      spec.bias = Param(b);
      return spec;
    };
    // A fresh engine with model "m" fitted on `input` (if the case has
    // one), then one Normalize into `output`: its model.
    auto run = [&](const InputTensor& input, void* output) {
      Engine engine;
      if (c.with_model) {
        FitSpec fit;
        fit.model = "m";
        fit.input = input;
        fit.channel_axis = c.shape.axis;
        EXPECT_TRUE(engine.Fit(fit).ok());
      }
      auto result = engine.Normalize(spec_for(input), output);
      EXPECT_TRUE(result.ok()) << result.status();
      return result.ok() ? *result : std::nullopt;
    };
    std::vector<float> y_wide(n);
    const std::optional<BatchNormModel> model_wide =
        run(View(wide, shape), y_wide.data());
    std::vector<uint16_t> expected(n);
    for (int64_t i = 0; i < n; ++i) {
      expected[i] = FloatToHalf(dtype, y_wide[i]);
    }
    if (dtype == DType::kBFloat16 && channels > 4) {
      ExpectExtremeBFloat16Results(expected);
    }
    OnEverySimdTarget([&] {
      for (int64_t threshold : {int64_t{0}, kDefaultStreamingOutputBytes}) {
        for (int64_t offset : {0, 1, -1}) {  // -1: in place.
          SetStreamingOutputBytes(threshold);
          std::vector<uint16_t> buffer = x;
          buffer.insert(buffer.begin(), offset > 0 ? offset : 0, 0x5555);
          uint16_t* y = buffer.data() + std::max<int64_t>(offset, 0);
          const std::optional<BatchNormModel> model = run(
              offset < 0 ? View(buffer, shape, dtype) : View(x, shape, dtype),
              y);
          SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
          const std::string what = absl::StrCat(
              DTypeName(dtype), " mode ", static_cast<int>(c.mode), " C ",
              channels, " streamed ", threshold == 0, " offset ", offset);
          EXPECT_EQ(std::vector<uint16_t>(y, y + n), expected) << what;
          ASSERT_EQ(model.has_value(), model_wide.has_value()) << what;
          if (model.has_value()) {
            EXPECT_EQ(model->running_mean, model_wide->running_mean) << what;
            EXPECT_EQ(model->running_var, model_wide->running_var) << what;
            ASSERT_EQ(model->pooled.size(), model_wide->pooled.size());
            for (size_t k = 0; k < model->pooled.size(); ++k) {
              EXPECT_EQ(model->pooled[k].mean, model_wide->pooled[k].mean);
              EXPECT_EQ(model->pooled[k].m2, model_wide->pooled[k].m2);
            }
          }
        }
      }
    });
  }
}

TEST(HalfTensorTest, StatelessGroupModesEqualWholeTensorWidenedBitwise) {
  const ChannelModeCase cases[] = {
      {NormMode::kGroupNorm, {{6, 8, 40, 41}, 1, 4}},  // Contiguous groups.
      {NormMode::kInstanceNorm, {{3, 5, 70, 300}, 1, 0}},
      {NormMode::kGroupNorm, {{9, 30, 31, 16}, -1, 4}},  // Channels-last.
      {NormMode::kInstanceNorm, {{4, 20, 21, 24}, -1, 0}},
      {NormMode::kGroupNorm, {{2, 33, 35, 64}, -1, 32}},
      {NormMode::kGroupNorm, {{16, 5, 7, 48}, -1, 16}},  // Sample per task.
      // Samples per task: written while the next is read (one 64-channel
      // tile), or backwards (two tiles).
      {NormMode::kGroupNorm, {{10, 9, 11, 64}, -1, 16}},
      {NormMode::kInstanceNorm, {{9, 6, 7, 128}, -1, 0}},
      {NormMode::kInstanceNorm, {{5, 11, 13, 5}, -1, 0}},
      {NormMode::kGroupNorm, {{5, 3, 6, 200}, 2, 3}},  // Axis 2.
      // Runs of 16-255 values: lines across runs (5x5, 4x4).
      {NormMode::kInstanceNorm, {{20, 8, 5, 5}, 1, 0}},
      {NormMode::kGroupNorm, {{16, 8, 4, 4}, 1, 4}},
  };
  for (const ChannelModeCase& c : cases) ExpectHalfEqualsWidened(c);
}

TEST(HalfTensorTest, ModelModesEqualWholeTensorWidenedBitwise) {
  const ChannelModeCase cases[] = {
      {NormMode::kBatchNorm, {{4, 6, 30, 30}, 1, 0}, true, false},
      {NormMode::kBatchNorm, {{4, 30, 30, 64}, -1, 0}, true, false},
      {NormMode::kBatchNorm, {{3, 7, 300}, 1, 0}, true, true},
      {NormMode::kBatchNorm, {{4, 30, 9, 24}, -1, 0}, true, true},
      {NormMode::kInstanceNorm, {{3, 5, 20, 20}, 1, 0}, true, true},
      {NormMode::kInstanceNorm, {{3, 20, 20, 12}, -1, 0}, true, false},
      // Runs of 16-255 values: lines across runs (7x7, 15x17).
      {NormMode::kBatchNorm, {{40, 16, 7, 7}, 1, 0}, true, false},
      {NormMode::kBatchNorm, {{40, 16, 7, 7}, 1, 0}, true, true},
      {NormMode::kBatchNorm, {{9, 5, 15, 17}, 1, 0}, true, false},
  };
  for (const ChannelModeCase& c : cases) ExpectHalfEqualsWidened(c);
}

TEST(HalfTensorTest, StreamedWidenedModesEqualCachedBitwise) {
  Engine engine;
  const Shape shape = {3, 8, 17, 19};
  const int64_t n = NumElementsOf(shape);
  const auto wide = RandomValues<double>(n, 31, -3.0, 2.0);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = DoubleToHalf(dtype, wide[i]);
    x[7] = dtype == DType::kBFloat16 ? 0x7f81 : 0x7c01;  // A NaN group.
    for (NormMode mode : {NormMode::kGroupNorm, NormMode::kInstanceNorm}) {
      NormalizeSpec spec;
      spec.mode = mode;
      spec.num_groups = mode == NormMode::kGroupNorm ? 4 : 0;
      spec.input = View(x, shape, dtype);
      auto run = [&](int64_t threshold, int64_t offset) {
        SetStreamingOutputBytes(threshold);
        std::vector<uint16_t> y(n + offset, 0x5555);
        EXPECT_TRUE(engine.Normalize(spec, y.data() + offset).ok());
        SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
        return std::vector<uint16_t>(y.begin() + offset, y.end());
      };
      const std::vector<uint16_t> cached =
          run(std::numeric_limits<int64_t>::max(), 0);
      EXPECT_EQ(cached[7], dtype == DType::kBFloat16 ? 0x7fc0 : 0x7e00);
      for (int64_t offset : {0, 1, 3}) {
        EXPECT_EQ(run(0, offset), cached)
            << DTypeName(dtype) << " mode " << static_cast<int>(mode)
            << " offset " << offset;
      }
    }
  }
}

TEST(HalfTensorTest, SpecialValuesPassThroughLayerNorm) {
  // Inf/NaN in a row make that row NaN (IEEE, as PyTorch); other rows are
  // unaffected; values beyond the format after scaling become infinity.
  Engine engine;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const uint16_t inf = dtype == DType::kBFloat16 ? 0x7f80 : 0x7c00;
    std::vector<uint16_t> x = {inf, FloatToHalf(dtype, 1.0f),
                               FloatToHalf(dtype, 1.0f),
                               FloatToHalf(dtype, 3.0f)};
    NormalizeSpec spec;
    spec.mode = NormMode::kLayerNorm;
    spec.input = View(x, {2, 2}, dtype);
    std::vector<uint16_t> y(4);
    ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
    EXPECT_TRUE(std::isnan(HalfValue(dtype, y[0])));
    EXPECT_NEAR(HalfValue(dtype, y[2]), -1.0, UnitRoundoff(dtype));
    EXPECT_NEAR(HalfValue(dtype, y[3]), 1.0, UnitRoundoff(dtype));
  }
}

}  // namespace
}  // namespace normd
