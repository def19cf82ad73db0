// GroupNorm, InstanceNorm (stateless and with running statistics), RMSNorm
// and the 16-bit dtypes, against independent references: long-double
// definitions (tests/reference.h), numbers worked by hand, and conversion
// tables built from the formats' definitions with ldexp.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/engine.h"
#include "server/core/half.h"
#include "server/core/half_avx512.h"
#include "server/core/kernels.h"
#include "server/core/moments.h"
#include "server/core/simd.h"
#include "server/core/stream_copy.h"
#include "tests/input_view.h"
#include "tests/reference.h"

namespace normd {
namespace {

using ::normd::testing::DTypeOf;
using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceChannelNormalize;
using ::normd::testing::ReferenceChannelStats;
using ::normd::testing::ReferenceGroupNorm;
using ::normd::testing::ReferenceLayerNorm;
using ::normd::testing::ReferenceRmsNorm;
using ::normd::testing::RelErr;
using ::normd::testing::View;

AffineParam Param(std::vector<double> values) {
  AffineParam p;
  p.shape = {static_cast<int64_t>(values.size())};
  p.values = std::move(values);
  return p;
}

template <typename T>
double MaxAbsDiff(const std::vector<T>& y, const std::vector<double>& ref) {
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(y[i]) - ref[i]));
  }
  return worst;
}

// ---- 16-bit formats, from their definitions -------------------------------

// The value of a 16-bit floating-point pattern with `exponent_bits` and
// `mantissa_bits`, computed from the format's fields with ldexp
// (independent of the bit tricks in half.h).
double PatternValue(uint16_t h, int exponent_bits, int mantissa_bits) {
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
double HalfValue(DType dtype, uint16_t h) {
  return dtype == DType::kBFloat16 ? PatternValue(h, 8, 7)
                                   : PatternValue(h, 5, 10);
}

// The correctly rounded (nearest, ties to the even pattern) 16-bit pattern
// of a finite or infinite v, by search in the table of every finite
// non-negative value of the format.
class NearestHalf {
 public:
  explicit NearestHalf(DType dtype) : dtype_(dtype) {
    const uint16_t infinity = dtype == DType::kBFloat16 ? 0x7f80 : 0x7c00;
    for (uint16_t h = 0; h < infinity; ++h) {
      codes_.push_back(h);
      values_.push_back(HalfValue(dtype, h));
    }
    // Rounding treats infinity as the next value after the largest finite.
    const double top = values_.back();
    const double step = top - values_[values_.size() - 2];
    codes_.push_back(infinity);
    values_.push_back(top + step);
  }

  uint16_t operator()(double v) const {
    const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
    const double a = std::abs(v);
    if (a >= values_.back()) return sign | codes_.back();
    const size_t hi = std::upper_bound(values_.begin(), values_.end(), a) -
                      values_.begin();  // values_[hi - 1] <= a < values_[hi].
    const size_t lo = hi - 1;
    const double below = a - values_[lo];
    const double above = values_[hi] - a;
    size_t pick = below < above ? lo : hi;
    if (below == above) pick = (codes_[lo] & 1) == 0 ? lo : hi;
    return sign | codes_[pick];
  }

 private:
  DType dtype_;
  std::vector<uint16_t> codes_;
  std::vector<double> values_;
};

TEST(HalfTest, WideningIsExactForEveryPattern) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> all(65536);
    for (int h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
    std::vector<float> wide(all.size());
    WidenHalf(dtype, all.data(), wide.data(), 65536);
    for (int h = 0; h < 65536; ++h) {
      const double expected = HalfValue(dtype, static_cast<uint16_t>(h));
      // The bulk form (CPU instructions where there are some) and the
      // portable scalar one.
      const float scalar = HalfToFloat(dtype, static_cast<uint16_t>(h));
      if (std::isnan(expected)) {
        ASSERT_TRUE(std::isnan(wide[h])) << DTypeName(dtype) << " " << h;
        ASSERT_TRUE(std::isnan(scalar)) << DTypeName(dtype) << " " << h;
        continue;
      }
      ASSERT_EQ(static_cast<double>(wide[h]), expected)
          << DTypeName(dtype) << " " << h;
      ASSERT_EQ(std::signbit(wide[h]), std::signbit(expected));
      ASSERT_EQ(std::bit_cast<uint32_t>(scalar),
                std::bit_cast<uint32_t>(wide[h]));
    }
  }
}

TEST(HalfTest, NarrowingRoundsToNearestEven) {
  std::mt19937 gen(7);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const NearestHalf nearest(dtype);
    std::vector<float> probes;
    // Random bit patterns (every exponent, so overflow, subnormals, zeros).
    for (int i = 0; i < 1'000'000; ++i) {
      const float f = std::bit_cast<float>(static_cast<uint32_t>(gen()));
      if (!std::isnan(f)) probes.push_back(f);
    }
    // Every exact midpoint between neighbours, and the floats either side.
    const uint16_t infinity = dtype == DType::kBFloat16 ? 0x7f80 : 0x7c00;
    for (uint16_t h = 0; h < infinity; ++h) {
      const float mid =
          static_cast<float>((HalfValue(dtype, h) +
                              (h + 1 == infinity ? 2 * HalfValue(dtype, h) -
                                                       HalfValue(dtype, h - 1)
                                                 : HalfValue(dtype, h + 1))) /
                             2);
      for (float f :
           {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
        probes.push_back(f);
        probes.push_back(-f);
      }
    }
    std::vector<uint16_t> out(probes.size());
    NarrowToHalf(dtype, probes.data(), out.data(),
                 static_cast<int64_t>(probes.size()));
    for (size_t i = 0; i < probes.size(); ++i) {
      ASSERT_EQ(out[i], nearest(probes[i]))
          << "value " << probes[i] << " bits " << std::hex
          << std::bit_cast<uint32_t>(probes[i]);
      ASSERT_EQ(FloatToHalf(dtype, probes[i]), out[i]);
    }
    // Every NaN (quiet or signalling, either sign, any payload) becomes the
    // one canonical quiet NaN, in bulk (vector lanes and tails) and alone.
    const uint16_t canonical = dtype == DType::kBFloat16 ? 0x7fc0 : 0x7e00;
    std::vector<float> nans;
    for (uint32_t bits : {0x7f800001u, 0x7fc00000u, 0xffc00000u, 0x7fffffffu,
                          0xffffffffu, 0x7fc12345u, 0xff80ffffu}) {
      for (int copies = 0; copies < 6; ++copies) {
        nans.push_back(std::bit_cast<float>(bits));
      }
    }
    std::vector<uint16_t> narrowed(nans.size());
    NarrowToHalf(dtype, nans.data(), narrowed.data(),
                 static_cast<int64_t>(nans.size()));
    std::vector<uint16_t> streamed(nans.size());
    NarrowToHalfStreaming(dtype, nans.data(), streamed.data(),
                          static_cast<int64_t>(nans.size()));
    for (size_t i = 0; i < nans.size(); ++i) {
      EXPECT_EQ(narrowed[i], canonical) << std::bit_cast<uint32_t>(nans[i]);
      EXPECT_EQ(streamed[i], canonical) << std::bit_cast<uint32_t>(nans[i]);
      EXPECT_EQ(FloatToHalf(dtype, nans[i]), canonical);
    }
    EXPECT_EQ(DoubleToHalf(dtype, -std::numeric_limits<double>::quiet_NaN()),
              canonical);
  }
}

