// The channel affines (see channel_affine.h), compiled for every SIMD target
// (foreach_target.h) and dispatched per call. A run's last partial vector
// reads and writes only its elements (tail-inl.h).
#include "server/core/simd/channel_affine.h"

#include <algorithm>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/channel_affine.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/highway.h"
#include "server/core/simd/fma-inl.h"
#include "server/core/simd/tail-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

// out[k] = apply(x[k], a[k], b[k], c[k]) for k in [0, n), a vector at a
// time (the last, partial one reading and writing only its elements).
template <class D, typename T, class Apply>
HWY_INLINE void PerElement(D d, const T* x, T* out, int64_t n, const T* a,
                           const T* b, const T* c, const Apply& apply) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t k = 0;
  for (; k + lanes <= n; k += lanes) {
    hn::StoreU(apply(hn::LoadU(d, x + k), hn::LoadU(d, a + k),
                     hn::LoadU(d, b + k), hn::LoadU(d, c + k)),
               d, out + k);
  }
  if (k == n) return;
  const size_t rest = static_cast<size_t>(n - k);
  StoreHead(d,
            apply(LoadHead(d, x + k, rest), LoadHead(d, a + k, rest),
                  LoadHead(d, b + k, rest), LoadHead(d, c + k, rest)),
            out + k, rest);
}

// out[k] = apply(x[k], a, b, c) for k in [0, n), one channel's constants.
template <class D, typename T, class Apply>
HWY_INLINE void OneChannel(D d, const T* x, T* out, int64_t n, T a, T b, T c,
                           const Apply& apply) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, a);
  const auto vb = hn::Set(d, b);
  const auto vc = hn::Set(d, c);
  int64_t k = 0;
  for (; k + lanes <= n; k += lanes) {
    hn::StoreU(apply(hn::LoadU(d, x + k), va, vb, vc), d, out + k);
  }
  if (k == n) return;
  const size_t rest = static_cast<size_t>(n - k);
  StoreHead(d, apply(LoadHead(d, x + k, rest), va, vb, vc), out + k, rest);
}

// The walk over [begin, end) both types share: channels-last in runs of
// at most `period` from the run's channel phase, else runs of one channel.
template <class D, typename T, class Apply>
HWY_INLINE void ChannelRange(D d, const T* x, T* out, int64_t begin,
                             int64_t end, int64_t channels, int64_t inner,
                             int64_t period, const T* a, const T* b, const T* c,
                             const Apply& apply) {
  int64_t pos = begin;
  while (pos < end) {
    const T* xs = x + (pos - begin);
    T* ys = out + (pos - begin);
    if (inner == 1) {
      const int64_t phase = pos % channels;
      const int64_t run = std::min(period, end - pos);
      PerElement(d, xs, ys, run, a + phase, b + phase, c + phase, apply);
      pos += run;
    } else {
      const int64_t channel = (pos / inner) % channels;
      const int64_t run = std::min(inner - pos % inner, end - pos);
      OneChannel(d, xs, ys, run, a[channel], b[channel], c[channel], apply);
      pos += run;
    }
  }
}

}  // namespace

void FloatChannels(const float* x, float* out, int64_t begin, int64_t end,
                   int64_t channels, int64_t inner, int64_t period,
                   const float* hi, const float* scale, const float* shift) {
  const hn::CappedTag<float, 16> d;
  ChannelRange(d, x, out, begin, end, channels, inner, period, hi, scale, shift,
               [d](auto v, auto h, auto s, auto t) {
                 return ExactMulAdd(d, hn::Sub(v, h), s, t);
               });
}

void DoubleChannels(const double* x, double* out, int64_t begin, int64_t end,
                    int64_t channels, int64_t inner, int64_t period,
                    const double* mean, const double* scale,
                    const double* shift) {
  const hn::CappedTag<double, 8> d;
  ChannelRange(d, x, out, begin, end, channels, inner, period, mean, scale,
               shift, [](auto v, auto m, auto s, auto t) {
                 return hn::Add(hn::Mul(hn::Sub(v, m), s), t);
               });
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {

HWY_EXPORT(FloatChannels);
HWY_EXPORT(DoubleChannels);

void FloatChannelAffineRange(const float* x, float* out, int64_t begin,
                             int64_t end, int64_t channels, int64_t inner,
                             int64_t period, const float* hi,
                             const float* scale, const float* shift) {
  HWY_DYNAMIC_DISPATCH(FloatChannels)
  (x, out, begin, end, channels, inner, period, hi, scale, shift);
}

void DoubleChannelAffineRange(const double* x, double* out, int64_t begin,
                              int64_t end, int64_t channels, int64_t inner,
                              int64_t period, const double* mean,
                              const double* scale, const double* shift) {
  HWY_DYNAMIC_DISPATCH(DoubleChannels)
  (x, out, begin, end, channels, inner, period, mean, scale, shift);
}

}  // namespace normd
#endif  // HWY_ONCE
