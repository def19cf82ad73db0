// fold::FoldHalves (fold.h) of lane sums in vector registers: the same
// additions in the same order, so the same bits, in a handful of vector
// operations instead of a scalar chain. Include inside a file compiled per
// target (foreach_target.h), after hwy/highway.h.

// Per-target include guard: toggled for each pass of foreach_target.h.
#if defined(NORMD_SERVER_CORE_SIMD_FOLD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef NORMD_SERVER_CORE_SIMD_FOLD_INL_H_
#undef NORMD_SERVER_CORE_SIMD_FOLD_INL_H_
#else
#define NORMD_SERVER_CORE_SIMD_FOLD_INL_H_
#endif

#include <cstddef>

#include "hwy/highway.h"
#include "server/core/simd/fold.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether this target folds with vector halves: fixed-width targets with
// more than one lane (scalable SVE and the scalar target use fold.h).
#undef NORMD_HWY_VECTOR_FOLD
#if HWY_HAVE_SCALABLE || HWY_TARGET == HWY_SCALAR
#define NORMD_HWY_VECTOR_FOLD 0
#else
#define NORMD_HWY_VECTOR_FOLD 1
#endif

#if NORMD_HWY_VECTOR_FOLD
// FoldHalves of the lanes of v: the upper half added onto the lower half,
// recursively, down to lane 0.
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

// fold::FoldHalves<N> of t[0..N) (N a power of two): the result, t[0]
// afterwards (t is clobbered).
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

// Stores v0..v3 to out, one after the other: a panel of four registers of
// lane sums.
template <class D, class V = hn::Vec<D>>
HWY_INLINE void StorePanel(D d, V v0, V v1, V v2, V v3,
                           hn::TFromD<D>* HWY_RESTRICT out) {
  const size_t lanes = hn::Lanes(d);
  hn::StoreU(v0, d, out);
  hn::StoreU(v1, d, out + lanes);
  hn::StoreU(v2, d, out + 2 * lanes);
  hn::StoreU(v3, d, out + 3 * lanes);
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_FOLD_INL_H_