// The start-up log's kernel line names what the kernels use: BF16 exactly
// when they may use it, and why not when the CPU has it but it is off.
TEST(HalfTest, KernelInstructionSetNamesWhatTheKernelsUse) {
  const std::string used = KernelInstructionSet();
  if (!CpuHasAvx512F()) {
    EXPECT_EQ(used, "compiled loops (no AVX-512)");
  } else if (!CpuHasAvx512Bw()) {
    EXPECT_EQ(used, "AVX-512F");
  } else if (CpuHasAvx512Bf16()) {
    EXPECT_EQ(used, "AVX-512 (F, BW, BF16)");
    AllowAvx512Bf16ForTesting(false);
    EXPECT_EQ(KernelInstructionSet(), "AVX-512 (F, BW)");
    AllowAvx512Bf16ForTesting(true);
  } else if (CpuSupportsAvx512Bf16()) {
    EXPECT_TRUE(Avx512Bf16TurnedOff());
    EXPECT_EQ(used, "AVX-512 (F, BW; BF16 off: NORMD_NO_AVX512_BF16)");
  } else {
    EXPECT_EQ(used, "AVX-512 (F, BW)");
  }
}

#ifdef NORMD_HALF_AVX512
// The four in-register bfloat16 narrowings of 32 floats (natural and pair
// order, the integer rounding and the AVX512-BF16 one) on `f`, as 32 words
// in natural order each.
template <bool kCanonicalNaN>
[[gnu::target(
    "avx512f,avx512bw,avx512bf16")]] std::array<std::array<uint16_t, 32>, 4>
BFloat16NarrowingsOf(const float* f) {
  const __m512 low = _mm512_loadu_ps(f);
  const __m512 high = _mm512_loadu_ps(f + 16);
  // Pair order: even lanes hold values 0, 2, .., 30, odd ones 1, 3, .., 31.
  alignas(64) static constexpr int32_t kEven[16] = {
      0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  alignas(64) static constexpr int32_t kOdd[16] = {
      1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  const __m512 even =
      _mm512_permutex2var_ps(low, _mm512_load_si512(kEven), high);
  const __m512 odd = _mm512_permutex2var_ps(low, _mm512_load_si512(kOdd), high);
  const __m512i words[4] = {
      BFloat16x32<kCanonicalNaN>(low, high),
      BFloat16x32Avx512Bf16<kCanonicalNaN>(low, high),
      NarrowBFloat16Pair<kCanonicalNaN>(even, odd),
      NarrowBFloat16PairAvx512Bf16<kCanonicalNaN>(even, odd)};
  std::array<std::array<uint16_t, 32>, 4> out;
  for (int k = 0; k < 4; ++k) {
    _mm512_storeu_si512(out[k].data(), words[k]);
  }
  return out;
}

// The AVX512-BF16 rounding (which flushes subnormals and keeps NaN
// payloads) must give FloatToBFloat16's bits for every float: every upper
// half (sign, exponent, 7 mantissa bits) with lower halves at and around
// the rounding midpoint, so every exponent, zeros, subnormals, overflow,
// infinities and NaNs (the last only with the canonical-NaN fix-up, which
// the kernels skip only when no result can be NaN).
TEST(HalfTest, Avx512Bf16RoundingEqualsIntegerRoundingForEveryExponent) {
  if (!CpuHasAvx512Bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 gen(11);
  std::vector<float> probes;
  for (uint32_t upper = 0; upper < 0x10000; ++upper) {
    for (uint32_t lower : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu,
                           static_cast<uint32_t>(gen() & 0xffff)}) {
      probes.push_back(std::bit_cast<float>(upper << 16 | lower));
    }
  }
  std::shuffle(probes.begin(), probes.end(), gen);  // Mix classes per line.
  probes.resize(probes.size() / 32 * 32);
  int64_t lines_with_special = 0;
  for (size_t i = 0; i < probes.size(); i += 32) {
    const float* f = probes.data() + i;
    const auto canonical = BFloat16NarrowingsOf<true>(f);
    bool has_nan = false;
    for (int j = 0; j < 32; ++j) {
      const uint16_t expected = FloatToBFloat16(f[j]);
      has_nan |= std::isnan(f[j]);
      for (int k = 0; k < 4; ++k) {
        ASSERT_EQ(canonical[k][j], expected)
            << "narrowing " << k << " bits " << std::hex
            << std::bit_cast<uint32_t>(f[j]);
      }
    }
    lines_with_special += has_nan;
    if (has_nan) continue;
    const auto plain = BFloat16NarrowingsOf<false>(f);
    for (int k = 0; k < 4; ++k) ASSERT_EQ(plain[k], canonical[0]) << k;
  }
  // Lines of ordinary values, so that the instruction's own result is used.
  const auto ordinary = RandomValues<float>(3200, 5, 1.0, 100.0);
  for (size_t i = 0; i < ordinary.size(); i += 32) {
    const auto words = BFloat16NarrowingsOf<true>(ordinary.data() + i);
    for (int j = 0; j < 32; ++j) {
      ASSERT_EQ(words[1][j], FloatToBFloat16(ordinary[i + j]));
      ASSERT_EQ(words[3][j], FloatToBFloat16(ordinary[i + j]));
    }
  }
  EXPECT_GT(lines_with_special, 0);
}
#endif  // NORMD_HALF_AVX512

TEST(HalfTest, StreamingNarrowingWritesTheSameBits) {
  // Every head alignment and length around the 32-element lines.
  const auto x = RandomValues<float>(300, 13, 0.0, 1e3);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (int64_t offset = 0; offset < 40; ++offset) {
      for (int64_t n : {0, 1, 31, 32, 33, 64, 95, 200}) {
        std::vector<uint16_t> plain(300, 7), streamed(300, 7);
        NarrowToHalf(dtype, x.data(), plain.data() + offset, n);
        NarrowToHalfStreaming(dtype, x.data(), streamed.data() + offset, n);
        ASSERT_EQ(plain, streamed)
            << DTypeName(dtype) << " offset " << offset << " n " << n;
      }
    }
  }
}

TEST(HalfTest, WideningWithMomentsEqualsWideningThenMomentsBitwise) {
  // HalfMoments (no widened copy left behind) too.
  // Lengths around the 64-value steps, the 1024-value flushes, the 32-value
  // shift sample and the kMomentsBlock-value blocks; data near and far (1e4)
  // from 0, and a block whose first values sit far from the rest (the exact
  // path).
  constexpr int64_t kB = kMomentsBlock;
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{31}, int64_t{32},
                    int64_t{33}, int64_t{63}, int64_t{64}, int64_t{65},
                    int64_t{1023}, int64_t{1024}, int64_t{1025}, int64_t{4096},
                    int64_t{4171}, kB - 1, kB, kB + 1, 2 * kB + 30000}) {
    for (double offset : {0.0, 1e4}) {
      auto wide = RandomValues<double>(n, 29, offset, 3.0);
      if (n > 2000) {
        for (int64_t i = 0; i < 32; ++i) wide[i] += 200.0;
      }
      for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
        std::vector<uint16_t> x(n);
        for (int64_t i = 0; i < n; ++i) x[i] = DoubleToHalf(dtype, wide[i]);
        std::vector<float> fused(n + 1, -1.0f), plain(n + 1, -1.0f);
        const Moments got = WidenWithMoments(dtype, x.data(), fused.data(), n);
        std::vector<float> scratch(n);
        const Moments unstored =
            HalfMoments(dtype, x.data(), scratch.data(), n);
        WidenHalf(dtype, x.data(), plain.data(), n);
        const Moments want = ContiguousMoments(plain.data(), n);
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " n " << n << " offset " << offset);
        EXPECT_EQ(fused, plain);
        for (const Moments* m : {&got, &unstored}) {
          EXPECT_EQ(m->count, want.count);
          EXPECT_EQ(std::bit_cast<uint64_t>(m->mean),
                    std::bit_cast<uint64_t>(want.mean));
          EXPECT_EQ(std::bit_cast<uint64_t>(m->m2),
                    std::bit_cast<uint64_t>(want.m2));
        }
      }
    }
  }
}

