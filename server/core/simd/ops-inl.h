// Operations the kernels build from Highway 1.0.3's, with the same bits on
// every target: fp64 to fp32 as a cast rounds, a multiply-add that rounds
// once, loads and stores of a vector's first lanes, and fold::FoldHalves and
// fold::SixteenRowSums in registers. Include in files compiled per target
// (foreach_target.h), after hwy/highway.h. Pure functions.

// Per-target include guard: toggled for each pass of foreach_target.h.
#if defined(NORMD_SERVER_CORE_SIMD_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef NORMD_SERVER_CORE_SIMD_OPS_INL_H_
#undef NORMD_SERVER_CORE_SIMD_OPS_INL_H_
#else
#define NORMD_SERVER_CORE_SIMD_OPS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "server/core/simd/fold.h"

// For the lambdas of the kernels' loops: inlined, so that their captures
// stay in registers (a called lambda reloads them after every store).
// Not in sanitizer builds (CMakeLists.txt), which take many minutes to
// instrument the result.
#undef NORMD_LAMBDA_INLINE
#ifdef NORMD_SANITIZED_BUILD
#define NORMD_LAMBDA_INLINE
#else
#define NORMD_LAMBDA_INLINE __attribute__((always_inline))
#endif

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// fp64 lanes rounded to fp32, overflowing to infinity (the scalar target's
// DemoteTo saturates instead).
template <class DD>
HWY_INLINE hn::Vec<hn::Rebind<float, DD>> RoundToFloat(DD dd, hn::Vec<DD> v) {
  const hn::Rebind<float, DD> df;
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(df, static_cast<float>(hn::GetLane(v)));
#else
  return hn::DemoteTo(df, v);
#endif
}

// A multiply-add that rounds once on every target: the FMA instruction
// where there is one; on SSE4 and scalar (where Highway's MulAdd rounds
// twice), fp32 a * b + c in fp64 (the product exact) with the sum rounded
// to odd, which the rounding to fp32 makes correctly rounded.
#if !HWY_NATIVE_FMA
// a + b in fp64 rounded to odd: to nearest, then, if inexact with an even
// last bit, one unit toward the exact sum. Non-finite sums stay as they are.
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

// Loads and stores of a vector's first `count` lanes (fewer than all)
// touching no memory past them: masked instructions where the target has
// them for the lane size (AVX2 32- and 64-bit, AVX3, SVE), elsewhere a
// zero-padded copy (Highway's MaskedLoad and BlendedStore touch the whole
// vector there).
template <typename T>
constexpr bool MaskedTail() {
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3) || HWY_HAVE_SCALABLE
  return true;
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return sizeof(T) >= 4;
#else
  return false;
#endif
}

// p[0..count) in the first lanes, zeros in the rest (a whole vector when
// count is the lane count).
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> LoadPart(D d, const T* p, size_t count) {
  static_assert(sizeof(T) >= 2, "16-, 32- and 64-bit lanes");
  if (count == hn::Lanes(d)) return hn::LoadU(d, p);
  if constexpr (MaskedTail<T>()) {
    return hn::MaskedLoad(hn::FirstN(d, count), d, p);
  } else {
    HWY_ALIGN T padded[hn::MaxLanes(D())] = {};
    std::copy(p, p + count, padded);
    return hn::Load(d, padded);
  }
}

// The first count lanes of v into p[0..count).
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE void StoreHead(D d, hn::Vec<D> v, T* p, size_t count) {
  static_assert(sizeof(T) >= 2, "16-, 32- and 64-bit lanes");
  if constexpr (MaskedTail<T>()) {
    hn::BlendedStore(v, hn::FirstN(d, count), d, p);
  } else {
    HWY_ALIGN T padded[hn::MaxLanes(D())];
    hn::Store(v, d, padded);
    std::copy(padded, padded + count, p);
  }
}

