// The channel affine of fp32 vectors, and its stores: the step that
// ChannelAffineWrite and the kernels that write its output as they read
// (the fused moments passes) share, so that their bits are the same.
// Include in files compiled per target, after hwy/highway.h.

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

// The channel affine of fp32 values: fma(v - a, b, c), rounded once
// (ChannelAffineWrite's step for fp32 and 16-bit values).
template <class D>
HWY_INLINE hn::Vec<D> FloatChannelAffine(D d, hn::Vec<D> v, hn::Vec<D> a,
                                         hn::Vec<D> b, hn::Vec<D> c) {
  return ExactMulAdd(d, hn::Sub(v, a), b, c);
}

// Stores `out` (tag `tag`) at y: streamed with kStream (y aligned to the
// vector) when it fills a 16-byte register, else an ordinary store (a
// stream writes whole registers: 16-bit values from 4 fp32 lanes are
// narrower).
template <bool kStream, class Tag, typename T>
HWY_INLINE void StoreOrStream(Tag tag, hn::Vec<Tag> out, T* HWY_RESTRICT y) {
  constexpr bool kWhole = sizeof(hn::TFromD<Tag>) * hn::MaxLanes(Tag()) >= 16;
  if constexpr (kStream && kWhole) {
    hn::Stream(out, tag, y);
  } else {
    hn::StoreU(out, tag, y);
  }
}

// FloatChannelAffine of v, or with kDeviations of the v that is already v -
// a (a unused; the same bits): fma(v, b, c).
template <bool kDeviations, class D>
HWY_INLINE hn::Vec<D> ChannelAffineOf(D d, hn::Vec<D> v, hn::Vec<D> a,
                                      hn::Vec<D> b, hn::Vec<D> c) {
  if constexpr (kDeviations) {
    return ExactMulAdd(d, v, b, c);
  } else {
    return FloatChannelAffine(d, v, a, b, c);
  }
}

// ChannelAffineOf v, narrowed to kType (NaNs as kNaNs) and stored at y
// (StoreOrStream).
template <DType kType, bool kStream, bool kDeviations = false,
          NaNs kNaNs = NaNs::kCanonical, class D>
HWY_INLINE void StoreAffine(D d, hn::Vec<D> v, hn::Vec<D> a, hn::Vec<D> b,
                            hn::Vec<D> c,
                            typename Elements<kType>::Stored* HWY_RESTRICT y) {
  const auto result = ChannelAffineOf<kDeviations>(d, v, a, b, c);
  if constexpr (Elements<kType>::kHalf) {
    StoreOrStream<kStream>(HalfBitsTag<D>(),
                           NarrowToHalfBits<kType, kNaNs>(d, result), y);
  } else {
    StoreOrStream<kStream>(d, result, y);
  }
}

// StoreAffine of vector `place` of a moments panel (block_moments.cc's and
// channel_moments.cc's writes): the panel's vectors 2j and 2j + 1 are
// adjacent in y and come in that order. A 16-bit result of an even vector
// waits in `held` for the odd one's, and the two are narrowed together with
// one permute and stored as one vector, as ChannelAffineWrite does; one at
// a time, each would need a shift and a permute of its own. kPairOrder
// (bfloat16): the two vectors are the pair's even and odd values (see
// PairVector), merged with no permute. kDeviations: v is already v - a
// (ChannelAffineOf). kNaNs: as the narrowing takes them (NaNs). fp32, and
// every vector on scalar: StoreAffine.
template <DType kType, bool kStream, bool kPairOrder = false,
          bool kDeviations = false, NaNs kNaNs = NaNs::kCanonical, class D>
HWY_INLINE void StorePanelAffine(
    D d, int place, hn::Vec<D> v, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D> c,
    typename Elements<kType>::Stored* HWY_RESTRICT y,
    float* HWY_RESTRICT held) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (Elements<kType>::kHalf) {
    const auto result = ChannelAffineOf<kDeviations>(d, v, a, b, c);
    if (place % 2 == 0) {
      hn::StoreU(result, d, held);
      return;
    }
    const hn::Repartition<uint16_t, D> d16;
    const auto first = hn::LoadU(d, held);
    if constexpr (kPairOrder) {
      static_assert(kType == DType::kBFloat16, "pair order is bfloat16's");
      StoreOrStream<kStream>(
          d16, hn::BitCast(d16, BFloat16Pairs<kNaNs>(d, first, result)),
          y - hn::Lanes(d));
    } else {
      StoreOrStream<kStream>(
          d16, NarrowPairToHalfBits<kType, kNaNs>(d, first, result),
          y - hn::Lanes(d));
    }
    return;
  }
#endif
  StoreAffine<kType, kStream, kDeviations, kNaNs>(d, v, a, b, c, y);
}

// f.template operator()<kStream, kNaNs>() for a fused writer of kType:
// streamed or stored, and 16-bit results narrowed without the NaN step
// where `unchecked_nans` (NaNOnlyFromInput; fp32 has no such step).
template <DType kType, class F>
HWY_INLINE auto ForWriteRule(bool stream, bool unchecked_nans, const F& f) {
  if constexpr (Elements<kType>::kHalf) {
    if (unchecked_nans) {
      return stream ? f.template operator()<true, NaNs::kUnchecked>()
                    : f.template operator()<false, NaNs::kUnchecked>();
    }
  }
  return stream ? f.template operator()<true, NaNs::kCanonical>()
                : f.template operator()<false, NaNs::kCanonical>();
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_AFFINE_STORE_INL_H_