// The fp64 sums of the 64 lanes are usually exact, so their fold order
// rarely shows; here it does. Lane 0 of every 64 values holds 2^52, lane 1
// -2^52, lanes 2 and 3 hold 0.5 (the shift is 0): over 16 Ki values the
// lane sums are 2^60, -2^60, 128, 128, and the fold FoldHalves does, (2^60 +
// 128) + (-2^60 + 128), is 128 (a tie to even, then exact), where pairing
// lanes 0 and 1 first would give 256. The 16-bit statistics keep their
// lanes in registers in another order (bfloat16 pairs: even and odd values
// apart) and must fold them as the fp32 path does.
TEST(HalfTest, LaneSumsFoldInTheOrderOfTheFp32Path) {
  constexpr int64_t kN = 16384;
  std::vector<uint16_t> x(kN);
  for (int64_t i = 0; i < kN; ++i) {
    const int64_t lane = i % 64;
    const double v = lane == 0   ? std::ldexp(1, 52)
                     : lane == 1 ? -std::ldexp(1, 52)
                     : lane < 4  ? 0.5
                                 : 0.0;
    x[i] = DoubleToHalf(DType::kBFloat16, v);
  }
  std::vector<float> plain(kN);
  WidenHalf(DType::kBFloat16, x.data(), plain.data(), kN);
  const Moments want = ContiguousMoments(plain.data(), kN);
  ASSERT_EQ(want.mean, 128.0 / kN);  // The fold above, not 256 / kN.
  std::vector<float> fused(kN);
  const Moments stored =
      WidenWithMoments(DType::kBFloat16, x.data(), fused.data(), kN);
  const ChannelLayout run{1, 1, kN};
  const Moments in_place =
      HalfChannelMoments(DType::kBFloat16, x.data(), run)[0];
  const Moments fp32 = ChannelMoments(plain.data(), run)[0];
  for (const Moments* got : {&stored, &in_place, &fp32}) {
    EXPECT_EQ(std::bit_cast<uint64_t>(got->mean),
              std::bit_cast<uint64_t>(want.mean));
    EXPECT_EQ(std::bit_cast<uint64_t>(got->m2),
              std::bit_cast<uint64_t>(want.m2));
  }
}

// `wide` rounded to `dtype` (fp32 or a 16-bit format): the tensor the
// kernels read (f or h) and the values it holds, for the fp64 reference.
struct TypedValues {
  TypedValues(DType type, const std::vector<double>& wide)
      : dtype(type), f(wide.size()), h(wide.size()), values(wide.size()) {
    for (size_t i = 0; i < wide.size(); ++i) {
      if (dtype == DType::kFloat32) {
        f[i] = static_cast<float>(wide[i]);
        values[i] = f[i];
      } else {
        h[i] = DoubleToHalf(dtype, wide[i]);
        values[i] = HalfValue(dtype, h[i]);
      }
    }
  }
  const void* data() const {
    return dtype == DType::kFloat32 ? static_cast<const void*>(f.data())
                                    : static_cast<const void*>(h.data());
  }
  DType dtype;
  std::vector<float> f;
  std::vector<uint16_t> h;
  std::vector<double> values;
};