// fold::FoldHalves in vector registers: the same additions in the same
// order. On fixed-width targets with more than one lane; SVE and scalar
// use fold.h.
#undef NORMD_HWY_VECTOR_FOLD
#if HWY_HAVE_SCALABLE || HWY_TARGET == HWY_SCALAR
#define NORMD_HWY_VECTOR_FOLD 0
#else
#define NORMD_HWY_VECTOR_FOLD 1
#endif

#if NORMD_HWY_VECTOR_FOLD
// FoldHalves of v's lanes: the upper half onto the lower, down to lane 0.
template <class D>
HWY_INLINE hn::TFromD<D> FoldLanes(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) == 1) {
    return hn::GetLane(v);
  } else {
    const hn::Half<D> half;
    return FoldLanes(half,
                     hn::Add(hn::LowerHalf(half, v), hn::UpperHalf(half, v)));
  }
}
#endif

// fold::FoldHalves<N> of t[0..N) (clobbered): the sum.
template <int N, typename T>
HWY_INLINE T FoldArray(T* HWY_RESTRICT t) {
#if NORMD_HWY_VECTOR_FOLD
  const hn::CappedTag<T, N> d;
  constexpr int kLanes = static_cast<int>(hn::MaxLanes(decltype(d)()));
  if constexpr (kLanes == N) {
    return FoldLanes(d, hn::LoadU(d, t));
  } else {
    for (int j = 0; j < N / 2; j += kLanes) {
      hn::StoreU(hn::Add(hn::LoadU(d, t + j), hn::LoadU(d, t + j + N / 2)), d,
                 t + j);
    }
    return FoldArray<N / 2>(t);
  }
#else
  fold::FoldHalves<N>(t);
  return t[0];
#endif
}

// fold::SixteenRowSums in vector registers: the same additions.
template <typename T>
HWY_INLINE void SixteenRowSums(const float* HWY_RESTRICT rows,
                               T* HWY_RESTRICT out) {
#if NORMD_HWY_VECTOR_FOLD
  const hn::CappedTag<T, 16> d;
  constexpr int kLanes = static_cast<int>(hn::MaxLanes(decltype(d)()));
  hn::Vec<decltype(d)> a[128 / kLanes];  // The 128 partial sums, in order.
  if constexpr (kLanes == 16) {
    // A row per vector: two rows' halves in one vector each.
    for (int r = 0; r < 8; ++r) {
      const auto lo = hn::LoadU(d, rows + 32 * r);
      const auto hi = hn::LoadU(d, rows + 32 * r + 16);
      a[r] = hn::Add(hn::ConcatLowerLower(d, hi, lo),
                     hn::ConcatUpperUpper(d, hi, lo));
    }
  } else {
    // A row's halves are whole vectors.
    auto load = [d](const float* at) {
      if constexpr (std::is_same_v<T, float>) {
        return hn::LoadU(d, at);
      } else {
        return hn::PromoteTo(d,
                             hn::LoadU(hn::Rebind<float, decltype(d)>(), at));
      }
    };
    constexpr int kPerHalf = 8 / kLanes;
    for (int k = 0; k < 16; ++k) {
      for (int v = 0; v < kPerHalf; ++v) {
        const float* at = rows + 16 * k + v * kLanes;
        a[k * kPerHalf + v] = hn::Add(load(at), load(at + 8));
      }
    }
  }
  for (int n = 64 / kLanes; n >= 16 / kLanes; n /= 2) {
    for (int i = 0; i < n; ++i) {
      a[i] = hn::Add(hn::ConcatEven(d, a[2 * i + 1], a[2 * i]),
                     hn::ConcatOdd(d, a[2 * i + 1], a[2 * i]));
    }
  }
  for (int i = 0; i < 16 / kLanes; ++i) hn::StoreU(a[i], d, out + i * kLanes);
#else
  fold::SixteenRowSums(rows, out);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_OPS_INL_H_
