// Vector conversions between fp32 and the 16-bit storage formats, for the
// Highway kernels of every target: include inside a file compiled per
// target (foreach_target.h), after hwy/highway.h. They give the bits of
// half.h's scalar conversions on every target: widening is exact (float16
// NaNs come out quiet, as the CPUs' own instructions make them), narrowing
// rounds to nearest even, and every NaN narrows to the canonical NaN. Also
// how the kernels read and write elements of each dtype (Elements).
// Where a target's instructions do this (F16C on AVX2 and AVX3, NEON and
// SVE) float16 uses them; elsewhere, and for bfloat16 everywhere (Highway
// 1.0.3's DemoteTo truncates), the same integer and fp32 steps as half.h.
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

// Whether this target converts float16 with instructions that round to
// nearest even and handle subnormals, infinities and NaNs exactly.
#undef NORMD_HWY_EXACT_F16
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || \
    (HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_SCALAR)
#define NORMD_HWY_EXACT_F16 1
#else
#define NORMD_HWY_EXACT_F16 0
#endif

// The lanes of f that are not NaN. f == f rather than IsNaN: on AVX-512
// the compare reads f from a register, where GCC 12 loads f from memory a
// second time for IsNaN's class test.
template <class V>
HWY_INLINE auto IsOrdered(V f) {
  return hn::Eq(f, f);
}

// The 16-bit patterns of a vector of fp32 lanes: the same lane count.
template <class DF>
using HalfBitsTag = hn::Rebind<uint16_t, DF>;

// bfloat16 patterns to fp32: the patterns become the top 16 bits.
template <class DF>
HWY_INLINE hn::Vec<DF> WidenBFloat16(DF df, hn::Vec<HalfBitsTag<DF>> h) {
  const hn::RebindToUnsigned<DF> du32;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, h)));
}

// float16 patterns to fp32, exactly. NaNs come out quiet, as from the
// instructions: the portable form's multiplication quiets them.
template <class DF>
HWY_INLINE hn::Vec<DF> WidenFloat16(DF df, hn::Vec<HalfBitsTag<DF>> h) {
#if NORMD_HWY_EXACT_F16
  const hn::Rebind<hwy::float16_t, DF> df16;
  return hn::PromoteTo(df, hn::BitCast(df16, h));
#else
  // Float16ToFloat (half.h), lane by lane.
  const hn::RebindToUnsigned<DF> du32;
  const auto w = hn::ShiftLeft<16>(hn::PromoteTo(du32, h));
  const auto sign = hn::And(w, hn::Set(du32, 0x80000000u));
  const auto two_w = hn::Add(w, w);
  const auto normalized = hn::Mul(
      hn::BitCast(
          df, hn::Add(hn::ShiftRight<4>(two_w), hn::Set(du32, 0xe0u << 23))),
      hn::Set(df, 0x1.0p-112f));
  const auto denormalized = hn::Sub(
      hn::BitCast(df,
                  hn::Or(hn::ShiftRight<17>(two_w), hn::Set(du32, 126u << 23))),
      hn::Set(df, 0.5f));
  const auto magnitude = hn::IfThenElse(hn::Lt(two_w, hn::Set(du32, 1u << 27)),
                                        hn::BitCast(du32, denormalized),
                                        hn::BitCast(du32, normalized));
  return hn::BitCast(df, hn::Or(sign, magnitude));
#endif
}

// The two above by dtype (bfloat16 or float16), chosen at compile time.
template <DType kType, class DF>
HWY_INLINE hn::Vec<DF> WidenHalfBits(DF df, hn::Vec<HalfBitsTag<DF>> h) {
  if constexpr (kType == DType::kBFloat16) return WidenBFloat16(df, h);
  return WidenFloat16(df, h);
}

// fp32 to bfloat16, round to nearest even, in the high 16 bits of each
// 32-bit lane (the low bits are garbage): adds 0x7fff plus the lowest kept
// bit; NaN gives the canonical NaN.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> BFloat16InHighHalves(
    DF df, hn::Vec<DF> f) {
  const hn::RebindToUnsigned<DF> du32;
  const auto bits = hn::BitCast(du32, f);
#if HWY_ARCH_X86 && HWY_TARGET >= HWY_AVX2
  // Without mask registers a blend costs two operations: the lowest kept
  // bit shifted down and added instead (the same sum).
  const auto rounded =
      hn::Add(hn::Add(bits, hn::Set(du32, 0x7fffu)),
              hn::And(hn::ShiftRight<16>(bits), hn::Set(du32, 1u)));
#else
  const auto odd = hn::TestBit(bits, hn::Set(du32, 0x10000u));
  const auto rounded = hn::Add(bits, hn::IfThenElse(odd, hn::Set(du32, 0x8000u),
                                                    hn::Set(du32, 0x7fffu)));
#endif
  return hn::IfThenElse(hn::RebindMask(du32, IsOrdered(f)), rounded,
                        hn::Set(du32, uint32_t{kCanonicalBFloat16NaN} << 16));
}

// fp32 to bfloat16 patterns, round to nearest even, canonical NaN.
template <class DF>
HWY_INLINE hn::Vec<HalfBitsTag<DF>> NarrowToBFloat16(DF df, hn::Vec<DF> f) {
  return hn::TruncateTo(HalfBitsTag<DF>(),
                        hn::ShiftRight<16>(BFloat16InHighHalves(df, f)));
}

