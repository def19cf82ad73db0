// Vector conversions between fp32 and the 16-bit formats with the bits of
// half.h's scalar ones on every target, and how the kernels read and write
// each dtype (Elements). float16 uses the instructions where they are
// exact (F16C, NEON, SVE), elsewhere half.h's functions lane by lane;
// bfloat16 half.h's integer steps in vectors (Highway 1.0.3's DemoteTo
// truncates). Include in files compiled per target, after hwy/highway.h.
// Pure functions.

// Per-target include guard: toggled for each pass of foreach_target.h.
#if defined(NORMD_SERVER_CORE_SIMD_HALF_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef NORMD_SERVER_CORE_SIMD_HALF_INL_H_
#undef NORMD_SERVER_CORE_SIMD_HALF_INL_H_
#else
#define NORMD_SERVER_CORE_SIMD_HALF_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "server/core/half.h"
#include "server/core/simd/ops-inl.h"
#include "server/core/tensor.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether this target's float16 instructions are exact (see above).
#undef NORMD_HWY_EXACT_F16
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || \
    (HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_SCALAR)
#define NORMD_HWY_EXACT_F16 1
#else
#define NORMD_HWY_EXACT_F16 0
#endif

// f(lane) for each lane of v (tag from), as a vector of tag `to`: float16
// on targets without exact instructions (SSE4, scalar).
template <class DTo, class DFrom, class F>
HWY_INLINE hn::Vec<DTo> LaneByLane(DTo to, DFrom from, hn::Vec<DFrom> v,
                                   const F& f) {
  HWY_ALIGN hn::TFromD<DFrom> in[hn::MaxLanes(DFrom())];
  HWY_ALIGN hn::TFromD<DTo> out[hn::MaxLanes(DTo())];
  hn::Store(v, from, in);
  for (size_t i = 0; i < hn::Lanes(from); ++i) out[i] = f(in[i]);
  return hn::Load(to, out);
}

// The 16-bit patterns of a vector of fp32 lanes: the same lane count.
template <class DF>
using HalfBitsTag = hn::Rebind<uint16_t, DF>;

// kType's patterns to fp32, exactly: bfloat16 as the top 16 bits; float16
// NaNs come out quiet, as from the instructions.
template <DType kType, class DF>
HWY_INLINE hn::Vec<DF> WidenHalfBits(DF df, hn::Vec<HalfBitsTag<DF>> h) {
  if constexpr (kType == DType::kBFloat16) {
    const hn::RebindToUnsigned<DF> du32;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, h)));
  }
#if NORMD_HWY_EXACT_F16
  const hn::Rebind<hwy::float16_t, DF> df16;
  return hn::PromoteTo(df, hn::BitCast(df16, h));
#else
  return LaneByLane(df, HalfBitsTag<DF>(), h, Float16ToFloat);
#endif
}

// What a narrowing makes of NaNs: the canonical pattern, as half.h's
// scalar functions do; or, kUnchecked, whatever the rounding's integer
// steps make of them (not always a NaN), for callers that write again
// every block that held a NaN: a step or two fewer per vector.
enum class NaNs { kCanonical, kUnchecked };

// fp32 to bfloat16 in the high half of each lane (the low half garbage):
// plus 0x7fff and the lowest kept bit; NaN gives the canonical NaN (kNaNs).
template <NaNs kNaNs = NaNs::kCanonical, class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> BFloat16InHighHalves(
    DF df, hn::Vec<DF> f) {
  const hn::RebindToUnsigned<DF> du32;
  const auto bits = hn::BitCast(du32, f);
#if HWY_ARCH_X86 && HWY_TARGET >= HWY_AVX2
  // Without mask registers a blend is two operations: a shift and an add.
  const auto rounded =
      hn::Add(hn::Add(bits, hn::Set(du32, 0x7fffu)),
              hn::And(hn::ShiftRight<16>(bits), hn::Set(du32, 1u)));
#else
  const auto odd = hn::TestBit(bits, hn::Set(du32, 0x10000u));
  const auto rounded = hn::Add(bits, hn::IfThenElse(odd, hn::Set(du32, 0x8000u),
                                                    hn::Set(du32, 0x7fffu)));
#endif
  if constexpr (kNaNs == NaNs::kUnchecked) return rounded;
  // Not NaN: f == f (GCC 12 reloads f from memory for IsNaN's class test
  // on AVX-512).
  return hn::IfThenElse(hn::RebindMask(du32, hn::Eq(f, f)), rounded,
                        hn::Set(du32, uint32_t{kCanonicalBFloat16NaN} << 16));
}

#if NORMD_HWY_EXACT_F16
// The float16 instruction's patterns of f: NaNs keep (part of) a payload.
template <class DF>
HWY_INLINE hn::Vec<HalfBitsTag<DF>> Float16Bits(DF df, hn::Vec<DF> f) {
  return hn::BitCast(HalfBitsTag<DF>(),
                     hn::DemoteTo(hn::Rebind<hwy::float16_t, DF>(), f));
}

