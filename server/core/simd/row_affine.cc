// The row affines (see row_affine.h), compiled for every SIMD target
// (foreach_target.h) and dispatched per call. The last partial vector takes
// the vector operations too (no scalar libm fma in a tail), reading and
// writing only its elements (tail-inl.h).
#include "server/core/simd/row_affine.h"

#include <algorithm>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/row_affine.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/highway.h"
#include "server/core/simd/fma-inl.h"
#include "server/core/simd/tail-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

// y[j] = affine(x[j], weight[j], bias[j]) over [0, n), a vector at a time
// (the last, partial one reading and writing only its elements); absent
// weight / bias read as zeros. kWeight / kBias: whether they are given,
// decided once per row. x may be y.
template <bool kWeight, bool kBias, class D, typename T, class Affine>
HWY_INLINE void ForEachVector(D d, const T* x, T* y, int64_t n, const T* weight,
                              const T* bias, const Affine& affine) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto none = hn::Zero(d);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    hn::StoreU(
        affine(hn::LoadU(d, x + j), kWeight ? hn::LoadU(d, weight + j) : none,
               kBias ? hn::LoadU(d, bias + j) : none),
        d, y + j);
  }
  if (j == n) return;
  const size_t rest = static_cast<size_t>(n - j);
  StoreHead(d,
            affine(LoadHead(d, x + j, rest),
                   kWeight ? LoadHead(d, weight + j, rest) : none,
                   kBias ? LoadHead(d, bias + j, rest) : none),
            y + j, rest);
}

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

}  // namespace

void FloatAffine(const float* x, float* y, int64_t n, float hi, float lo,
                 float scale, const float* weight, const float* bias) {
  const hn::CappedTag<float, 16> d;
  const auto vhi = hn::Set(d, hi);
  const auto vlo = hn::Set(d, lo);
  const auto vscale = hn::Set(d, scale);
  WithParams(weight, bias, [&]<bool kWeight, bool kBias>() {
    ForEachVector<kWeight, kBias>(
        d, x, y, n, weight, bias, [&](auto v, auto w, auto b) {
          auto t = hn::Mul(hn::Sub(hn::Sub(v, vhi), vlo), vscale);
          if constexpr (kWeight) t = hn::Mul(t, w);
          if constexpr (kBias) t = hn::Add(t, b);
          return t;
        });
  });
}

void DoubleAffine(const double* x, double* y, int64_t n, double mean,
                  double scale, const double* weight, const double* bias) {
  const hn::CappedTag<double, 8> d;
  const auto vmean = hn::Set(d, mean);
  const auto vscale = hn::Set(d, scale);
  WithParams(weight, bias, [&]<bool kWeight, bool kBias>() {
    ForEachVector<kWeight, kBias>(d, x, y, n, weight, bias,
                                  [&](auto v, auto w, auto b) {
                                    auto t = hn::Mul(hn::Sub(v, vmean), vscale);
                                    if constexpr (kWeight) t = hn::Mul(t, w);
                                    if constexpr (kBias) t = hn::Add(t, b);
                                    return t;
                                  });
  });
}

void HalfAffine(const float* x, float* y, int64_t n, float hi, float lo,
                float scale, const float* weight, const float* bias) {
  const hn::CappedTag<float, 16> d;
  const auto vhi = hn::Set(d, hi);
  const auto vscale = hn::Set(d, scale);
  const auto low_term = hn::Set(d, -(lo * scale));
  WithParams(weight, bias, [&]<bool kWeight, bool kBias>() {
    ForEachVector<kWeight, kBias>(
        d, x, y, n, weight, bias, [&](auto v, auto w, auto b) {
          const auto t = ExactMulAdd(d, hn::Sub(v, vhi), vscale, low_term);
          if constexpr (kWeight && kBias) {
            return ExactMulAdd(d, t, w, b);
          } else if constexpr (kWeight) {
            return hn::Mul(t, w);
          } else if constexpr (kBias) {
            return hn::Add(t, b);
          } else {
            return t;
          }
        });
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {

HWY_EXPORT(FloatAffine);
HWY_EXPORT(DoubleAffine);
HWY_EXPORT(HalfAffine);

void FloatRowAffine(const float* x, float* y, int64_t n, float hi, float lo,
                    float scale, const float* weight, const float* bias) {
  HWY_DYNAMIC_DISPATCH(FloatAffine)(x, y, n, hi, lo, scale, weight, bias);
}

void DoubleRowAffine(const double* x, double* y, int64_t n, double mean,
                     double scale, const double* weight, const double* bias) {
  HWY_DYNAMIC_DISPATCH(DoubleAffine)(x, y, n, mean, scale, weight, bias);
}

void HalfRowAffine(const float* x, float* y, int64_t n, float hi, float lo,
                   float scale, const float* weight, const float* bias) {
  HWY_DYNAMIC_DISPATCH(HalfAffine)(x, y, n, hi, lo, scale, weight, bias);
}

}  // namespace normd
#endif  // HWY_ONCE