// Channels-last blocks that take two tiles or more (64-channel register
// tiles and narrow tiles of 32, 16, .., 1 channels: 48, 96, 128+ channels)
// are reduced rows first (each row read whole, for memory's sake), the
// others in their one tile; every channel must get the same bits either
// way: here each tile's channels (64 at a time, then 32, 16, .., 1 of the
// rest) are copied out into a tensor of their own, which its one tile
// reduces, and compared with the wide reduction, hand-written and compiled,
// for fp32 and 16-bit data. One row block either way (at most 256 rows of
// 1024 channels), so the blocks' merges agree. The fp32 moments are also within
// a few fp32 roundings (5e-7) of the fp64 reference: these blocks are short
// (the spec's 1e-7 bar, for 1e7 values a channel, is AccuracyTest's).
TEST(HalfTest, ChannelsLastRowsFirstEqualTilesBitwise) {
  for (int64_t channels : {48, 96, 128, 200, 240, 256, 1023}) {
    for (int64_t outer : {40, 250}) {
      for (bool far : {false, true}) {
        const ChannelLayout layout{outer, channels, 1};
        const int64_t n = layout.NumElements();
        for (DType dtype :
             {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
          // 16-bit data far from 0 at 100: at 1e4 their spacing (8 or 64)
          // leaves some channels constant, and a constant channel sends its
          // whole block to the exact fallback, narrow or wide alike.
          const double offset = !far                       ? 2.0
                                : dtype == DType::kFloat32 ? 1e4
                                                           : 100.0;
          SCOPED_TRACE(::testing::Message()
                       << DTypeName(dtype) << " [" << outer << ", " << channels
                       << "] offset " << offset);
          const TypedValues typed(
              dtype,
              RandomValues<double>(n, 17 + channels + outer, offset, 3.0));
          // Channels [c0, c0 + width) as a tensor of their own.
          auto part = [&](int64_t c0, int64_t width, bool hand_written) {
            std::vector<float> pf(outer * width);
            std::vector<uint16_t> ph(outer * width);
            for (int64_t r = 0; r < outer; ++r) {
              for (int64_t c = 0; c < width; ++c) {
                pf[r * width + c] = typed.f[r * channels + c0 + c];
                ph[r * width + c] = typed.h[r * channels + c0 + c];
              }
            }
            const void* px = dtype == DType::kFloat32
                                 ? static_cast<const void*>(pf.data())
                                 : static_cast<const void*>(ph.data());
            return ShortRunChannelMoments(
                dtype, px, ChannelLayout{outer, width, 1}, hand_written);
          };
          const void* x = typed.data();
          for (bool hand_written : {true, false}) {
            SCOPED_TRACE(hand_written ? "hand-written" : "compiled");
            const auto all =
                ShortRunChannelMoments(dtype, x, layout, hand_written);
            ASSERT_EQ(all.size(), static_cast<size_t>(channels));
            for (int64_t c0 = 0, width = 64; c0 < channels; c0 += width) {
              while (c0 + width > channels) width /= 2;
              const auto alone = part(c0, width, hand_written);
              for (int64_t c = 0; c < width; ++c) {
                EXPECT_EQ(all[c0 + c].count, outer);
                EXPECT_EQ(std::bit_cast<uint64_t>(all[c0 + c].mean),
                          std::bit_cast<uint64_t>(alone[c].mean))
                    << c0 + c;
                EXPECT_EQ(std::bit_cast<uint64_t>(all[c0 + c].m2),
                          std::bit_cast<uint64_t>(alone[c].m2))
                    << c0 + c;
              }
            }
            if (dtype == DType::kFloat32) {
              const auto ref =
                  ReferenceChannelStats(typed.values, outer, channels, 1);
              for (int64_t c = 0; c < channels; ++c) {
                EXPECT_LE(RelErr(all[c].BiasedVariance(), ref.var[c]), 5e-7)
                    << c;
                EXPECT_LE(std::abs(all[c].mean - ref.mean[c]),
                          1e-12 * std::abs(ref.mean[c]) +
                              1e-7 * std::sqrt(ref.var[c]))
                    << c;
              }
            }
          }
        }
      }
    }
  }
}

// Channels in short runs (1 <= inner < 256) are reduced in row blocks with
// hand-written AVX-512 loops (channels-last register tiles; for runs of 16
// values or more, fp64 lanes per run) and, on other CPUs, compiled ones:
// both must give the same bits, for fp32 and 16-bit data, ragged run
// lengths, data far from 0, and a shift sample far from the mean (the exact
// fallback); and the runs' fp64 sums must be the fp64 moments. (On a CPU
// without AVX-512 both sides run the same loops.)
TEST(HalfTest, ShortRunMomentsHandWrittenEqualCompiledBitwise) {
  for (int64_t inner : {1, 16, 17, 49, 64, 100, 196, 255}) {
    for (int64_t channels : {3, 64, 70}) {
      for (int64_t outer : {5, 40}) {
        for (double offset : {2.0, 1e4}) {
          const ChannelLayout layout{outer, channels, inner};
          const int64_t n = layout.NumElements();
          auto wide =
              RandomValues<double>(n, 31 + inner + channels, offset, 3.0);
          if (outer == 40 && inner >= 16) {
            // Channel 1's shift sample (its first 32 values) far off.
            for (int64_t i = 0; i < 16; ++i) wide[inner + i] += 5000.0;
          }
          for (DType dtype :
               {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
            const TypedValues typed(dtype, wide);
            const std::vector<double>& values = typed.values;
            const void* x = typed.data();
            SCOPED_TRACE(::testing::Message()
                         << DTypeName(dtype) << " [" << outer << ", "
                         << channels << ", " << inner << "] offset " << offset);
            const auto hand = ShortRunChannelMoments(dtype, x, layout, true);
            const auto loop = ShortRunChannelMoments(dtype, x, layout, false);
            const auto ref =
                ReferenceChannelStats(values, outer, channels, inner);
            ASSERT_EQ(hand.size(), static_cast<size_t>(channels));
            ASSERT_EQ(loop.size(), static_cast<size_t>(channels));
            for (int64_t c = 0; c < channels; ++c) {
              EXPECT_EQ(hand[c].count, outer * inner);
              EXPECT_EQ(std::bit_cast<uint64_t>(hand[c].mean),
                        std::bit_cast<uint64_t>(loop[c].mean))
                  << c;
              EXPECT_EQ(std::bit_cast<uint64_t>(hand[c].m2),
                        std::bit_cast<uint64_t>(loop[c].m2))
                  << c;
              if (inner >= 16) {
                EXPECT_NEAR(
                    hand[c].mean, ref.mean[c],
                    1e-13 * (std::abs(ref.mean[c]) + std::sqrt(ref.var[c])))
                    << c;
                EXPECT_NEAR(hand[c].BiasedVariance(), ref.var[c],
                            1e-12 * ref.var[c])
                    << c;
              }
            }
          }
        }
      }
    }
  }
}

TEST(HalfTest, DoublesAreRoundedOnceNotTwice) {
  // 1 + 2^-11 + 2^-30 lies just above the float16 midpoint between 1 and
  // 1 + 2^-10; via float it would become the midpoint and round to 1.
  EXPECT_EQ(DoubleToHalf(DType::kFloat16,
                         1 + std::ldexp(1, -11) + std::ldexp(1, -30)),
            0x3c01);
  EXPECT_EQ(DoubleToHalf(DType::kBFloat16,
                         1 + std::ldexp(1, -8) + std::ldexp(1, -40)),
            0x3f81);
  std::mt19937_64 gen(11);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const NearestHalf nearest(dtype);
    for (int i = 0; i < 200'000; ++i) {
      const double v = std::bit_cast<double>(gen());
      if (std::isnan(v)) continue;
      ASSERT_EQ(DoubleToHalf(dtype, v), nearest(v)) << v;
    }
  }
}

// ---- GroupNorm and stateless InstanceNorm ---------------------------------

struct GroupCase {
  Shape shape;
  int32_t axis;  // As sent; 1 = NCHW, -1 = channels-last.
  int64_t groups;
};

int ResolvedAxis(const GroupCase& c) {
  return c.axis < 0 ? static_cast<int>(c.shape.size()) + c.axis : c.axis;
}

int64_t NumElementsOf(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Every case twice: as the machine runs it, and on one thread, where the
// batches of 4 or more samples of several rows (the last three cases) take
// the one-sample-per-task path (FusedGroupSamples).
template <typename T>
void CheckGroupNorm(NormMode mode, double tolerance) {
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
      EXPECT_LE(MaxAbsDiff(y, ref), tolerance);
      // Without affine parameters: plain normalized values.
      spec.weight.reset();
      spec.bias.reset();
      ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
      EXPECT_LE(MaxAbsDiff(y, ReferenceGroupNorm(x, c.shape, axis, groups, 1e-5,
                                                 {}, {})),
                tolerance);
    }
  }
}

