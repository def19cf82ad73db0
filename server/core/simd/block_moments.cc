// The moments of one block (see block_moments.h), compiled per target.
#include "server/core/simd/block_moments.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "server/core/half.h"
#include "server/core/simd/fold.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/block_moments.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "server/core/simd/half-inl.h"
#include "server/core/simd/ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

// The logical lanes (see block_moments.h): fixed, whatever the vector width.
constexpr int kFloatLanes = 64;
constexpr int kWideLanes = kFloatLanes / 2;
constexpr int64_t kFloatFlush = 16 * kFloatLanes;
constexpr int64_t kShiftSample = 32;
constexpr int kShortLanes = 16;
constexpr int kExactLanes = 8;
// How far ahead the 16-bit block loop prefetches (the hardware prefetcher
// keeps up with the fp32 loop alone).
constexpr int64_t kHalfPrefetchBytes = 8192;

// Exact two-pass moments of x[0..n), n >= 1, in fp64: the mean, then d =
// x - mean0 and d^2 (not fused), the sum of d correcting for mean0's
// rounding. Value i in lane i % 8; the values past the last whole 8 go to
// lanes 0, 1, ...
template <typename T>
Moments ExactMoments(const T* HWY_RESTRICT x, int64_t n) {
  const hn::CappedTag<double, kExactLanes> dd;
  const hn::Rebind<T, decltype(dd)> dt;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(dd));
  // Vectors per panel of lanes: up to 4 accumulators live at once.
  const int64_t vectors = std::min<int64_t>(4, kExactLanes / lanes);
  auto load = [&](int64_t i) {
    if constexpr (std::is_same_v<T, double>) {
      return hn::LoadU(dd, x + i);
    } else {
      return hn::PromoteTo(dd, hn::LoadU(dt, x + i));
    }
  };
  const int64_t whole = n / kExactLanes * kExactLanes;
  double sum[kExactLanes];
  double unused[kExactLanes];
  for (int64_t p = 0; p < kExactLanes; p += vectors * lanes) {
    PanelSums(
        dd, vectors, p, whole, kExactLanes,
        [&](int64_t i, int k, auto& s, auto&)
            NORMD_LAMBDA_INLINE { s = hn::Add(s, load(i + k * lanes)); },
        sum + p, unused + p);
  }
  for (int64_t i = whole, j = 0; i < n; ++i, ++j) {
    sum[j] += static_cast<double>(x[i]);
  }
  const double mean0 = fold::SumLanes(sum) / static_cast<double>(n);
  const auto center = hn::Set(dd, mean0);
  double dev[kExactLanes];
  double sq[kExactLanes];
  for (int64_t p = 0; p < kExactLanes; p += vectors * lanes) {
    PanelSums(
        dd, vectors, p, whole, kExactLanes,
        [&](int64_t i, int k, auto& dev_k, auto& sq_k) NORMD_LAMBDA_INLINE {
          AddDeviation<false>(dd, hn::Sub(load(i + k * lanes), center), dev_k,
                              sq_k);
        },
        dev + p, sq + p);
  }
  for (int64_t i = whole, j = 0; i < n; ++i, ++j) {
    const double d = static_cast<double>(x[i]) - mean0;
    dev[j] += d;
    sq[j] += d * d;
  }
  return fold::Corrected(n, mean0, fold::SumLanes(dev), fold::SumLanes(sq));
}

// The fast path's shift: the fp32 mean of the first 32 values, folded
// pairwise (fold::FoldHalves' order) in registers; a float, so that x -
// shift is exact near the mean. Vector loads only: a copy read back in
// other widths stalls on store forwarding.
float ShiftCenter(const float* HWY_RESTRICT x) {
  constexpr int64_t kHalf = kShiftSample / 2;
  const hn::CappedTag<float, kHalf> d;
  HWY_ALIGN float sums[kHalf];
  for (int64_t j = 0; j < kHalf; j += static_cast<int64_t>(hn::Lanes(d))) {
    hn::Store(hn::Add(hn::LoadU(d, x + j), hn::LoadU(d, x + j + kHalf)), d,
              sums + j);
  }
  return FoldArray<kHalf>(sums) / static_cast<float>(kShiftSample);
}

