// Loads and stores of the first `count` lanes of a vector (count below the
// lane count), touching no memory past them: the partial vectors at the
// ends of a run. Masked instructions where the target has them for the lane
// size (AVX2 32- and 64-bit lanes, AVX3 and SVE all); elsewhere (Highway's
// MaskedLoad and BlendedStore there read or write the whole vector) through
// a zero-padded copy. Include inside a file compiled per target, after
// hwy/highway.h; 16-, 32- and 64-bit lanes.

// Per-target include guard: toggled for each pass of foreach_target.h.
#if defined(NORMD_SERVER_CORE_SIMD_TAIL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef NORMD_SERVER_CORE_SIMD_TAIL_INL_H_
#undef NORMD_SERVER_CORE_SIMD_TAIL_INL_H_
#else
#define NORMD_SERVER_CORE_SIMD_TAIL_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#undef NORMD_HWY_MASKED_TAIL
#undef NORMD_HWY_MASKED_TAIL16
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || HWY_HAVE_SCALABLE
#define NORMD_HWY_MASKED_TAIL 1
#else
#define NORMD_HWY_MASKED_TAIL 0
#endif
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3) || HWY_HAVE_SCALABLE
#define NORMD_HWY_MASKED_TAIL16 1
#else
#define NORMD_HWY_MASKED_TAIL16 0
#endif

// Whether lanes of T take the masked instructions.
template <typename T>
constexpr bool MaskedTail() {
  return sizeof(T) >= 4 ? NORMD_HWY_MASKED_TAIL : NORMD_HWY_MASKED_TAIL16;
}

// p[0..count) in the first lanes, zeros in the rest.
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> LoadHead(D d, const T* p, size_t count) {
  static_assert(sizeof(T) >= 2, "16-, 32- and 64-bit lanes");
  if constexpr (MaskedTail<T>()) {
    return hn::MaskedLoad(hn::FirstN(d, count), d, p);
  } else {
    HWY_ALIGN T padded[hn::MaxLanes(D())] = {};
    std::copy(p, p + count, padded);
    return hn::Load(d, padded);
  }
}

// p[0..count) as LoadHead, or a whole vector's worth (count the lane
// count) as LoadU.
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> LoadPart(D d, const T* p, size_t count) {
  return count == hn::Lanes(d) ? hn::LoadU(d, p) : LoadHead(d, p, count);
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

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_TAIL_INL_H_