TEST(GroupNormTest, MatchesReferenceInEveryLayoutFloat32) {
  CheckGroupNorm<float>(NormMode::kGroupNorm, 5e-6);
}
TEST(GroupNormTest, MatchesReferenceInEveryLayoutFloat64) {
  CheckGroupNorm<double>(NormMode::kGroupNorm, 1e-12);
}
TEST(InstanceNormTest, MatchesReferenceInEveryLayoutFloat32) {
  CheckGroupNorm<float>(NormMode::kInstanceNorm, 5e-6);
}
TEST(InstanceNormTest, MatchesReferenceInEveryLayoutFloat64) {
  CheckGroupNorm<double>(NormMode::kInstanceNorm, 1e-12);
}

TEST(GroupNormTest, HandWorkedExample) {
  // [1, 4, 2], 2 groups: group 0 = channels 0-1 = {1, 3, 5, 7}: mean 4, var
  // 5; group 1 = {2, 2, 2, 2}: var 0, so its output is the bias alone.
  const std::vector<double> x = {1, 3, 5, 7, 2, 2, 2, 2};
  NormalizeSpec spec;
  spec.mode = NormMode::kGroupNorm;
  spec.num_groups = 2;
  spec.eps = 1e-12;
  spec.input = View(x, {1, 4, 2});
  spec.weight = Param({2, 1, 1, 1});
  spec.bias = Param({0, 10, 20, 30});
  std::vector<double> y(8);
  Engine engine;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  const double s = 1 / std::sqrt(5.0 + 1e-12);
  const std::vector<double> expected = {
      2 * -3 * s, 2 * -1 * s, 10 + s, 10 + 3 * s, 20, 20, 30, 30};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(y[i], expected[i], 1e-12) << i;
}

TEST(GroupNormTest, OneValuePerGroupFollowsPyTorch) {
  // torch 1.13 refuses only a single sample of one value per group; with
  // more samples each group of one value normalizes to the bias.
  Engine engine;
  const std::vector<double> one = {1, 2, 3, 4};
  NormalizeSpec spec;
  spec.mode = NormMode::kGroupNorm;
  spec.num_groups = 4;
  spec.input = View(one, {1, 4});
  std::vector<double> y(8);
  auto refused = engine.Normalize(spec, y.data());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("input.shape"), std::string::npos);
  const std::vector<double> two = {1, 2, 3, 4, 5, 6, 7, 8};
  spec.input = View(two, {2, 4, 1, 1});
  spec.bias = Param({0.5, 1.5, 2.5, 3.5});
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], 0.5 + i % 4) << i;
  // InstanceNorm needs more than one spatial value.
  spec.mode = NormMode::kInstanceNorm;
  spec.num_groups = 0;
  EXPECT_EQ(engine.Normalize(spec, y.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GroupNormTest, EmptyBatchGivesEmptyOutput) {
  Engine engine;
  NormalizeSpec spec;
  spec.mode = NormMode::kGroupNorm;
  spec.num_groups = 2;
  const std::vector<float> none;
  spec.input = View(none, {0, 4, 3});
  EXPECT_TRUE(engine.Normalize(spec, nullptr).ok());
}

// numerics.md: channels-last GroupNorm at a mean offset of 1e4 is where
// torch 1.13 is wrong by ~1e3; normd keeps the accuracy bar (1e7 values per
// group). The output error allowed is fp32 rounding of |y| <= ~6 plus 1e-7
// of relative variance error.
TEST(AccuracyTest, GroupNormChannelsLastOffsetTenThousand) {
  const Shape shape = {1, 1'250'000, 16};
  const auto x = RandomValues<float>(NumElementsOf(shape), 44, 1e4, 1.0);
  NormalizeSpec spec;
  spec.mode = NormMode::kGroupNorm;
  spec.num_groups = 2;
  spec.channel_axis = -1;
  spec.input = View(x, shape);
  std::vector<float> y(x.size());
  Engine engine;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  std::vector<double> mean, var;
  const auto ref =
      ReferenceGroupNorm(x, shape, 2, 2, 1e-5, {}, {}, &mean, &var);
  EXPECT_LE(MaxAbsDiff(y, ref), 2e-6);
}

TEST(DeterminismTest, GroupNormBitwiseEqualFor1AndNThreads) {
  tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  const GroupCase cases[] = {{{16, 32, 64, 64}, 1, 8},
                             {{16, 64, 64, 32}, -1, 4},
                             {{2, 5, 4, 30000}, 2, 2}};
  for (const GroupCase& c : cases) {
    const auto x = RandomValues<float>(NumElementsOf(c.shape), 3, 1e3, 5.0);
    auto run = [&](int threads) {
      tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                                threads);
      Engine engine;
      NormalizeSpec spec;
      spec.mode = NormMode::kGroupNorm;
      spec.num_groups = c.groups;
      spec.channel_axis = c.axis;
      spec.input = View(x, c.shape);
      std::vector<float> y(x.size());
      EXPECT_TRUE(engine.Normalize(spec, y.data()).ok());
      return y;
    };
    const std::vector<float> one = run(1);
    for (int threads : {2, 8}) {
      EXPECT_EQ(std::memcmp(one.data(), run(threads).data(),
                            one.size() * sizeof(float)),
                0)
          << threads;
    }
  }
}