// The fast path of `count` (at most kShortBatch) blocks of n <= kShortRow
// values at x, x + n, ..: value i in lane i % 16, the shift the block's own
// mean (lanes folded in fp32), then d and d^2 (fused) in the lanes, folded in
// fp64; the last step adds only to the lanes it has values for. Each step
// is done for every block before the next, so that their chains overlap,
// and the folds across the blocks (fold::SixteenRowSums). A specialization
// kept on measurement: AVX3 and AVX2, bench case RowNorm*/64
// (docs/design/kernels.md).
constexpr int64_t kShortBatch = 16;
void ShortMoments(const float* HWY_RESTRICT x, int64_t n, int64_t count,
                  Moments* HWY_RESTRICT out) {
  const hn::CappedTag<float, kShortLanes> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t whole = n / kShortLanes * kShortLanes;
  const int64_t rest = n - whole;
  HWY_ALIGN float padded[kShortBatch][kShortLanes];
  HWY_ALIGN float sum[kShortBatch][kShortLanes];
  HWY_ALIGN float center[kShortBatch];
  for (int64_t k = 0; k < count; ++k) {
    const float* row = x + k * n;
    if (rest > 0) {
      std::fill(std::copy(row + whole, row + n, padded[k]),
                padded[k] + kShortLanes, 0.0f);
    }
    for (int64_t v = 0; v < kShortLanes; v += lanes) {
      auto acc = hn::Zero(d);
      for (int64_t i = v; i < whole; i += kShortLanes) {
        acc = hn::Add(acc, hn::LoadU(d, row + i));
      }
      if (rest > v) {
        acc = hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(rest - v)),
                             hn::Add(acc, hn::Load(d, padded[k] + v)), acc);
      }
      hn::Store(acc, d, sum[k] + v);
    }
  }
  HWY_ALIGN float dev[kShortBatch][kShortLanes];
  HWY_ALIGN float sq[kShortBatch][kShortLanes];
  // The rows past the batch: zeros, folded with the others and unused.
  for (int64_t k = count; k < kShortBatch; ++k) {
    std::fill_n(sum[k], kShortLanes, 0.0f);
    std::fill_n(dev[k], kShortLanes, 0.0f);
    std::fill_n(sq[k], kShortLanes, 0.0f);
  }
  SixteenRowSums(&sum[0][0], center);
  for (int64_t k = 0; k < count; ++k) center[k] /= static_cast<float>(n);
  for (int64_t k = 0; k < count; ++k) {
    const float* row = x + k * n;
    const auto shift = hn::Set(d, center[k]);
    for (int64_t v = 0; v < kShortLanes; v += lanes) {
      auto dev_acc = hn::Zero(d);
      auto sq_acc = dev_acc;
      for (int64_t i = v; i < whole; i += kShortLanes) {
        const auto e = hn::Sub(hn::LoadU(d, row + i), shift);
        dev_acc = hn::Add(dev_acc, e);
        sq_acc = ExactMulAdd(d, e, e, sq_acc);
      }
      if (rest > v) {
        const auto in = hn::FirstN(d, static_cast<size_t>(rest - v));
        const auto e = hn::Sub(hn::Load(d, padded[k] + v), shift);
        dev_acc = hn::IfThenElse(in, hn::Add(dev_acc, e), dev_acc);
        sq_acc = hn::IfThenElse(in, ExactMulAdd(d, e, e, sq_acc), sq_acc);
      }
      hn::Store(dev_acc, d, dev[k] + v);
      hn::Store(sq_acc, d, sq[k] + v);
    }
  }
  HWY_ALIGN double shifts[kShortBatch] = {};
  HWY_ALIGN double residuals[kShortBatch];
  HWY_ALIGN double squares[kShortBatch];
  for (int64_t k = 0; k < count; ++k) shifts[k] = center[k];
  SixteenRowSums(&dev[0][0], residuals);
  SixteenRowSums(&sq[0][0], squares);
  // fold::Corrected and fold::NeedsExactPath in fp64 vectors across the
  // blocks, operation for operation (max(0.0, v) is 0 < v ? v : 0,
  // isfinite |v| < infinity), in place of two scalar divisions per block: a
  // specialization kept on measurement: fp32 rows on AVX3 and AVX2, bench
  // case RowNorm/f32/*/64 (docs/design/kernels.md).
  const hn::CappedTag<double, kShortBatch> dd;
  const auto zero = hn::Zero(dd);
  const auto infinity = hn::Set(dd, std::numeric_limits<double>::infinity());
  const auto nan = hn::Set(dd, std::numeric_limits<double>::quiet_NaN());
  const auto values = hn::Set(dd, static_cast<double>(n));
  auto finite = [&](auto v) { return hn::Lt(hn::Abs(v), infinity); };
  HWY_ALIGN double means[kShortBatch];
  HWY_ALIGN double m2s[kShortBatch];
  HWY_ALIGN double exact[kShortBatch];
  for (int64_t k = 0; k < count; k += hn::Lanes(dd)) {
    const auto shift = hn::Load(dd, shifts + k);
    const auto residual = hn::Load(dd, residuals + k);
    const auto square = hn::Load(dd, squares + k);
    const auto m2 =
        hn::Sub(square, hn::Div(hn::Mul(residual, residual), values));
    const auto marked = hn::Not(hn::And(finite(shift), finite(square)));
    const auto mean =
        hn::IfThenElse(marked, nan, hn::Add(shift, hn::Div(residual, values)));
    const auto clamped =
        hn::IfThenElse(marked, nan, hn::IfThenElse(hn::Lt(zero, m2), m2, zero));
    const auto needs = hn::Or(
        hn::Not(hn::And(finite(mean), finite(clamped))),
        hn::Or(hn::Lt(clamped, hn::Mul(hn::Set(dd, 1e-30), values)),
               hn::Lt(hn::Mul(clamped, hn::Set(dd, fold::kMaxCancellation)),
                      square)));
    hn::Store(mean, dd, means + k);
    hn::Store(clamped, dd, m2s + k);
    hn::Store(hn::IfThenElseZero(needs, hn::Set(dd, 1.0)), dd, exact + k);
  }
  for (int64_t k = 0; k < count; ++k) {
    out[k] = exact[k] != 0.0 ? ExactMoments(x + k * n, n)
                             : Moments{n, means[k], m2s[k]};
  }
}

