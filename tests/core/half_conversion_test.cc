// 16-bit conversions (bfloat16, IEEE binary16) against tables built from
// the formats' definitions with ldexp, and the kernels that widen and narrow.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "server/core/engine.h"
#include "server/core/half.h"
#include "server/core/simd/row_affine.h"
#include "server/core/simd/streaming.h"
#include "tests/testing/core_cases.h"
#include "tests/testing/simd_targets.h"

namespace normd {
namespace {

// n fp32 values narrowed to `dtype` the way every kernel narrows its
// results: the row writer with the identity affine (fma(x - 0, 1, -0) is
// x), cached or with streaming stores.
void NarrowAsWritten(DType dtype, const float* src, uint16_t* dst, int64_t n,
                     bool stream = false) {
  const RowAffine identity{.hi = 0.0, .lo = 0.0, .scale = 1.0, .fused = true};
  RowAffineWrite(DType::kFloat32, dtype, src, dst, n, identity,
                 {.stream = stream});
  if (stream) StreamFence();
}

using ::normd::testing::ForEachSimdTarget;
using ::normd::testing::HalfValue;
using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceChannelStats;
using ::normd::testing::RelErr;
using ::normd::testing::SameBits;

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

// The fp32 pattern a 16-bit NaN widens to: its sign, payload and quiet bit
// moved up, and for float16 the quiet bit set (as conversion instructions
// do; bfloat16 widening is a shift, which keeps a signalling NaN).
uint32_t WidenedNaN(DType dtype, uint16_t h) {
  if (dtype == DType::kBFloat16) return static_cast<uint32_t>(h) << 16;
  return (static_cast<uint32_t>(h & 0x8000) << 16) | 0x7fc00000u |
         (static_cast<uint32_t>(h & 0x3ff) << 13);
}

TEST(HalfTest, WideningIsExactForEveryPatternOnEveryTarget) {
  std::vector<uint16_t> all(65536 + 7);
  for (size_t h = 0; h < all.size(); ++h) all[h] = static_cast<uint16_t>(h);
  ForEachSimdTarget([&](const std::string&) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      // Offset 7: vector bodies at every alignment, and a scalar tail.
      std::vector<float> wide(all.size());
      WidenHalf(dtype, all.data() + 7, wide.data(), 65536);
      for (int i = 0; i < 65536; ++i) {
        const uint16_t h = static_cast<uint16_t>(i + 7);
        const double expected = HalfValue(dtype, h);
        // The bulk form and the portable scalar one.
        const float scalar = HalfToFloat(dtype, h);
        if (std::isnan(expected)) {
          ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]), WidenedNaN(dtype, h))
              << DTypeName(dtype) << " " << h;
          ASSERT_EQ(std::bit_cast<uint32_t>(scalar), WidenedNaN(dtype, h))
              << DTypeName(dtype) << " " << h;
          continue;
        }
        ASSERT_EQ(static_cast<double>(wide[i]), expected)
            << DTypeName(dtype) << " " << h;
        ASSERT_EQ(std::signbit(wide[i]), std::signbit(expected));
        ASSERT_EQ(std::bit_cast<uint32_t>(scalar),
                  std::bit_cast<uint32_t>(wide[i]));
      }
    }
  });
}

// fp64 to fp32 (the fp32 kernels' weights and biases) rounds as a cast does
// on every target: ties to even, overflow to infinity, underflow through the
// subnormals, signed zeros, NaN; at every offset of the vector body.
TEST(HalfTest, DoublesToFloatsRoundsAsACastOnEveryTarget) {
  const double max = std::numeric_limits<float>::max();
  const double denorm = std::numeric_limits<float>::denorm_min();
  std::vector<double> values = {0.0,
                                -0.0,
                                1.0 + 0x1.0p-24,  // A tie: to 1.
                                1.0 + 0x1.8p-23,  // A tie: up to even.
                                max,
                                max * (1 + 0x1.0p-25),   // Under half an ulp.
                                -max * (1 + 0x1.0p-23),  // Past: -infinity.
                                1e300,
                                denorm,
                                denorm / 2,    // A tie with 0: to 0.
                                denorm * 1.5,  // A tie: to 2 denorm_min.
                                1e-50,
                                -1e-50,
                                std::numeric_limits<double>::infinity(),
                                -std::numeric_limits<double>::infinity(),
                                std::numeric_limits<double>::quiet_NaN()};
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> exponent(-160, 140);
  for (int i = 0; i < 200; ++i) {
    const double mantissa = std::bit_cast<double>(
        (rng() & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    values.push_back((i % 2 ? -1 : 1) * std::ldexp(mantissa, exponent(rng)));
  }
  ForEachSimdTarget([&](const std::string& target) {
    for (size_t offset = 0; offset < 8; ++offset) {
      const size_t n = values.size() - offset;
      std::vector<float> out(n);
      DoublesToFloats(values.data() + offset, out.data(),
                      static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) {
        const float cast = static_cast<float>(values[offset + i]);
        if (std::isnan(cast)) {
          ASSERT_TRUE(std::isnan(out[i])) << target << " " << i;
          continue;
        }
        ASSERT_EQ(std::bit_cast<uint32_t>(out[i]),
                  std::bit_cast<uint32_t>(cast))
            << target << " " << values[offset + i];
      }
    }
  });
}

// The widening writes its output from the first 64-byte line boundary on in
// whole vectors, the elements before it one at a time: every start within a
// line and lengths around the head, a line and a vector, touching nothing
// outside the output.
TEST(HalfTest, WideningWritesExactlyItsOutputAtEveryAlignment) {
  std::vector<uint16_t> x(200);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<uint16_t>(0x3c00 + 37 * i);
  }
  ForEachSimdTarget([&](const std::string& target) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      alignas(64) float out[256];
      for (int64_t start = 0; start <= 16; ++start) {
        for (int64_t n : {0, 1, 5, 11, 12, 13, 15, 16, 17, 31, 32, 33, 47, 48,
                          49, 100, 200}) {
          std::fill(std::begin(out), std::end(out), -7.0f);
          WidenHalf(dtype, x.data(), out + start, n);
          for (int64_t i = 0; i < 256; ++i) {
            const bool inside = i >= start && i < start + n;
            ASSERT_EQ(std::bit_cast<uint32_t>(out[i]),
                      std::bit_cast<uint32_t>(
                          inside ? HalfToFloat(dtype, x[i - start]) : -7.0f))
                << target << " " << DTypeName(dtype) << " start " << start
                << " n " << n << " at " << i;
          }
        }
      }
    }
  });
}