// Batches of several samples per thread run each sample's moments and then
// its output on one thread (FusedGroupSamples): channels-last with 64
// channels and streamed, sample n's output is written while sample n + 1's
// moments are read, in steps of 16 rows of the register tile (which rows
// counts not a multiple of 16 leave to the end, and which a block's
// exact-path redo does not step; the test lowers the sample size from
// which this happens); else written backwards. A batch of one sample takes
// the two-pass path. Each sample of a batch must come out with the bits it
// gets alone, on 1 or 2 threads, streamed or not, channels-last
// (parameters in registers or not; one tile, two, or one and 32 channels)
// or with the channel axis in the middle.
template <typename T>
void CheckFusedSamplesMatchOneSampleRuns() {
  struct Case {
    NormMode mode;
    GroupCase shape;
    // The first 32 rows of every sample shifted by 5e3: the tiles' shift
    // (the mean of those rows) is then far from the sample's mean, and the
    // blocks are redone exactly.
    bool shifted_head = false;
  };
  const Case cases[] = {
      {NormMode::kGroupNorm, {{6, 40, 33, 64}, -1, 16}},
      {NormMode::kInstanceNorm, {{5, 20, 21, 24}, -1, 0}},
      {NormMode::kGroupNorm, {{4, 30, 17, 10}, -1, 5}},
      {NormMode::kGroupNorm, {{4, 3, 6, 500}, 2, 3}},
      {NormMode::kGroupNorm, {{9, 20, 11, 64}, -1, 8}},    // 220 rows.
      {NormMode::kInstanceNorm, {{5, 7, 9, 128}, -1, 0}},  // Two tiles.
      {NormMode::kGroupNorm, {{6, 5, 13, 96}, -1, 32}},    // A tile and 32.
      {NormMode::kGroupNorm, {{8, 32, 32, 64}, -1, 4}, true},
  };
  for (const int threads : {1, 2}) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                              threads);
    for (const Case& c : cases) {
      const Shape& shape = c.shape.shape;
      const int64_t channels = shape[ResolvedAxis(c.shape)];
      const int64_t n = NumElementsOf(shape);
      const int64_t sample = n / shape[0];
      auto x = RandomValues<T>(n, 9, 1e3, 5.0);
      if (c.shifted_head) {
        for (int64_t i = 0; i < n; ++i) {
          if (i % sample < 32 * channels) x[i] += 5e3;
        }
      }
      std::vector<double> w(channels), b(channels);
      for (int64_t ch = 0; ch < channels; ++ch) {
        w[ch] = 0.75 + 0.01 * static_cast<double>(ch);
        b[ch] = 0.5 - 0.02 * static_cast<double>(ch);
      }
      for (int64_t threshold : {int64_t{0}, kDefaultStreamingOutputBytes}) {
        SCOPED_TRACE(::testing::Message()
                     << "mode " << static_cast<int>(c.mode) << " C " << channels
                     << " streamed " << (threshold == 0) << " threads "
                     << threads);
        SetStreamingOutputBytes(threshold);
        SetInterleavedSampleBytes(0);  // Small samples interleave too.
        Engine engine;
        auto run = [&](const T* input, Shape s, T* y) {
          NormalizeSpec spec;
          spec.mode = c.mode;
          spec.num_groups = c.shape.groups;
          spec.channel_axis = c.shape.axis;
          const int64_t size = NumElementsOf(s);
          spec.input = InputTensor{DTypeOf<T>(), std::move(s), input, size};
          spec.weight = Param(w);
          spec.bias = Param(b);
          spec.eps = 1e-3;
          EXPECT_TRUE(engine.Normalize(spec, y).ok());
        };
        std::vector<T> batch(n), alone(n);
        run(x.data(), shape, batch.data());
        Shape one = shape;
        one[0] = 1;
        for (int64_t i = 0; i < shape[0]; ++i) {
          run(x.data() + i * sample, one, alone.data() + i * sample);
        }
        EXPECT_EQ(std::memcmp(batch.data(), alone.data(), n * sizeof(T)), 0);
        // And the values are GroupNorm's (the fp64 reference).
        const int64_t groups =
            c.mode == NormMode::kGroupNorm ? c.shape.groups : channels;
        const auto ref = ReferenceGroupNorm(x, shape, ResolvedAxis(c.shape),
                                            groups, 1e-3, w, b);
        const double tolerance = std::is_same_v<T, float> ? 5e-6 : 1e-12;
        EXPECT_LE(MaxAbsDiff(batch, ref), tolerance);
      }
      SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
      SetInterleavedSampleBytes(kDefaultInterleavedSampleBytes);
    }
  }
}

TEST(GroupNormTest, BatchesEqualOneSampleRunsBitwise) {
  CheckFusedSamplesMatchOneSampleRuns<float>();
  CheckFusedSamplesMatchOneSampleRuns<double>();
}

// ---- InstanceNorm with a model's running statistics -----------------------

