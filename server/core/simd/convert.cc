// WidenHalf and DoublesToFloats (half.h), compiled per target. (The
// kernels narrow to 16 bits as they write.)
#include <algorithm>
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
  const FloatVectorTag df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto widen = [&](int64_t i) NORMD_LAMBDA_INLINE {
    hn::StoreU(Elements<kType>::Load(df, src + i), df, dst + i);
  };
  // One at a time up to dst's first line boundary, so that no vector store
  // splits a line; then 32 values (a line of src, prefetched once, into L2:
  // hwy::Prefetch's L1 hint evicts the output) at a time.
  const auto address = reinterpret_cast<uintptr_t>(dst);
  int64_t i = 0;
  if (address % sizeof(float) == 0) {
    for (; i < std::min<int64_t>(n, (64 - address % 64) % 64 / 4); ++i) {
      dst[i] = HalfToFloat(kType, src[i]);
    }
  }
  constexpr int64_t kLine = 32;
  for (; i + kLine <= n; i += kLine) {
    __builtin_prefetch(
        reinterpret_cast<const char*>(src + i) + kWidenPrefetchBytes, 0, 2);
    for (int64_t k = 0; k < kLine; k += lanes) widen(i + k);
  }
  for (; i + lanes <= n; i += lanes) widen(i);
  for (; i < n; ++i) dst[i] = HalfToFloat(kType, src[i]);
}

}  // namespace

void WidenHalfBulk(DType dtype, const uint16_t* src, float* dst, int64_t n) {
  if (dtype == DType::kBFloat16) return Widen<DType::kBFloat16>(src, dst, n);
  Widen<DType::kFloat16>(src, dst, n);
}

// DoublesToFloats: whole vectors through RoundToFloat (as a cast rounds on
// every target), then the rest one at a time.
void Demote(const double* HWY_RESTRICT src, float* HWY_RESTRICT dst,
            int64_t n) {
  const hn::CappedTag<double, 8> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(dd));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(RoundToFloat(dd, hn::LoadU(dd, src + i)), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {

HWY_EXPORT(WidenHalfBulk);
HWY_EXPORT(Demote);

void WidenHalf(DType dtype, const uint16_t* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(WidenHalfBulk)(dtype, src, dst, n);
}

void DoublesToFloats(const double* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Demote)(src, dst, n);
}

}  // namespace normd
#endif  // HWY_ONCE
