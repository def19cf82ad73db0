// The moments of one block (see block_moments.h), compiled per target.
#include "server/core/simd/block_moments.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "server/core/half.h"
#include "server/core/simd/channel_affine.h"
#include "server/core/simd/fold.h"
#include "server/core/simd/streaming.h"
#include "server/core/staging.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/block_moments.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "server/core/simd/affine_store-inl.h"
#include "server/core/simd/half-inl.h"
#include "server/core/simd/moments_accumulator-inl.h"
#include "server/core/simd/ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

// The logical lanes (see block_moments.h): fixed, whatever the vector width.
constexpr int kFloatLanes = kBlockLanes;
constexpr int kWideLanes = kFloatLanes / 2;
constexpr int64_t kFloatFlush = 16 * kFloatLanes;
constexpr int64_t kShiftSample = 32;
// The values that decide whether a block takes its shift hint.
constexpr int64_t kHintSample = 128;
constexpr int kShortLanes = 16;
constexpr int kExactLanes = 8;
// How far ahead the block loop prefetches: 16-bit blocks always, fp32
// blocks when they write as they read (the eval+observe pass: out of cache,
// the hardware prefetcher keeps up with the fp32 loop alone, not with it).
constexpr int64_t kBlockPrefetchBytes = 8192;

// Exact two-pass moments of x[0..n), n >= 1, in fp64: the mean, then d =
// x - mean0 and d^2 (not fused), the sum of d correcting for mean0's
// rounding. Value i in lane i % 8.
template <typename T>
Moments ExactMoments(const T* HWY_RESTRICT x, int64_t n) {
  const hn::CappedTag<double, kExactLanes> dd;
  auto load = [&](const T* p, int64_t count) NORMD_LAMBDA_INLINE {
    const auto part = static_cast<size_t>(count);
    if constexpr (std::is_same_v<T, double>) {
      return LoadPart(dd, p, part);
    } else {
      return hn::PromoteTo(dd,
                           LoadPart(hn::Rebind<T, decltype(dd)>(), p, part));
    }
  };
  double sum[kExactLanes];
  double dev[kExactLanes];
  double sq[kExactLanes];
  AccumulateValues<LaneSums::kSums, kExactLanes>(dd, x, n, 0.0, load, sum, sq);
  const double mean0 = fold::SumLanes(sum) / static_cast<double>(n);
  AccumulateValues<LaneSums::kDeviations, kExactLanes>(dd, x, n, mean0, load,
                                                       dev, sq);
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

// Whether a block whose first kHintSample values (at x) have the fp32 mean
// `center` of its first kShiftSample takes the shift `hint`: fold::HintFits
// on the sample's sums about center, in 64 fp32 lanes (two steps of
// independent chains) folded pairwise (the same decision on every target),
// but never for a constant sample: unlike a tile's channel, a block's
// values past it may vary (an image's margin).
bool HintFitsBlock(const float* HWY_RESTRICT x, float center, float hint) {
  constexpr int kLanes = 64;
  const hn::CappedTag<float, kLanes> d;
  HWY_ALIGN float dev[kLanes];
  HWY_ALIGN float sq[kLanes];
  AccumulateValues<LaneSums::kFusedDeviations, kLanes>(
      d, x, kHintSample, center,
      [&](const float* p, int64_t values) NORMD_LAMBDA_INLINE {
        return LoadPart(d, p, static_cast<size_t>(values));
      },
      dev, sq);
  const double sum = FoldArray<kLanes>(dev);
  const double squares = FoldArray<kLanes>(sq);
  const double mean = sum / kHintSample;
  const double m2 = squares - sum * mean;
  return m2 > 0.0 && fold::HintFits(static_cast<double>(hint) - center - mean,
                                    m2, kHintSample);
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
  auto load = [&](const float* p, int64_t values) NORMD_LAMBDA_INLINE {
    return LoadPart(d, p, static_cast<size_t>(values));
  };
  HWY_ALIGN float sum[kShortBatch][kShortLanes];
  HWY_ALIGN float dev[kShortBatch][kShortLanes];
  HWY_ALIGN float sq[kShortBatch][kShortLanes];
  HWY_ALIGN float center[kShortBatch];
  for (int64_t k = 0; k < count; ++k) {
    AccumulateValues<LaneSums::kSums, kShortLanes>(d, x + k * n, n, 0.0f, load,
                                                   sum[k], sq[k]);
  }
  // The rows past the batch: zeros, folded with the others and unused.
  for (int64_t k = count; k < kShortBatch; ++k) {
    std::fill_n(sum[k], kShortLanes, 0.0f);
    std::fill_n(dev[k], kShortLanes, 0.0f);
    std::fill_n(sq[k], kShortLanes, 0.0f);
  }
  SixteenRowSums(&sum[0][0], center);
  for (int64_t k = 0; k < count; ++k) center[k] /= static_cast<float>(n);
  for (int64_t k = 0; k < count; ++k) {
    AccumulateValues<LaneSums::kFusedDeviations, kShortLanes>(
        d, x + k * n, n, center[k], load, dev[k], sq[k]);
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

// LongMoments' `write` of nothing.
struct NoWrite {
  template <bool kDeviations, class V>
  HWY_INLINE void Store(int64_t /*k*/, V /*values*/, int /*place*/) const {}
};

// LongMoments' `write` of one channel's affine (ChannelAffineWrite's, the
// same bits but for NaNs with kUnchecked): y[k] = fma(x[k] - a, b, c) in
// fp32, narrowed to kType (NaNs as kNaNs), streamed with kStream (y
// aligned to 64 bytes) or stored; Store<true> is handed x[k] - a. One
// thread's: it holds an even vector's result until the odd one's call.
template <DType kType, bool kStream, NaNs kNaNs, bool kPairOrder = false>
struct AffineWrite {
  typename Elements<kType>::Stored* HWY_RESTRICT y;
  float a, b, c;
  alignas(64) mutable float held[hn::MaxLanes(FloatVectorTag())];

  template <bool kDeviations, class V>
  HWY_INLINE void Store(int64_t k, V values, int place) const {
    const FloatVectorTag d;
    StorePanelAffine<kType, kStream, kPairOrder, kDeviations, kNaNs>(
        d, place, values, hn::Set(d, a), hn::Set(d, b), hn::Set(d, c), y + k,
        held);
  }
};

// The fast path of a block of n > kShortRow values (see block_moments.h), its
// 64 lanes in panels of 4 vectors each summed over a flush interval in
// turn. 16-bit data: `out` gets the widening with kStore, else what the
// scalar parts read (shift sample, tail, all on the exact path). kPairs
// (bfloat16, not kStore): the values read in pair order (see EvenBFloat16),
// each lane's sums the same; a specialization kept on measurement: AVX2,
// kernel_bench's bf16 rows against AVX3 (docs/design/kernels.md).
// The shift is the block's own sample mean (ShiftCenter), or `hint` (if
// not null) where it fits the first kHintSample values (HintFitsBlock).
// `write.Store<kDeviations>(k, f, v)` gets every vector f of the lanes,
// values [k, k + lanes) as read or, kDeviations, less the hint it took, as
// it is read, and v, its place in the panel (see StorePanelAffine); taken
// by value: a local whose constants the loop holds in registers (through a
// reference, the compiler reloads them after every store).
template <DType kType, bool kStore, bool kPairs = false, class Write = NoWrite>
Moments LongMoments(const typename Elements<kType>::Stored* HWY_RESTRICT x,
                    float* HWY_RESTRICT out, int64_t n, Write write = {},
                    const float* hint = nullptr) {
  using E = Elements<kType>;
  constexpr bool kFloat = kType == DType::kFloat32;
  const FloatVectorTag d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const float* values = out;  // What the scalar parts read.
  if constexpr (kFloat) {
    values = x;
  } else {
    // Widened a vector at a time, as ShiftCenter reads them.
    const int64_t sample = hint != nullptr ? kHintSample : kShiftSample;
    for (int64_t i = 0; i < sample; i += lanes) {
      hn::StoreU(E::Load(d, x + i), d, out + i);
    }
  }
  const float sample_center = ShiftCenter(values);
  const bool hinted =
      hint != nullptr && HintFitsBlock(values, sample_center, *hint);
  const float center = hinted ? *hint : sample_center;
  HWY_ALIGN float dev[kFloatLanes];
  HWY_ALIGN float sq[kFloatLanes];
  double wide_dev[kWideLanes];
  double wide_sq[kWideLanes];
  const int64_t i = n / kFloatLanes * kFloatLanes;  // Values in the lanes.
  static_assert(kFloatLanes >= 4 * hn::MaxLanes(FloatVectorTag()),
                "panels of 4 vectors: pairs for StorePanelAffine");
  // kGiven: the loads take the shift off, and the writer gets x - shift.
  auto accumulate = [&]<bool kGiven>(float shift) NORMD_LAMBDA_INLINE {
    AccumulateMoments<kGiven ? LaneSums::kFusedGiven
                             : LaneSums::kFusedDeviations,
                      kFloatLanes, kFloatFlush / kFloatLanes>(
        d, kFloatLanes, n / kFloatLanes, SameShift{shift},
        [&](int64_t s, int64_t at, int v) NORMD_LAMBDA_INLINE {
          const int64_t k = s * kFloatLanes + at;
          if constexpr (!kFloat || !std::is_same_v<Write, NoWrite>) {
            if (at == 0) {
              const char* ahead =
                  reinterpret_cast<const char*>(x + k) + kBlockPrefetchBytes;
              for (size_t line = 0; line < sizeof(*x) * kFloatLanes;
                   line += 64) {
                hwy::Prefetch(ahead + line);
              }
            }
          }
          const auto f = [&]() NORMD_LAMBDA_INLINE {
#if HWY_TARGET != HWY_SCALAR
            if constexpr (kPairs) return PairVector(d, x + k, v);
#endif
            return E::Load(d, x + k);
          }();
          if constexpr (!kFloat && kStore) hn::StoreU(f, d, out + k);
          if constexpr (kGiven) {
            const auto e = hn::Sub(f, hn::Set(d, shift));
            write.template Store<true>(k, e, v);
            return e;
          } else {
            write.template Store<false>(k, f, v);
            return f;
          }
        },
        dev, sq,
        // The flush, once every panel is summed: lane j + 32 onto lane j in
        // fp32, then into fp64; in vectors, stored as SumLanes reads them (a
        // narrower store read back wider stalls on store forwarding).
        [&](int64_t first, int64_t p, int64_t panel) NORMD_LAMBDA_INLINE {
          if (p + panel < kFloatLanes) return;
          const hn::CappedTag<double, 8> dd;
          const hn::Rebind<float, decltype(dd)> df;
          auto flush = [&](const float* acc, double* wide) NORMD_LAMBDA_INLINE {
            for (int j = 0; j < kWideLanes; j += hn::Lanes(dd)) {
              const auto pair = hn::PromoteTo(
                  dd, hn::Add(hn::LoadU(df, acc + j),
                              hn::LoadU(df, acc + j + kWideLanes)));
              if (first == 0) {
                hn::StoreU(pair, dd, wide + j);
              } else {
                hn::StoreU(hn::Add(hn::LoadU(dd, wide + j), pair), dd,
                           wide + j);
              }
            }
          };
          flush(dev, wide_dev);
          flush(sq, wide_sq);
        });
  };
  // The moments alone subtract the hint as they do a sample's mean, the
  // same bits as a writer that is handed the differences. A writer's loop
  // reads the hint, not `center`, so that it need not wait for the test
  // (its branch is predicted), which cost 1024-value blocks 10-30%.
  if constexpr (std::is_same_v<Write, NoWrite>) {
    accumulate.template operator()<false>(center);
  } else if (hinted) {
    accumulate.template operator()<true>(*hint);
  } else {
    accumulate.template operator()<false>(sample_center);
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

// Whether LongMoments reads a block of n values of kType in pair order:
// bfloat16 (not on scalar) from two flush intervals on, which pay back
// putting the lanes in order again.
template <DType kType>
constexpr bool ReadsPairs(int64_t n) {
  return kType == DType::kBFloat16 && HWY_TARGET != HWY_SCALAR &&
         n >= 2 * kFloatFlush;
}

template <DType kType>
Moments HalfMoments(const uint16_t* HWY_RESTRICT x, float* HWY_RESTRICT out,
                    int64_t n, bool store_widened, const float* hint) {
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
  if (store_widened) return LongMoments<kType, true>(x, out, n, {}, hint);
  if constexpr (kType == DType::kBFloat16) {
    if (ReadsPairs<kType>(n)) {
      return LongMoments<kType, false, true>(x, out, n, {}, hint);
    }
  }
  return LongMoments<kType, false>(x, out, n, {}, hint);
}

}  // namespace

Moments BlockWithAffine(DType dtype, const void* x, float* out, void* y,
                        int64_t n, float a, float b, float c, bool stream,
                        bool unchecked_nans) {
  Moments result;
  ForDType(dtype, [&]<DType kType>() {
    if constexpr (kType != DType::kFloat64) {
      using Stored = typename Elements<kType>::Stored;
      const auto* values = static_cast<const Stored*>(x);
      auto* to = static_cast<Stored*>(y);
      auto run = [&]<bool kStream, NaNs kNaNs>() {
        if constexpr (kType == DType::kBFloat16) {
          if (ReadsPairs<kType>(n)) {
            return LongMoments<kType, false, true>(
                values, out, n,
                AffineWrite<kType, kStream, kNaNs, true>{to, a, b, c, {}}, &a);
          }
        }
        return LongMoments<kType, false>(
            values, out, n, AffineWrite<kType, kStream, kNaNs>{to, a, b, c, {}},
            &a);
      };
      result = ForWriteRule<kType>(stream, unchecked_nans, run);
    }
  });
  return result;
}

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
              bool store_widened, const float* hint) {
  Moments result;
  ForDType(dtype, [&]<DType kType>() {
    const auto* values =
        static_cast<const typename Elements<kType>::Stored*>(x);
    if constexpr (kType == DType::kFloat64) {
      result = ExactMoments(values, n);
    } else if constexpr (kType == DType::kFloat32) {
      if (n > kShortRow) {
        result = LongMoments<kType, false>(values, nullptr, n, {}, hint);
      } else {
        FloatRows(values, n, 1, &result);
      }
    } else {
      result = HalfMoments<kType>(values, out, n, store_widened, hint);
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
HWY_EXPORT(BlockWithAffine);

void FloatRowsMoments(const float* x, int64_t n, int64_t count, Moments* out) {
  HWY_DYNAMIC_DISPATCH(FloatRows)(x, n, count, out);
}

Moments BlockMoments(DType dtype, const void* x, int64_t n, float* out,
                     bool store_widened, const float* shift_hint) {
  return HWY_DYNAMIC_DISPATCH(Block)(dtype, x, out, n, store_widened,
                                     shift_hint);
}

Moments BlockMomentsWithAffine(DType dtype, const void* x, void* y, int64_t n,
                               float a, float b, float c, bool stream) {
  // Where NaNs come only from x, the 16-bit narrowing leaves its NaN step
  // out, and a block that held a NaN, whose moments then are not finite, is
  // written again in full. A specialization kept on measurement:
  // kernel_bench's bf16 eval+observe (docs/design/kernels.md).
  const bool unchecked_nans = NaNOnlyFromInput(a, b, c);
  const Moments result = HWY_DYNAMIC_DISPATCH(BlockWithAffine)(
      dtype, x, Staging<float, StagingSlot::kBlockScratch>(kMomentsBlock), y, n,
      a, b, c, stream, unchecked_nans);
  // The values in the lanes, then those past the last whole step of them.
  const int64_t done = n / kBlockLanes * kBlockLanes;
  const int64_t from = unchecked_nans && !result.IsFinite() ? 0 : done;
  if (from == n) return result;
  if (from < done && stream) StreamFence();  // Before plain stores over them.
  const int64_t size = ElementSize(dtype);
  ChannelAffineWrite(dtype, static_cast<const char*>(x) + from * size,
                     static_cast<char*>(y) + from * size, from, n,
                     /*channels=*/1, /*inner=*/n, /*period=*/1, &a, &b, &c, {});
  return result;
}

}  // namespace normd
#endif  // HWY_ONCE