TEST(InstanceNormTest, TrainingMovesRunningStatisticsAsPyTorch) {
  // [N=3, C=2, L=5]: per (n, c) mean and unbiased variance; PyTorch
  // averages them over n and moves the running statistics by momentum.
  const Shape shape = {3, 2, 5};
  const auto x = RandomValues<double>(30, 21, 2.0, 3.0);
  Engine engine;
  ModelSpec create;
  create.name = "inst";
  create.num_features = 2;
  create.momentum = 0.25;
  ASSERT_TRUE(engine.store().Create(create).ok());
  NormalizeSpec spec;
  spec.mode = NormMode::kInstanceNorm;
  spec.model = "inst";
  spec.training = true;
  spec.input = View(x, shape);
  std::vector<double> y(30);
  auto result = engine.Normalize(spec, y.data());
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->has_value());
  const BatchNormModel& model = **result;
  std::vector<double> mean, var;
  const auto ref =
      ReferenceGroupNorm(x, shape, 1, 2, 1e-5, {}, {}, &mean, &var);
  EXPECT_LE(MaxAbsDiff(y, ref), 1e-12);
  for (int c = 0; c < 2; ++c) {
    double mean_avg = 0, var_avg = 0;
    for (int n = 0; n < 3; ++n) {
      mean_avg += mean[n * 2 + c] / 3;
      var_avg += var[n * 2 + c] * 5 / 4 / 3;  // Unbiased over L = 5.
    }
    EXPECT_NEAR(model.running_mean[c], 0.25 * mean_avg, 1e-12);
    EXPECT_NEAR(model.running_var[c], 0.75 + 0.25 * var_avg, 1e-12);
  }
  EXPECT_EQ(model.num_batches_tracked, 0);  // As PyTorch's InstanceNorm.
  EXPECT_EQ(model.sample_count, 15);
  const auto pooled = ReferenceChannelStats(x, 3, 2, 5);
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(model.PooledMean()[c], pooled.mean[c], 1e-12);
    EXPECT_NEAR(model.PooledVariance()[c], pooled.var[c], 1e-12);
  }
  // Eval uses the running statistics, as BatchNorm eval.
  spec.training = false;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  EXPECT_LE(MaxAbsDiff(y, ReferenceChannelNormalize(
                              x, 3, 2, 5, model.running_mean, model.running_var,
                              1e-5, {1, 1}, {0, 0})),
            1e-12);
}

TEST(InstanceNormTest, UnknownModelIsCreatedByTrainingOnly) {
  Engine engine;
  const auto x = RandomValues<float>(24, 2);
  NormalizeSpec spec;
  spec.mode = NormMode::kInstanceNorm;
  spec.model = "fresh";
  spec.input = View(x, {2, 3, 4});
  std::vector<float> y(24);
  EXPECT_EQ(engine.Normalize(spec, y.data()).status().code(),
            absl::StatusCode::kNotFound);
  spec.training = true;
  auto trained = engine.Normalize(spec, y.data());
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ((*trained)->num_features, 3);
  EXPECT_EQ((*trained)->generation, 2u);  // Created, then trained.
}

TEST(InstanceNormTest, CumulativeAverageModelIsRefusedUnchanged) {
  Engine engine;
  ModelSpec create;
  create.name = "cumulative";
  create.num_features = 2;
  create.cumulative_average = true;
  ASSERT_TRUE(engine.store().Create(create).ok());
  const auto x = RandomValues<double>(8, 3);
  NormalizeSpec spec;
  spec.mode = NormMode::kInstanceNorm;
  spec.model = "cumulative";
  spec.training = true;
  spec.input = View(x, {2, 2, 2});
  std::vector<double> y(8);
  EXPECT_EQ(engine.Normalize(spec, y.data()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine.store().Get("cumulative")->generation, 1u);
}

// ---- RMSNorm --------------------------------------------------------------

template <typename T>
void CheckRmsNorm(double tolerance) {
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
    EXPECT_LE(MaxAbsDiff(y, ReferenceRmsNorm(x, n, 1e-5, w, {})), tolerance);
    spec.bias = Param(b);
    spec.eps = 1e-3;
    ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
    EXPECT_LE(MaxAbsDiff(y, ReferenceRmsNorm(x, n, 1e-3, w, b)), tolerance);
  }
}

TEST(RmsNormTest, MatchesReferenceFloat32) { CheckRmsNorm<float>(2e-5); }
TEST(RmsNormTest, MatchesReferenceFloat64) { CheckRmsNorm<double>(1e-12); }

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

// ---- 16-bit tensors in every mode -----------------------------------------

// Unit roundoff of the format: the largest relative error of rounding once.
double UnitRoundoff(DType dtype) {
  return dtype == DType::kBFloat16 ? std::ldexp(1, -8) : std::ldexp(1, -11);
}

// Checks a 16-bit output against the fp64 reference of the same (already
// rounded) input: |y - ref| <= u |ref| + fp32 error of the computation.
// The fp32 part: 2^-20 of the magnitude the result was computed from (the
// centred value times the scale, plus the shift), and the smallest
// subnormal half for results that underflow.
void ExpectWithinRounding(DType dtype, const std::vector<uint16_t>& y,
                          const std::vector<double>& ref, double magnitude) {
  const double u = UnitRoundoff(dtype);
  const double tiny = dtype == DType::kFloat16 ? std::ldexp(1, -24) : 0.0;
  int bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double got = HalfValue(dtype, y[i]);
    const double bound =
        u * std::abs(ref[i]) + std::ldexp(magnitude, -20) + tiny / 2;
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
      ExpectWithinRounding(dtype, y, m.reference, 3.0 * 4 + 4);
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
        4 * 4);
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
        4 * 4);
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
  // at a time (LayerNormHalfKernel); longer ones one at a time, in pieces
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
                             8);
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
// deviations, and a third of the RMSNorm rows' x / rms above 1.03). The
// AVX512-BF16 rounding flushes subnormals and takes such lines the integer
// way (half_avx512.h).
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

// Runs body() with the bfloat16 rounding by the AVX512-BF16 instruction
// allowed and not (where the CPU has it, the two are different code).
template <typename Body>
void ForEachBFloat16Rounding(const Body& body) {
  for (bool instruction : {true, false}) {
    SCOPED_TRACE(instruction ? "AVX512-BF16 rounding allowed"
                             : "integer rounding");
    AllowAvx512Bf16ForTesting(instruction);
    body();
    AllowAvx512Bf16ForTesting(true);
  }
}

