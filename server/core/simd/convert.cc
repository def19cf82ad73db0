// WidenHalf (half.h), compiled per target. (The kernels narrow as they
// write.)
#include <cstdint>

#include "server/core/half.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/convert.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/highway.h"
#include "server/core/simd/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

// How far ahead widening prefetches (the hardware prefetcher falls behind).
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

}  // namespace

void WidenHalfBulk(DType dtype, const uint16_t* src, float* dst, int64_t n) {
  if (dtype == DType::kBFloat16) return Widen<DType::kBFloat16>(src, dst, n);
  Widen<DType::kFloat16>(src, dst, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {

HWY_EXPORT(WidenHalfBulk);

void WidenHalf(DType dtype, const uint16_t* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(WidenHalfBulk)(dtype, src, dst, n);
}

}  // namespace normd
#endif  // HWY_ONCE
