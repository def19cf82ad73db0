// The channel affine of one vector of fp32 values, stored: the step every
// kernel that writes ChannelAffineWrite's output shares, so that their
// bits are the same. Include in files compiled per target, after
// hwy/highway.h.

// Per-target include guard: toggled for each pass of foreach_target.h.
#if defined(NORMD_SERVER_CORE_SIMD_AFFINE_STORE_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef NORMD_SERVER_CORE_SIMD_AFFINE_STORE_INL_H_
#undef NORMD_SERVER_CORE_SIMD_AFFINE_STORE_INL_H_
#else
#define NORMD_SERVER_CORE_SIMD_AFFINE_STORE_INL_H_
#endif

#include "hwy/highway.h"
#include "server/core/simd/half-inl.h"
#include "server/core/simd/ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// fma(v - a, b, c) in fp32 (ChannelAffineWrite's fp32 and 16-bit step),
// narrowed to kType and stored at y: streamed with kStream (y aligned to
// the stored vector) when the vector fills a register, else an ordinary
// store.
template <DType kType, bool kStream, class D>
HWY_INLINE void StoreAffine(D d, hn::Vec<D> v, hn::Vec<D> a, hn::Vec<D> b,
                            hn::Vec<D> c,
                            typename Elements<kType>::Stored* HWY_RESTRICT y) {
  const auto result = ExactMulAdd(d, hn::Sub(v, a), b, c);
  auto store = [&](auto tag, auto out) NORMD_LAMBDA_INLINE {
    using Tag = decltype(tag);
    // Streams write whole 16-byte registers: narrower vectors (16-bit
    // values from 4 fp32 lanes) are stored.
    constexpr bool kWhole = sizeof(hn::TFromD<Tag>) * hn::MaxLanes(Tag()) >= 16;
    if constexpr (kStream && kWhole) {
      hn::Stream(out, tag, y);
    } else {
      hn::StoreU(out, tag, y);
    }
  };
  if constexpr (Elements<kType>::kHalf) {
    store(HalfBitsTag<D>(), NarrowToHalfBits<kType>(d, result));
  } else {
    store(d, result);
  }
}

// StoreAffine of vector `place` of a moments panel (block_moments.cc's and
// channel_moments.cc's writes): the panel's vectors 2j and 2j + 1 are
// adjacent in y and come in that order. A 16-bit result of an even vector
// waits in `held` for the odd one's, and the two are narrowed together with
// one permute, as ChannelAffineWrite narrows (y of the pair aligned to the
// stored vector with kStream); one at a time, each needs a shift and a
// permute of its own. fp32, and every vector on scalar: StoreAffine.
template <DType kType, bool kStream, class D>
HWY_INLINE void StorePanelAffine(
    D d, int place, hn::Vec<D> v, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D> c,
    typename Elements<kType>::Stored* HWY_RESTRICT y,
    float* HWY_RESTRICT held) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (Elements<kType>::kHalf) {
    const auto result = ExactMulAdd(d, hn::Sub(v, a), b, c);
    if (place % 2 == 0) {
      hn::StoreU(result, d, held);
      return;
    }
    const hn::Repartition<uint16_t, D> dpair;
    const auto out = NarrowPairToHalfBits<kType>(d, hn::LoadU(d, held), result);
    auto* first = y - hn::Lanes(d);
    if constexpr (kStream) {
      hn::Stream(out, dpair, first);
    } else {
      hn::StoreU(out, dpair, first);
    }
    return;
  }
#endif
  StoreAffine<kType, kStream>(d, v, a, b, c, y);
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_AFFINE_STORE_INL_H_
