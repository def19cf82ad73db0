// The bulk 16-bit conversions of half.h (WidenHalf, NarrowToHalf,
// NarrowToHalfStreaming) on Highway: one loop per direction, compiled for
// every target and dispatched once per call.
#include <cstdint>

#include "server/core/half.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/convert.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "server/core/simd/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

// Input bytes ahead of the loads that widening prefetches (16 KB): the
// hardware prefetcher alone falls behind a loop this short per line.
constexpr int64_t kWidenPrefetchBytes = 16384;

template <DType kType>
void Widen(const uint16_t* HWY_RESTRICT src, float* HWY_RESTRICT dst,
           int64_t n) {
  const hn::ScalableTag<float> df;
  const HalfBitsTag<decltype(df)> dh;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    if (i % 32 == 0) {
      // Into L2 (locality 2): hwy::Prefetch's L1 hint evicts the output.
      __builtin_prefetch(
          reinterpret_cast<const char*>(src + i) + kWidenPrefetchBytes, 0, 2);
    }
    hn::StoreU(WidenHalfBits<kType>(df, hn::LoadU(dh, src + i)), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = HalfToFloat(kType, src[i]);
}

// kStream: whole 64-byte
// lines of dst with streaming stores (the unaligned head and the tail with
// ordinary ones), two vectors at a time (see NarrowPairToHalfBits), then a
// fence. At most 16 floats per vector, so that a pair's results fit a line.
template <DType kType, bool kStream>
void Narrow(const float* HWY_RESTRICT src, uint16_t* HWY_RESTRICT dst,
            int64_t n) {
  int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::CappedTag<float, 16> df;
  const hn::Repartition<uint16_t, decltype(df)> dpair;
  const int64_t pair = static_cast<int64_t>(hn::Lanes(dpair));
  const int64_t half = pair / 2;
  if constexpr (kStream) {
    for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 64 != 0; ++i) {
      dst[i] = FloatToHalf(kType, src[i]);
    }
    for (; i + 32 <= n; i += 32) {
      for (int64_t j = i; j < i + 32; j += pair) {
        hn::Stream(NarrowPairToHalfBits<kType>(df, hn::LoadU(df, src + j),
                                               hn::LoadU(df, src + j + half)),
                   dpair, dst + j);
      }
    }
  }
  // bfloat16 in pairs (one permute for two vectors); float16 one vector at
  // a time, which spares the join.
  if constexpr (kType == DType::kBFloat16) {
    for (; i + pair <= n; i += pair) {
      hn::StoreU(NarrowPairToHalfBits<kType>(df, hn::LoadU(df, src + i),
                                             hn::LoadU(df, src + i + half)),
                 dpair, dst + i);
    }
  }
  const HalfBitsTag<decltype(df)> dh;
  for (; i + half <= n; i += half) {
    hn::StoreU(NarrowToHalfBits<kType>(df, hn::LoadU(df, src + i)), dh,
               dst + i);
  }
#endif
  for (; i < n; ++i) dst[i] = FloatToHalf(kType, src[i]);
  if constexpr (kStream) hwy::FlushStream();
}

}  // namespace

void WidenHalfBulk(DType dtype, const uint16_t* src, float* dst, int64_t n) {
  if (dtype == DType::kBFloat16) return Widen<DType::kBFloat16>(src, dst, n);
  Widen<DType::kFloat16>(src, dst, n);
}

void NarrowToHalfBulk(DType dtype, const float* src, uint16_t* dst, int64_t n,
                      bool stream) {
  if (dtype == DType::kBFloat16) {
    return stream ? Narrow<DType::kBFloat16, true>(src, dst, n)
                  : Narrow<DType::kBFloat16, false>(src, dst, n);
  }
  return stream ? Narrow<DType::kFloat16, true>(src, dst, n)
                : Narrow<DType::kFloat16, false>(src, dst, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {

HWY_EXPORT(WidenHalfBulk);
HWY_EXPORT(NarrowToHalfBulk);

void WidenHalf(DType dtype, const uint16_t* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(WidenHalfBulk)(dtype, src, dst, n);
}

void NarrowToHalf(DType dtype, const float* src, uint16_t* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(NarrowToHalfBulk)(dtype, src, dst, n, false);
}

void NarrowToHalfStreaming(DType dtype, const float* src, uint16_t* dst,
                           int64_t n) {
  HWY_DYNAMIC_DISPATCH(NarrowToHalfBulk)(dtype, src, dst, n, true);
}

}  // namespace normd
#endif  // HWY_ONCE