// Large 16-bit row outputs are narrowed in registers and streamed out
// (AVX-512); they must carry exactly the bits of the cached path (fp32
// results narrowed by NarrowToHalf), for every style, with and without
// affine parameters, at aligned and misaligned outputs, for rows that start
// mid-line, and for rows holding a NaN or an infinity. The rows are
// computed from a widened copy or from the input itself, by where the output
// sits against the input (see ReadsHalfRowsDirectly): the outputs below
// start at 0, 1, 5, 32 and 1029 values past a page-aligned copy of the
// input (1, 5 and 32: less than 512 bytes above, so widened; 1029:
// unaligned, read directly except bfloat16 with weights), or on the input
// itself (in place: read directly). The cached rows are those of the
// integer bfloat16 rounding; every run is compared with them with the
// AVX512-BF16 instruction allowed and not, and the weights give results of
// every magnitude (AddExtremeWeights).
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
      for (const auto& [mode, style] :
           {std::pair{NormMode::kLayerNorm, LayerNormStyle::kPyTorch},
            std::pair{NormMode::kLayerNorm, LayerNormStyle::kBertUnbiasedStd},
            std::pair{NormMode::kRmsNorm, LayerNormStyle::kPyTorch}}) {
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
          AllowAvx512Bf16ForTesting(false);
          const std::vector<uint16_t> cached =
              run(std::numeric_limits<int64_t>::max(), 0);
          AllowAvx512Bf16ForTesting(true);
          if (affine && dtype == DType::kBFloat16 && n > 4) {
            ExpectExtremeBFloat16Results(cached);
          }
          ForEachBFloat16Rounding([&] {
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
    const auto [w, b] = RowWeightsAndBiases(kN);
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

// The 16-bit rows' fp32 affine has an AVX-512 and a scalar (std::fma) form
// for CPUs without it; both must give the same bits, with and without
// weight / bias, at every tail length.
TEST(HalfTensorTest, HalfRowAffineVectorAndScalarAgreeBitwise) {
  const auto wide = RandomValues<double>(3 * 67, 41, 100.0, 3.0);
  const std::vector<float> x(wide.begin(), wide.begin() + 67);
  const std::vector<float> w(wide.begin() + 67, wide.begin() + 134);
  const std::vector<float> b(wide.begin() + 134, wide.end());
  const double mean = 100.123456789;
  const auto hi = static_cast<float>(mean);
  const auto lo = static_cast<float>(mean - hi);
  ASSERT_NE(lo, 0.0f);
  for (int64_t n : {1, 15, 16, 17, 67}) {
    for (const float* weight : {static_cast<const float*>(nullptr), w.data()}) {
      for (const float* bias : {static_cast<const float*>(nullptr), b.data()}) {
        std::vector<float> vector(n), scalar(n);
        HalfRowAffine(x.data(), vector.data(), n, hi, lo, 0.3f, weight, bias,
                      true);
        HalfRowAffine(x.data(), scalar.data(), n, hi, lo, 0.3f, weight, bias,
                      false);
        for (int64_t j = 0; j < n; ++j) {
          EXPECT_EQ(std::bit_cast<uint32_t>(vector[j]),
                    std::bit_cast<uint32_t>(scalar[j]))
              << "n " << n << " j " << j;
          // And both are the fp64 value within fp32 rounding.
          double expected = (x[j] - mean) * 0.3f;
          if (weight != nullptr) expected *= weight[j];
          if (bias != nullptr) expected += bias[j];
          EXPECT_NEAR(scalar[j], expected, 1e-6 * (1.0 + std::abs(expected)));
        }
      }
    }
  }
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

// Every channel mode of a 16-bit tensor (GroupNorm, InstanceNorm stateless
// and with a model, BatchNorm training and eval, Fit) reads the 16-bit values
// in place (HalfChannelMoments, ChannelAffineHalfKernel): outputs and models
// must be the bits of the whole tensor widened to fp32, run as fp32 and
// narrowed (the test does that through the fp32 API and NarrowToHalf), in
// every layout and channel count (the kernels' register paths and their
// per-element fallback), streamed or not, into aligned, unaligned and
// in-place outputs, with the AVX512-BF16 rounding allowed and not, and
// weights that give results of every magnitude (AddExtremeWeights).
TEST(HalfTensorTest, ChannelModesEqualWholeTensorWidenedBitwise) {
  struct Case {
    NormMode mode;
    GroupCase shape;
    bool with_model = false;
    bool training = false;
  };
  const Case cases[] = {
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
      {NormMode::kBatchNorm, {{4, 6, 30, 30}, 1, 0}, true, false},
      {NormMode::kBatchNorm, {{4, 30, 30, 64}, -1, 0}, true, false},
      {NormMode::kBatchNorm, {{3, 7, 300}, 1, 0}, true, true},
      {NormMode::kBatchNorm, {{4, 30, 9, 24}, -1, 0}, true, true},
      {NormMode::kInstanceNorm, {{3, 5, 20, 20}, 1, 0}, true, true},
      {NormMode::kInstanceNorm, {{3, 20, 20, 12}, -1, 0}, true, false},
      // Runs of 16-255 values: lines across runs (7x7, 5x5, 4x4, 15x17).
      {NormMode::kBatchNorm, {{40, 16, 7, 7}, 1, 0}, true, false},
      {NormMode::kBatchNorm, {{40, 16, 7, 7}, 1, 0}, true, true},
      {NormMode::kInstanceNorm, {{20, 8, 5, 5}, 1, 0}},
      {NormMode::kGroupNorm, {{16, 8, 4, 4}, 1, 4}},
      {NormMode::kBatchNorm, {{9, 5, 15, 17}, 1, 0}, true, false},
  };
  for (const Case& c : cases) {
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
      NarrowToHalf(dtype, y_wide.data(), expected.data(), n);
      if (dtype == DType::kBFloat16 && channels > 4) {
        ExpectExtremeBFloat16Results(expected);
      }
      ForEachBFloat16Rounding([&] {
        for (int64_t threshold : {int64_t{0}, kDefaultStreamingOutputBytes}) {
          for (int64_t offset : {0, 1, -1}) {  // -1: in place.
            SetStreamingOutputBytes(threshold);
            SetInterleavedSampleBytes(0);  // Small samples interleave too.
            std::vector<uint16_t> buffer = x;
            buffer.insert(buffer.begin(), offset > 0 ? offset : 0, 0x5555);
            uint16_t* y = buffer.data() + std::max<int64_t>(offset, 0);
            const std::optional<BatchNormModel> model = run(
                offset < 0 ? View(buffer, shape, dtype) : View(x, shape, dtype),
                y);
            SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
            SetInterleavedSampleBytes(kDefaultInterleavedSampleBytes);
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