// fp32 to float16 patterns, round to nearest even; overflow gives
// infinity, canonical NaN.
template <class DF>
HWY_INLINE hn::Vec<HalfBitsTag<DF>> NarrowToFloat16(DF df, hn::Vec<DF> f) {
  const hn::RebindToUnsigned<DF> du32;
#if NORMD_HWY_EXACT_F16
  // The instruction keeps a NaN's payload: make it the one NaN whose
  // narrowing is the canonical pattern.
  f = hn::IfThenElse(
      IsOrdered(f), f,
      hn::BitCast(df, hn::Set(du32, kFloatNaNOfCanonicalFloat16)));
  const hn::Rebind<hwy::float16_t, DF> df16;
  return hn::BitCast(HalfBitsTag<DF>(), hn::DemoteTo(df16, f));
#else
  // FloatToFloat16 (half.h), lane by lane.
  const auto w = hn::BitCast(du32, f);
  auto base = hn::Mul(hn::Mul(hn::Abs(f), hn::Set(df, 0x1.0p+112f)),
                      hn::Set(df, 0x1.0p-110f));
  const auto shl1_w = hn::Add(w, w);
  const auto sign = hn::And(w, hn::Set(du32, 0x80000000u));
  const auto bias = hn::Max(hn::And(shl1_w, hn::Set(du32, 0xff000000u)),
                            hn::Set(du32, 0x71000000u));
  base = hn::Add(hn::BitCast(df, hn::Add(hn::ShiftRight<1>(bias),
                                         hn::Set(du32, 0x07800000u))),
                 base);
  const auto bits = hn::BitCast(du32, base);
  const auto exp_bits =
      hn::And(hn::ShiftRight<13>(bits), hn::Set(du32, 0x00007c00u));
  const auto mantissa_bits = hn::And(bits, hn::Set(du32, 0x00000fffu));
  auto result =
      hn::Or(hn::ShiftRight<16>(sign), hn::Add(exp_bits, mantissa_bits));
  result = hn::IfThenElse(hn::Gt(shl1_w, hn::Set(du32, 0xff000000u)),
                          hn::Set(du32, kCanonicalFloat16NaN), result);
  return hn::TruncateTo(HalfBitsTag<DF>(), result);
#endif
}

// The two above by dtype, chosen at compile time.
template <DType kType, class DF>
HWY_INLINE hn::Vec<HalfBitsTag<DF>> NarrowToHalfBits(DF df, hn::Vec<DF> f) {
  if constexpr (kType == DType::kBFloat16) {
    return NarrowToBFloat16(df, f);
  }
  return NarrowToFloat16(df, f);
}

// The 16-bit patterns of two vectors of fp32, `lo` first, in one vector of
// twice the lanes: bfloat16 picks the rounded high halves with one
// two-table permute (no shifts), float16 joins the two narrowings. Not on
// the scalar target (one lane).
#if HWY_TARGET != HWY_SCALAR
template <DType kType, class DF>
HWY_INLINE hn::Vec<hn::Repartition<uint16_t, DF>> NarrowPairToHalfBits(
    DF df, hn::Vec<DF> lo, hn::Vec<DF> hi) {
  const hn::Repartition<uint16_t, DF> dpair;
  if constexpr (kType == DType::kBFloat16) {
    return hn::ConcatOdd(dpair,
                         hn::BitCast(dpair, BFloat16InHighHalves(df, hi)),
                         hn::BitCast(dpair, BFloat16InHighHalves(df, lo)));
  }
  return hn::Combine(dpair, NarrowToFloat16(df, hi), NarrowToFloat16(df, lo));
}
#endif

#if HWY_TARGET != HWY_SCALAR
// bfloat16 in pair order: a vector of 2 L bfloat16 patterns read as L
// 32-bit lanes holds elements 2i (low halves) and 2i + 1 (high halves).
// Widening them as two fp32 vectors, the even elements and the odd ones,
// takes a shift and a mask, and narrowing results back into the same
// order two shifts, a mask and an or: no lane permutes, which cost AVX2
// most. For kernels whose per-element constants do not depend on the
// order (one channel's), or are put in pair order once (ConcatEven /
// ConcatOdd of natural-order vectors). A specialization kept on
// measurement: it brought bf16 BatchNorm within the AVX2 bound (per-target
// rows in bench/HISTORY.md, "The core on Highway").
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
// The bfloat16 patterns of fp32 results of even and odd elements, in pair
// order.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> BFloat16Pairs(DF df,
                                                           hn::Vec<DF> even,
                                                           hn::Vec<DF> odd) {
  const hn::RebindToUnsigned<DF> du32;
  return hn::Or(
      hn::And(BFloat16InHighHalves(df, odd), hn::Set(du32, 0xffff0000u)),
      hn::ShiftRight<16>(BFloat16InHighHalves(df, even)));
}
#endif

// The fp32 vectors of the elementwise kernels: at most 16 lanes (a 64-byte
// line), so that a line is a whole number of vectors on every target.
using FloatVectorTag = hn::CappedTag<float, 16>;

// How the kernels read and write elements of kType: its stored values, and
// the values they are computed in (fp64 for fp64, else fp32: 16-bit values
// are widened exactly as loaded and narrowed as written).
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
  // The output vectors: for 16-bit types two fp32 vectors' worth (one on
  // the scalar target, which has no pairs).
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
  // the values of elements [j', j' + count') (count' may be 0), narrowed
  // for 16-bit types.
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