// float16 patterns with every NaN (magnitude above infinity's) made
// kCanonicalFloat16NaN: in 16-bit lanes, half the operations of doing it
// to the fp32 lanes before narrowing.
template <class D16>
HWY_INLINE hn::Vec<D16> CanonicalFloat16NaNs(D16 d16, hn::Vec<D16> h) {
  const hn::RebindToSigned<D16> di16;
  const auto magnitude = hn::BitCast(di16, hn::And(h, hn::Set(d16, 0x7fff)));
  return hn::IfThenElse(
      hn::RebindMask(d16, hn::Gt(magnitude, hn::Set(di16, 0x7c00))),
      hn::Set(d16, kCanonicalFloat16NaN), h);
}
#endif

// fp32 to kType's patterns, round to nearest even, canonical NaN (kNaNs;
// float16: overflow gives infinity).
template <DType kType, NaNs kNaNs = NaNs::kCanonical, class DF>
HWY_INLINE hn::Vec<HalfBitsTag<DF>> NarrowToHalfBits(DF df, hn::Vec<DF> f) {
  if constexpr (kType == DType::kBFloat16) {
    return hn::TruncateTo(
        HalfBitsTag<DF>(),
        hn::ShiftRight<16>(BFloat16InHighHalves<kNaNs>(df, f)));
  }
#if NORMD_HWY_EXACT_F16
  if constexpr (kNaNs == NaNs::kUnchecked) return Float16Bits(df, f);
  return CanonicalFloat16NaNs(HalfBitsTag<DF>(), Float16Bits(df, f));
#else
  return LaneByLane(HalfBitsTag<DF>(), df, f, FloatToFloat16);
#endif
}

// Two fp32 vectors narrowed into one vector of 16-bit patterns, `lo`
// first (bfloat16: the high halves in one permute; NaNs as kNaNs). Not on
// scalar.
#if HWY_TARGET != HWY_SCALAR
template <DType kType, NaNs kNaNs = NaNs::kCanonical, class DF>
HWY_INLINE hn::Vec<hn::Repartition<uint16_t, DF>> NarrowPairToHalfBits(
    DF df, hn::Vec<DF> lo, hn::Vec<DF> hi) {
  const hn::Repartition<uint16_t, DF> dpair;
  if constexpr (kType == DType::kBFloat16) {
    return hn::ConcatOdd(
        dpair, hn::BitCast(dpair, BFloat16InHighHalves<kNaNs>(df, hi)),
        hn::BitCast(dpair, BFloat16InHighHalves<kNaNs>(df, lo)));
  }
#if NORMD_HWY_EXACT_F16
  const auto both =
      hn::Combine(dpair, Float16Bits(df, hi), Float16Bits(df, lo));
  if constexpr (kNaNs == NaNs::kUnchecked) return both;
  return CanonicalFloat16NaNs(dpair, both);
#else
  return hn::Combine(dpair, NarrowToHalfBits<kType>(df, hi),
                     NarrowToHalfBits<kType>(df, lo));
#endif
}
#endif

#if HWY_TARGET != HWY_SCALAR
// bfloat16 in pair order: 2 L patterns read as L 32-bit lanes widen as the
// even elements (low halves) and the odd ones with a shift or a mask, and
// narrow back with no lane permutes, which cost AVX2 most. For constants
// that are one channel's or put in pair order once. A specialization kept
// on measurement: kernel_bench's bf16 BatchNorm within the AVX2 bound
// (docs/design/kernels.md).
template <class DF>
HWY_INLINE hn::Vec<DF> EvenBFloat16(DF df,
                                    hn::Vec<hn::RebindToUnsigned<DF>> pairs) {
  return hn::BitCast(df, hn::ShiftLeft<16>(pairs));
}
template <class DF>
HWY_INLINE hn::Vec<DF> OddBFloat16(DF df,
                                   hn::Vec<hn::RebindToUnsigned<DF>> pairs) {
  const hn::RebindToUnsigned<DF> du32;
  return hn::BitCast(df, hn::And(pairs, hn::Set(du32, 0xffff0000u)));
}

// Vector v of a pair of vectors of bfloat16 values in pair order, `at` its
// first position: the even values of the pair for v even, the odd ones for
// v odd.
template <class DF>
HWY_INLINE hn::Vec<DF> PairVector(DF df, const uint16_t* at, int v) {
  const hn::RebindToUnsigned<DF> du32;
  const auto pairs =
      hn::LoadU(du32, reinterpret_cast<const uint32_t*>(
                          at - v % 2 * static_cast<int64_t>(hn::Lanes(df))));
  return v % 2 == 0 ? EvenBFloat16(df, pairs) : OddBFloat16(df, pairs);
}