void CheckNarrowing();

TEST(HalfTest, NarrowingRoundsToNearestEvenOnEveryTarget) {
  ForEachSimdTarget([](const std::string&) { CheckNarrowing(); });
}

void CheckNarrowing() {
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
    NarrowAsWritten(dtype, probes.data(), out.data(),
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
    NarrowAsWritten(dtype, nans.data(), narrowed.data(),
                    static_cast<int64_t>(nans.size()));
    std::vector<uint16_t> streamed(nans.size());
    NarrowAsWritten(dtype, nans.data(), streamed.data(),
                    static_cast<int64_t>(nans.size()), /*stream=*/true);
    for (size_t i = 0; i < nans.size(); ++i) {
      EXPECT_EQ(narrowed[i], canonical) << std::bit_cast<uint32_t>(nans[i]);
      EXPECT_EQ(streamed[i], canonical) << std::bit_cast<uint32_t>(nans[i]);
      EXPECT_EQ(FloatToHalf(dtype, nans[i]), canonical);
    }
    EXPECT_EQ(DoubleToHalf(dtype, -std::numeric_limits<double>::quiet_NaN()),
              canonical);
  }
}

TEST(HalfTest, StreamingNarrowingWritesTheSameBitsOnEveryTarget) {
  // Every head alignment and length around the 32-element lines; nothing
  // written outside [offset, offset + n).
  const auto x = RandomValues<float>(300, 13, 0.0, 1e3);
  ForEachSimdTarget([&](const std::string&) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      for (int64_t offset = 0; offset < 40; ++offset) {
        for (int64_t n : {0, 1, 31, 32, 33, 64, 95, 200}) {
          std::vector<uint16_t> plain(300, 7), streamed(300, 7);
          NarrowAsWritten(dtype, x.data(), plain.data() + offset, n);
          NarrowAsWritten(dtype, x.data(), streamed.data() + offset, n,
                          /*stream=*/true);
          ASSERT_EQ(plain, streamed)
              << DTypeName(dtype) << " offset " << offset << " n " << n;
          for (int64_t i = 0; i < 300; ++i) {
            if (i < offset || i >= offset + n) {
              ASSERT_EQ(streamed[i], 7) << "written outside at " << i;
            } else {
              ASSERT_EQ(streamed[i], FloatToHalf(dtype, x[i - offset]));
            }
          }
        }
      }
    }
  });
}