// The fast path of a block of n > kShortRow values (see block_moments.h), its
// 64 lanes in panels of 4 vectors each summed over a flush interval in
// turn. 16-bit data: `out` gets the widening with kStore, else what the
// scalar parts read (shift sample, tail, all on the exact path). kPairs
// (bfloat16, not kStore): the values read in pair order (see EvenBFloat16),
// each lane's sums the same; a specialization kept on measurement: AVX2,
// kernel_bench's bf16 rows against AVX3 (docs/design/kernels.md).
template <DType kType, bool kStore, bool kPairs = false>
Moments LongMoments(const typename Elements<kType>::Stored* HWY_RESTRICT x,
                    float* HWY_RESTRICT out, int64_t n) {
  using E = Elements<kType>;
  constexpr bool kFloat = kType == DType::kFloat32;
  const FloatVectorTag d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const float* values = out;  // What the scalar parts read.
  if constexpr (kFloat) {
    values = x;
  } else {
    // Widened a vector at a time, as ShiftCenter reads them.
    for (int64_t i = 0; i < kShiftSample; i += lanes) {
      hn::StoreU(E::Load(d, x + i), d, out + i);
    }
  }
  const float center = ShiftCenter(values);
  const auto shift = hn::Set(d, center);
  HWY_ALIGN float dev[kFloatLanes];
  HWY_ALIGN float sq[kFloatLanes];
  double wide_dev[kWideLanes];
  double wide_sq[kWideLanes];
  int64_t i = 0;
  while (i + kFloatLanes <= n) {
    const int64_t len =
        std::min(kFloatFlush, (n - i) / kFloatLanes * kFloatLanes);
    for (int64_t p = 0; p < kFloatLanes; p += 4 * lanes) {
      PanelSums(
          d, 4, i + p, i + p + len, kFloatLanes,
          [&](int64_t k, int v, auto& dev_v, auto& sq_v) NORMD_LAMBDA_INLINE {
            const int64_t at = k + v * lanes;
            if constexpr (!kFloat) {
              if (p == 0 && v == 0) {
                const char* ahead =
                    reinterpret_cast<const char*>(x + k) + kHalfPrefetchBytes;
                hwy::Prefetch(ahead);
                hwy::Prefetch(ahead + 64);
              }
            }
            const auto f = [&]() NORMD_LAMBDA_INLINE {
#if HWY_TARGET != HWY_SCALAR
              if constexpr (kPairs) return PairVector(d, x + at, v);
#endif
              return E::Load(d, x + at);
            }();
            if constexpr (!kFloat && kStore) hn::StoreU(f, d, out + at);
            AddDeviation<true>(d, hn::Sub(f, shift), dev_v, sq_v);
          },
          dev + p, sq + p);
    }
    // The flush: lane j + 32 onto lane j in fp32, then into fp64.
    for (int j = 0; j < kWideLanes; ++j) {
      const double dev_pair = dev[j] + dev[j + kWideLanes];
      const double sq_pair = sq[j] + sq[j + kWideLanes];
      wide_dev[j] = i == 0 ? dev_pair : wide_dev[j] + dev_pair;
      wide_sq[j] = i == 0 ? sq_pair : wide_sq[j] + sq_pair;
    }
    i += len;
  }
  const int64_t pair_lanes = kPairs ? lanes : 0;
  const double lanes_dev = i > 0 ? fold::SumLanes(wide_dev, pair_lanes) : 0.0;
  const double lanes_sq = i > 0 ? fold::SumLanes(wide_sq, pair_lanes) : 0.0;
  if constexpr (!kFloat) {
    for (int64_t k = i; k < n; ++k) out[k] = E::Scalar(x[k]);
  }
  // The values past the lanes in fp64; the exact path if fp32 lost accuracy.
  double tail_dev = 0.0;
  double tail_sq = 0.0;
  for (int64_t k = i; k < n; ++k) {
    const double e = static_cast<double>(values[k]) - center;
    tail_dev += e;
    tail_sq += e * e;
  }
  const double squares = lanes_sq + tail_sq;
  const Moments result =
      fold::Corrected(n, center, lanes_dev + tail_dev, squares);
  if (!fold::NeedsExactPath(result, squares)) return result;
  if constexpr (!kFloat && !kStore) {
    for (int64_t k = 0; k < i; ++k) out[k] = E::Scalar(x[k]);
  }
  return ExactMoments(values, n);
}

