// A fused multiply-add that rounds once on every target, for the Highway
// kernels: include inside a file compiled per target, after hwy/highway.h.
// Targets with FMA instructions (AVX2, AVX3, NEON, SVE) use them; on SSE4
// and the scalar target, Highway's MulAdd multiplies and adds with two
// roundings, so fp32 a * b + c is computed there in fp64 (the product is
// exact) with the sum rounded to odd, which the final rounding to fp32 turns
// into the correctly rounded result: the bits of the instruction. Pure
// functions.

// Per-target include guard: toggled for each pass of foreach_target.h.
#if defined(NORMD_SERVER_CORE_SIMD_FMA_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef NORMD_SERVER_CORE_SIMD_FMA_INL_H_
#undef NORMD_SERVER_CORE_SIMD_FMA_INL_H_
#else
#define NORMD_SERVER_CORE_SIMD_FMA_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if !HWY_NATIVE_FMA
// a + b in fp64, rounded to odd: rounded to nearest, then, when that was
// inexact and its last mantissa bit is even, moved one unit toward the
// exact sum. Rounding the result once more to a format at least two bits
// narrower (fp32) gives the correctly rounded a + b. Non-finite sums are
// left as they are.
template <class DD>
HWY_INLINE hn::Vec<DD> AddRoundToOdd(DD dd, hn::Vec<DD> a, hn::Vec<DD> b) {
  const hn::RebindToUnsigned<DD> du;
  const auto sum = hn::Add(a, b);
  // TwoSum: the exact error of the rounded sum.
  const auto b_part = hn::Sub(sum, a);
  const auto error =
      hn::Add(hn::Sub(a, hn::Sub(sum, b_part)), hn::Sub(b, b_part));
  const auto bits = hn::BitCast(du, sum);
  const auto even = hn::Eq(hn::And(bits, hn::Set(du, 1)), hn::Zero(du));
  const auto inexact = hn::Ne(error, hn::Zero(dd));
  // Toward the exact sum: away from zero when the error has the sum's sign.
  const auto same_sign = hn::Eq(hn::ShiftRight<63>(hn::BitCast(du, error)),
                                hn::ShiftRight<63>(bits));
  const auto odd = hn::IfThenElse(same_sign, hn::Add(bits, hn::Set(du, 1)),
                                  hn::Sub(bits, hn::Set(du, 1)));
  const auto adjust = hn::And(hn::And(even, hn::RebindMask(du, inexact)),
                              hn::RebindMask(du, hn::IsFinite(sum)));
  return hn::BitCast(dd, hn::IfThenElse(adjust, odd, bits));
}

// fp64 lanes rounded to fp32 to nearest, overflowing to infinity. The
// scalar target's DemoteTo saturates at the largest float instead.
template <class DD>
HWY_INLINE hn::Vec<hn::Rebind<float, DD>> RoundToFloat(DD dd, hn::Vec<DD> v) {
  const hn::Rebind<float, DD> df;
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(df, static_cast<float>(hn::GetLane(v)));
#else
  return hn::DemoteTo(df, v);
#endif
}

// fp32 mul * x + add of Rebind<float, DD> lanes, rounded once.
template <class DD, class VF>
HWY_INLINE VF MulAddViaDouble(DD dd, VF mul, VF x, VF add) {
  const auto product =
      hn::Mul(hn::PromoteTo(dd, mul), hn::PromoteTo(dd, x));  // Exact.
  return RoundToFloat(dd, AddRoundToOdd(dd, product, hn::PromoteTo(dd, add)));
}
#endif  // !HWY_NATIVE_FMA

// mul * x + add with one rounding, as FMA instructions compute it.
template <class D>
HWY_INLINE hn::Vec<D> ExactMulAdd(D d, hn::Vec<D> mul, hn::Vec<D> x,
                                  hn::Vec<D> add) {
#if HWY_NATIVE_FMA
  return hn::MulAdd(mul, x, add);
#elif HWY_TARGET == HWY_SCALAR
  const hn::Rebind<double, D> dd;
  return MulAddViaDouble(dd, mul, x, add);
#else
  // fp32 lanes in two halves of fp64 lanes.
  static_assert(sizeof(hn::TFromD<D>) == 4, "fp32 only");
  const hn::Half<D> dh;
  const hn::Rebind<double, decltype(dh)> dd;
  const auto low = MulAddViaDouble(
      dd, hn::LowerHalf(dh, mul), hn::LowerHalf(dh, x), hn::LowerHalf(dh, add));
  const auto high = MulAddViaDouble(
      dd, hn::UpperHalf(dh, mul), hn::UpperHalf(dh, x), hn::UpperHalf(dh, add));
  return hn::Combine(d, high, low);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_FMA_INL_H_
