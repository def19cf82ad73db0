// The row affines (see row_affine.h), compiled per target.
#include "server/core/simd/row_affine.h"

#include <algorithm>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/row_affine.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/highway.h"
#include "server/core/simd/ops-inl.h"
#include "server/core/simd/writer-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

// Calls body.template operator()<kWeight, kBias>() for whether weight and
// bias are given.
template <typename T, class Body>
HWY_INLINE void WithParams(const T* weight, const T* bias, const Body& body) {
  if (weight != nullptr) {
    if (bias != nullptr) return body.template operator()<true, true>();
    return body.template operator()<true, false>();
  }
  if (bias != nullptr) return body.template operator()<false, true>();
  body.template operator()<false, false>();
}

// `count` rows of n values: y = the affine of x (kIn values) as kOut, by
// the fused formula (kFused) or the rounded one, streamed with kStream.
template <DType kIn, DType kOut, bool kFused, bool kStream>
void Rows(const typename Elements<kIn>::Stored* x,
          typename Elements<kOut>::Stored* y, int64_t n, int64_t count,
          const RowAffine* rows, const RowWrite& write) {
  // Each field read on its own: a struct copied whole reads the caller's
  // just-written fields in one wider load, which stalls on store forwarding.
  const char* prefetch_row = static_cast<const char*>(write.prefetch);
  const int64_t element_bytes = write.prefetch_element_bytes;
  const int64_t ahead_bytes = write.prefetch_ahead_bytes;
  using In = Elements<kIn>;
  using Out = Elements<kOut>;
  using T = typename In::Value;
  const typename In::ValueTag d;
  const typename Out::OutTag dout;
  const T* weight = static_cast<const T*>(rows[0].weight);
  const T* bias = static_cast<const T*>(rows[0].bias);
  WithParams(weight, bias, [&]<bool kWeight, bool kBias>() {
    for (int64_t r = 0; r < count; ++r, x += n, y += n) {
      const RowAffine& a = rows[r];
      const auto hi = hn::Set(d, static_cast<T>(a.hi));
      const auto lo = hn::Set(d, static_cast<T>(a.lo));
      const auto scale = hn::Set(d, static_cast<T>(a.scale));
      const auto low_term = hn::Set(d, static_cast<T>(-(a.lo * a.scale)));
      auto results = [&](int64_t j, size_t lanes) NORMD_LAMBDA_INLINE {
        const auto v = In::Load(x, j, lanes);
        if constexpr (!kFused) {
          // fp64: hi is the mean, lo 0 (x - mean - 0 is x - mean).
          auto t = hn::Mul(hn::Sub(hn::Sub(v, hi), lo), scale);
          if constexpr (kWeight) t = hn::Mul(t, LoadPart(d, weight + j, lanes));
          if constexpr (kBias) t = hn::Add(t, LoadPart(d, bias + j, lanes));
          return t;
        } else {
          const auto t = ExactMulAdd(d, hn::Sub(v, hi), scale, low_term);
          if constexpr (kWeight && kBias) {
            return ExactMulAdd(d, t, LoadPart(d, weight + j, lanes),
                               LoadPart(d, bias + j, lanes));
          } else if constexpr (kWeight) {
            return hn::Mul(t, LoadPart(d, weight + j, lanes));
          } else if constexpr (kBias) {
            return hn::Add(t, LoadPart(d, bias + j, lanes));
          } else {
            return t;
          }
        }
      };
      WriteVectors<kStream>(
          dout, y, n,
          [&](int64_t j, size_t part)
              NORMD_LAMBDA_INLINE { return Out::Output(j, part, results); },
          Prefetch{prefetch_row, element_bytes, ahead_bytes});
      if (prefetch_row != nullptr) prefetch_row += n * element_bytes;
    }
  });
}

// Rows for the store policy: 16-bit outputs always fused, fp64 never.
template <DType kIn, DType kOut, bool kFused = Elements<kOut>::kHalf>
void RowsFor(const void* x, void* y, int64_t n, int64_t count,
             const RowAffine* a, const RowWrite& write) {
  using InT = typename Elements<kIn>::Stored;
  using OutT = typename Elements<kOut>::Stored;
  auto* px = static_cast<const InT*>(x);
  auto* py = static_cast<OutT*>(y);
  if (write.stream) {
    return Rows<kIn, kOut, kFused, true>(px, py, n, count, a, write);
  }
  Rows<kIn, kOut, kFused, false>(px, py, n, count, a, write);
}

}  // namespace

void AnyRows(DType in, DType out, const void* x, void* y, int64_t n,
             int64_t count, const RowAffine* a, const RowWrite& write) {
  ForDType(out, [&]<DType kOut>() {
    if constexpr (Elements<kOut>::kHalf) {
      if (in == DType::kFloat32) {
        return RowsFor<DType::kFloat32, kOut>(x, y, n, count, a, write);
      }
    } else if constexpr (kOut == DType::kFloat32) {
      if (a[0].fused)
        return RowsFor<kOut, kOut, true>(x, y, n, count, a, write);
    }
    RowsFor<kOut, kOut>(x, y, n, count, a, write);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {

HWY_EXPORT(AnyRows);

void RowsAffineWrite(DType in, DType out, const void* x, void* y, int64_t n,
                     int64_t count, const RowAffine* rows,
                     const RowWrite& write) {
  if (count > 0) {
    HWY_DYNAMIC_DISPATCH(AnyRows)(in, out, x, y, n, count, rows, write);
  }
}

}  // namespace normd
#endif  // HWY_ONCE