template <DType kType>
Moments HalfMoments(const uint16_t* HWY_RESTRICT x, float* HWY_RESTRICT out,
                    int64_t n, bool store_widened) {
  if (n <= kShortRow) {
    const FloatVectorTag d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    int64_t i = 0;
    for (; i + lanes <= n; i += lanes) {
      hn::StoreU(Elements<kType>::Load(d, x + i), d, out + i);
    }
    for (; i < n; ++i) out[i] = HalfToFloat(kType, x[i]);
    Moments result;
    ShortMoments(out, n, 1, &result);
    return result;
  }
  if (store_widened) return LongMoments<kType, true>(x, out, n);
  // bfloat16 in pair order (see LongMoments) from two flush intervals on,
  // which pay back putting the lanes in order again.
  if constexpr (kType == DType::kBFloat16 && HWY_TARGET != HWY_SCALAR) {
    if (n >= 2 * kFloatFlush) return LongMoments<kType, false, true>(x, out, n);
  }
  return LongMoments<kType, false>(x, out, n);
}

}  // namespace

void FloatRows(const float* x, int64_t n, int64_t count, Moments* out) {
  if (n > kShortRow) {
    for (int64_t k = 0; k < count; ++k) {
      out[k] = LongMoments<DType::kFloat32, false>(x + k * n, nullptr, n);
    }
    return;
  }
  for (int64_t k = 0; k < count; k += kShortBatch) {
    ShortMoments(x + k * n, n, std::min(kShortBatch, count - k), out + k);
  }
}

Moments Block(DType dtype, const void* x, float* out, int64_t n,
              bool store_widened) {
  Moments result;
  ForDType(dtype, [&]<DType kType>() {
    const auto* values =
        static_cast<const typename Elements<kType>::Stored*>(x);
    if constexpr (kType == DType::kFloat64) {
      result = ExactMoments(values, n);
    } else if constexpr (kType == DType::kFloat32) {
      FloatRows(values, n, 1, &result);
    } else {
      result = HalfMoments<kType>(values, out, n, store_widened);
    }
  });
  return result;
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {

HWY_EXPORT(FloatRows);
HWY_EXPORT(Block);

void FloatRowsMoments(const float* x, int64_t n, int64_t count, Moments* out) {
  HWY_DYNAMIC_DISPATCH(FloatRows)(x, n, count, out);
}

Moments BlockMoments(DType dtype, const void* x, int64_t n, float* out,
                     bool store_widened) {
  return HWY_DYNAMIC_DISPATCH(Block)(dtype, x, out, n, store_widened);
}

}  // namespace normd
#endif  // HWY_ONCE