// The bfloat16 patterns of even and odd elements' results, in pair order
// (NaNs as kNaNs).
template <NaNs kNaNs = NaNs::kCanonical, class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> BFloat16Pairs(DF df,
                                                           hn::Vec<DF> even,
                                                           hn::Vec<DF> odd) {
  const hn::RebindToUnsigned<DF> du32;
  return hn::Or(
      hn::And(BFloat16InHighHalves<kNaNs>(df, odd), hn::Set(du32, 0xffff0000u)),
      hn::ShiftRight<16>(BFloat16InHighHalves<kNaNs>(df, even)));
}
#endif

// Puts a[0..n) (n a multiple of 2 lanes) in pair order: each 2 lanes values
// as the even ones, then the odd ones; or (`back`) the reverse.
template <typename T>
void PairOrder(T* HWY_RESTRICT a, int64_t n, int64_t lanes, bool back) {
  T copy[2 * hn::MaxLanes(hn::ScalableTag<float>())];
  for (int64_t b = 0; b < n; b += 2 * lanes) {
    std::copy(a + b, a + b + 2 * lanes, copy);
    // Position j (even) and lanes + j (odd) hold values 2 j and 2 j + 1.
    for (int64_t j = 0; j < lanes; ++j) {
      if (back) {
        a[b + 2 * j] = copy[j];
        a[b + 2 * j + 1] = copy[lanes + j];
      } else {
        a[b + j] = copy[2 * j];
        a[b + lanes + j] = copy[2 * j + 1];
      }
    }
  }
}

// The fp32 vectors of the kernels: at most a 64-byte line.
using FloatVectorTag = hn::CappedTag<float, 16>;

// How the kernels read and write kType: its stored values and the values
// they compute in (fp64 for fp64, else fp32: 16-bit values widened as
// loaded, narrowed as written).
template <DType kType>
struct Elements {
  static constexpr bool kHalf =
      kType == DType::kBFloat16 || kType == DType::kFloat16;
  using Stored = std::conditional_t<
      kType == DType::kFloat32, float,
      std::conditional_t<kType == DType::kFloat64, double, uint16_t>>;
  using Value = std::conditional_t<kType == DType::kFloat64, double, float>;
  using ValueTag = std::conditional_t<kType == DType::kFloat64,
                                      hn::CappedTag<double, 8>, FloatVectorTag>;
  // The output vectors: 16-bit ones hold two fp32 vectors (one on scalar).
#if HWY_TARGET == HWY_SCALAR
  using OutTag =
      std::conditional_t<kHalf, hn::Rebind<uint16_t, ValueTag>, ValueTag>;
#else
  using OutTag =
      std::conditional_t<kHalf, hn::Repartition<uint16_t, ValueTag>, ValueTag>;
#endif

  static HWY_INLINE Value Scalar(Stored v) {
    if constexpr (kHalf) {
      return HalfToFloat(kType, v);
    } else {
      return v;
    }
  }
  // A whole vector of fp32 values (tag df) from p (fp32 and 16-bit).
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const Stored* p) {
    if constexpr (kHalf) {
      return WidenHalfBits<kType>(df, hn::LoadU(HalfBitsTag<DF>(), p));
    } else {
      return hn::LoadU(df, p);
    }
  }
  // Elements [j, j + count) of x as values (count <= the value lanes).
  static HWY_INLINE hn::Vec<ValueTag> Load(const Stored* x, int64_t j,
                                           size_t count) {
    const ValueTag d;
    if constexpr (kHalf) {
      return WidenHalfBits<kType>(
          d, LoadPart(HalfBitsTag<ValueTag>(), x + j, count));
    } else {
      return LoadPart(d, x + j, count);
    }
  }

  // The output vector of elements [j, j + count) from results(j', count'),
  // the values of [j', j' + count') (count' may be 0), narrowed if 16-bit.
  template <class Results>
  static HWY_INLINE hn::Vec<OutTag> Output(int64_t j, size_t count,
                                           const Results& results) {
    if constexpr (!kHalf) {
      return results(j, count);
    } else {
      const ValueTag d;
#if HWY_TARGET == HWY_SCALAR
      return NarrowToHalfBits<kType>(d, results(j, count));
#else
      const size_t lanes = hn::Lanes(d);
      const size_t low = std::min(count, lanes);
      // In this order: results may keep a position that moves by little.
      const auto first = results(j, low);
      const auto second = results(j + static_cast<int64_t>(lanes), count - low);
      return NarrowPairToHalfBits<kType>(d, first, second);
#endif
    }
  }
};

// Calls f.template operator()<kType>() with dtype as a constant.
template <class F>
HWY_INLINE void ForDType(DType dtype, const F& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f.template operator()<DType::kFloat32>();
    case DType::kFloat64:
      return f.template operator()<DType::kFloat64>();
    case DType::kBFloat16:
      return f.template operator()<DType::kBFloat16>();
    case DType::kFloat16:
      return f.template operator()<DType::kFloat16>();
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_HALF_INL_H_