TEST(HalfTest, WideningWithMomentsEqualsWideningThenMomentsBitwise) {
  // WidenedMoments, with and without storing the widening.
  // Lengths around the 64-value steps, the 1024-value flushes, the 32-value
  // shift sample and the kMomentsBlock-value blocks; data near and far (1e4)
  // from 0, and a block whose first values sit far from the rest (the exact
  // path); on every target (bfloat16 keeps its lanes in pair order).
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
        std::vector<float> plain(n + 1, -1.0f);
        WidenHalf(dtype, x.data(), plain.data(), n);
        const Moments want = ContiguousMoments(plain.data(), n);
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " n " << n << " offset " << offset);
        ForEachSimdTarget([&](const std::string&) {
          std::vector<float> fused(n + 1, -1.0f);
          const Moments got =
              WidenedMoments(dtype, x.data(), fused.data(), n, true);
          std::vector<float> scratch(n);
          const Moments unstored =
              WidenedMoments(dtype, x.data(), scratch.data(), n, false);
          EXPECT_EQ(fused, plain);
          for (const Moments* m : {&got, &unstored}) {
            EXPECT_TRUE(SameBits(*m, want));
          }
        });
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
  ForEachSimdTarget([&](const std::string&) {
    std::vector<float> fused(kN);
    const Moments stored =
        WidenedMoments(DType::kBFloat16, x.data(), fused.data(), kN, true);
    std::vector<float> scratch(kN);
    const Moments unstored =
        WidenedMoments(DType::kBFloat16, x.data(), scratch.data(), kN, false);
    const ChannelLayout run{1, 1, kN};
    const Moments in_place = ChannelMoments(DType::kBFloat16, x.data(), run)[0];
    const Moments fp32 = ChannelMoments(plain.data(), run)[0];
    for (const Moments* got : {&stored, &unstored, &in_place, &fp32}) {
      EXPECT_TRUE(SameBits(*got, want));
    }
  });
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
// tiles and narrow tiles of 32, 16, .., 1 channels: 96, 112, 128+ channels)
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
  for (int64_t channels : {96, 112, 128, 200, 240, 256, 1023}) {
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
          auto part = [&](int64_t c0, int64_t width) {
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
            return ChannelMoments(dtype, px, ChannelLayout{outer, width, 1});
          };
          const void* x = typed.data();
          ForEachSimdTarget([&](const std::string&) {
            const auto all = ChannelMoments(dtype, x, layout);
            ASSERT_EQ(all.size(), static_cast<size_t>(channels));
            for (int64_t c0 = 0, width = 64; c0 < channels; c0 += width) {
              while (c0 + width > channels) width /= 2;
              const auto alone = part(c0, width);
              for (int64_t c = 0; c < width; ++c) {
                EXPECT_EQ(all[c0 + c].count, outer);
                EXPECT_TRUE(SameBits(all[c0 + c], alone[c])) << c0 + c;
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
          });
        }
      }
    }
  }
}

// Channels in short runs (1 <= inner < 256) are reduced in row blocks
// (channels-last fp32 tiles; for runs of 16 values or more, fp64 lanes per
// run): every SIMD target must give the bits of the best one, for fp32 and
// 16-bit data, ragged run lengths, data far from 0, and a shift sample far
// from the mean (the exact fallback); and the runs' fp64 sums must be the
// fp64 moments.
TEST(HalfTest, ShortRunMomentsSameBitsOnEveryTarget) {
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
            const auto ref =
                ReferenceChannelStats(values, outer, channels, inner);
            std::vector<Moments> hand;  // The best target's.
            ForEachSimdTarget([&](const std::string&) {
              const auto loop = ChannelMoments(dtype, x, layout);
              ASSERT_EQ(loop.size(), static_cast<size_t>(channels));
              if (hand.empty()) hand = loop;
              for (int64_t c = 0; c < channels; ++c) {
                EXPECT_EQ(hand[c].count, outer * inner);
                EXPECT_TRUE(SameBits(loop[c], hand[c])) << c;
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
            });
          }
        }
      }
    }
  }
}

// Fewer than 64 channels-last channels that make whole rows (BatchNorm1d of
// [N, C], an RGB image) are one narrow tile read in place, each lane
// taking floor(64 / C) rows a step: every target must give the bits of
// the best one, and the moments must be within a few fp32 roundings of the
// fp64 ones, at every remainder of the last step (fp32 and 16-bit data,
// far from 0, and an offset of 1e4 for fp32).
TEST(HalfTest, FewChannelsLastChannelsAreOneTileOnEveryTarget) {
  for (int64_t channels : {1, 3, 5, 12, 24, 48, 63}) {
    for (int64_t outer : {1, 5, 40, 1001}) {
      const ChannelLayout layout{outer, channels, 1};
      const int64_t n = layout.NumElements();
      for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        const double offset = dtype == DType::kFloat32 ? 1e4 : 100.0;
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " [" << outer
                                          << ", " << channels << ", 1]");
        const TypedValues typed(
            dtype, RandomValues<double>(n, 5 + channels + outer, offset, 3.0));
        const auto ref =
            ReferenceChannelStats(typed.values, outer, channels, 1);
        std::vector<Moments> best;
        ForEachSimdTarget([&](const std::string&) {
          const auto got = ChannelMoments(dtype, typed.data(), layout);
          ASSERT_EQ(got.size(), static_cast<size_t>(channels));
          if (best.empty()) best = got;
          for (int64_t c = 0; c < channels; ++c) {
            EXPECT_EQ(got[c].count, outer);
            EXPECT_TRUE(SameBits(got[c], best[c])) << c;
            EXPECT_LE(
                std::abs(got[c].mean - ref.mean[c]),
                1e-12 * std::abs(ref.mean[c]) + 1e-7 * std::sqrt(ref.var[c]))
                << c;
            if (outer > 1) {
              EXPECT_LE(RelErr(got[c].BiasedVariance(), ref.var[c]), 5e-7) << c;
            }
          }
        });
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

}  // namespace
}  // namespace normd
