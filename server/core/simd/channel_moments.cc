// The moments of a row block's channels (see channel_moments.h), compiled
// per target.
#include "server/core/simd/channel_moments.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "server/core/simd/fold.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/channel_moments.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/highway.h"
#include "server/core/simd/half-inl.h"
#include "server/core/simd/ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

// The fixed lanes (see channel_moments.h).
constexpr int64_t kTile = 64;
constexpr int64_t kTileFlush = 16;
constexpr int64_t kShiftSample = 32;
constexpr int kRunLanes = 16;
// How far ahead a block of two tiles or more prefetches rows into L2 (the
// hardware prefetcher falls behind at 1 KiB rows).
constexpr int64_t kRowsPrefetchBytes = 64 << 10;

// into[j] += acc[j] in fp64, j < count.
void AddWidened(const float* HWY_RESTRICT acc, double* HWY_RESTRICT into,
                int64_t count) {
  for (int64_t j = 0; j < count; ++j) into[j] += static_cast<double>(acc[j]);
}

// The shifts of `count` channels-last channels from `c`: the fp32 mean of
// each one's first kShiftSample rows from r0 (an overflow gives a
// non-finite shift, which NeedsExactPath catches).
template <DType kType, typename Stored>
void Shifts(const Stored* HWY_RESTRICT x, int64_t stride, int64_t c,
            int64_t count, int64_t r0, int64_t r1, float* HWY_RESTRICT center) {
  using E = Elements<kType>;
  const FloatVectorTag d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t sample_end = std::min(r1, r0 + kShiftSample);
  const float inverse = 1.0f / static_cast<float>(sample_end - r0);
  int64_t j = 0;
  for (; j + lanes <= count; j += lanes) {
    auto sum = hn::Zero(d);
    for (int64_t r = r0; r < sample_end; ++r) {
      sum = hn::Add(sum, E::Load(d, x + r * stride + c + j));
    }
    hn::StoreU(hn::Mul(sum, hn::Set(d, inverse)), d, center + j);
  }
  for (; j < count; ++j) {
    float sum = 0.0f;
    for (int64_t r = r0; r < sample_end; ++r) {
      sum += E::Scalar(x[r * stride + c + j]);
    }
    center[j] = sum * inverse;
  }
}

// The sums of channels-last channels [c, c + width) over rows [r0, r1):
// whole tiles (width a multiple of kTile) or a narrow tile (below kTile: a
// step of kTile / width rows, value q of a flush interval in lane q %
// step_values, step_values = width * (kTile / width), the last step's
// missing values masked off; a power of two, as a strided tile is, fills
// the kTile lanes). A narrow tile that is whole rows (width == stride) is
// read in place, a strided one copied together first. Panels of 4 vectors
// are summed over each interval of kTileFlush steps, then added into fp64.
// Narrow tiles are a specialization kept on measurement: AVX3 and AVX2,
// bench case ChannelMoments*/nc8 (docs/design/kernels.md). Whole tiles prefetch
// rows before `prefetch_end`, `prefetch_bytes` wide.
template <DType kType, typename Stored>
void ChannelsLastSums(const Stored* HWY_RESTRICT x, int64_t stride, int64_t c,
                      int64_t width, int64_t r0, int64_t r1,
                      int64_t prefetch_end, int64_t prefetch_bytes,
                      double* HWY_RESTRICT center_out,
                      double* HWY_RESTRICT dev_out,
                      double* HWY_RESTRICT sq_out) {
  using E = Elements<kType>;
  const FloatVectorTag d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const bool narrow = width < kTile;
  const int64_t step_rows = narrow ? kTile / width : 1;
  const int64_t step_values = step_rows * width;
  const int64_t step_lanes = narrow ? kTile : width;
  // Whole bfloat16 tiles read in pair order (see EvenBFloat16), their
  // shifts and sums kept in it: a specialization kept on measurement: AVX2,
  // kernel_bench's bf16 rows against AVX3 (docs/design/kernels.md).
  constexpr bool kPairOrder =
      kType == DType::kBFloat16 && HWY_TARGET != HWY_SCALAR;
  const bool pairs = kPairOrder && !narrow;
  HWY_ALIGN float center[kMaxChannelsLastBlock];
  Shifts<kType>(x, stride, c, width, r0, r1, center);
  for (int64_t l = width; l < step_lanes; ++l) center[l] = center[l % width];
  if (pairs) PairOrder(center, width, lanes, /*back=*/false);
  HWY_ALIGN float staged[kTileFlush * kTile];
  HWY_ALIGN float acc[2 * kTile];
  double narrow_dev[kTile], narrow_sq[kTile];
  double* dev = narrow ? narrow_dev : dev_out;
  double* sq = narrow ? narrow_sq : sq_out;
  std::fill(dev, dev + step_lanes, 0.0);
  std::fill(sq, sq + step_lanes, 0.0);
  // Adds steps [0, steps) of values(s, at), the lanes [at, at + lanes) of
  // step s, the first `valid` values only when kMasked (kFull: steps of
  // kTile values, else of step_values).
  auto add = [&]<bool kMasked, bool kFull = true>(
      int64_t steps, int64_t valid, const auto& values) NORMD_LAMBDA_INLINE {
    for (int64_t p = 0; p < step_lanes; p += 4 * lanes) {
      // The panel's shifts, loaded once (GCC reloads them every step).
      const auto c0 = hn::Load(d, center + p);
      const auto c1 = hn::Load(d, center + p + lanes);
      const auto c2 = hn::Load(d, center + p + 2 * lanes);
      const auto c3 = hn::Load(d, center + p + 3 * lanes);
      PanelSums(
          d, 4, 0, steps, 1,
          [&](int64_t s, int v, auto& dev_v, auto& sq_v) NORMD_LAMBDA_INLINE {
            const int64_t at = p + v * lanes;
            const auto shift = v == 0 ? c0 : v == 1 ? c1 : v == 2 ? c2 : c3;
            AddDeviation<true>(
                d, hn::Sub(values(s, at, v), shift), dev_v, sq_v,
                !kMasked ? INT64_MAX
                : kFull  ? valid - (s * kTile + at)
                         : std::min(step_values, valid - s * step_values) - at);
          },
          acc, acc + kTile);
      AddWidened(acc, dev + p, 4 * lanes);
      AddWidened(acc + kTile, sq + p, 4 * lanes);
    }
  };
  const int64_t row_bytes = stride * static_cast<int64_t>(sizeof(Stored));
  const int64_t ahead = std::max<int64_t>(1, kRowsPrefetchBytes / row_bytes);
  for (int64_t f = r0; f < r1; f += kTileFlush * step_rows) {
    const int64_t f_end = std::min(r1, f + kTileFlush * step_rows);
    if (narrow) {
      const int64_t values = (f_end - f) * width;
      const int64_t steps = (values + step_values - 1) / step_values;
      if (width == stride) {
        // Whole rows: the interval's values are contiguous. kFull: the steps
        // fill the kTile lanes (a constant step, which AVX2 needs for speed).
        const Stored* interval = x + f * stride;
        auto read = [&]<bool kFull>() NORMD_LAMBDA_INLINE {
          const int64_t step = kFull ? kTile : step_values;
          add.template operator()<true, kFull>(
              steps, values,
              [&](int64_t s, int64_t at, int) NORMD_LAMBDA_INLINE {
                // Lanes past the step read the next step's values (add
                // masks them off); only the interval's end is not read past.
                const int64_t q = s * step + at;
                return E::Load(interval, q,
                               static_cast<size_t>(
                                   std::clamp<int64_t>(values - q, 0, lanes)));
              });
        };
        if (step_values == kTile) {
          read.template operator()<true>();
        } else {
          read.template operator()<false>();
        }
        continue;
      }
      for (int64_t r = f; r < f_end; ++r) {
        const Stored* from = x + r * stride + c;
        float* to = staged + (r - f) * width;
        int64_t j = 0;
        for (; j + lanes <= width; j += lanes) {
          hn::StoreU(E::Load(d, from + j), d, to + j);
        }
        for (; j < width; ++j) to[j] = E::Scalar(from[j]);
      }
      add.template operator()<true>(
          steps, values, [&](int64_t s, int64_t at, int) NORMD_LAMBDA_INLINE {
            return hn::Load(d, staged + s * kTile + at);
          });
      continue;
    }
    for (int64_t r = f; r < f_end && r + ahead < prefetch_end; ++r) {
      const char* row =
          reinterpret_cast<const char*>(x + (r + ahead) * stride + c);
      for (int64_t line = 0; line < prefetch_bytes; line += 64) {
        __builtin_prefetch(row + line, 0, 2);
      }
    }
    add.template operator()<false>(
        f_end - f, 0, [&](int64_t s, int64_t at, int v) NORMD_LAMBDA_INLINE {
          const Stored* row = x + (f + s) * stride + c;
#if HWY_TARGET != HWY_SCALAR
          if constexpr (kPairOrder) return PairVector(d, row + at, v);
#endif
          return E::Load(d, row + at);
        });
  }
  if (pairs) {
    PairOrder(center, width, lanes, /*back=*/true);
    PairOrder(dev, width, lanes, /*back=*/true);
    PairOrder(sq, width, lanes, /*back=*/true);
  }
  for (int64_t j = 0; j < width; ++j) {
    center_out[j] = static_cast<double>(center[j]);
    if (!narrow) continue;
    dev_out[j] = sq_out[j] = 0.0;
    for (int64_t l = j; l < step_values; l += width) {
      dev_out[j] += dev[l];
      sq_out[j] += sq[l];
    }
  }
}

// Runs of inner >= kRunLanes values: the sums of channels [c0, c0 + width)
// over rows [r0, r1) in kRunLanes fp64 lanes per run (fp32 lanes lost
// accuracy: 1e-8 against the tests' 1e-12), folded pairwise into the
// channel's sums; the shift the mean of its first kRunLanes values. A run's
// tail is read in place, masked, unless that would pass `end`. A
// specialization kept on measurement: AVX3 and AVX2, bench case
// ChannelMoments*/nchw49 (docs/design/kernels.md).
template <DType kType, typename Stored>
void RunSums(const Stored* HWY_RESTRICT x, const Stored* end, int64_t inner,
             int64_t stride, int64_t c0, int64_t width, int64_t r0, int64_t r1,
             double* HWY_RESTRICT center_out, double* HWY_RESTRICT dev_out,
             double* HWY_RESTRICT sq_out) {
  using E = Elements<kType>;
  const hn::CappedTag<double, kRunLanes> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(dd));
  const int64_t vectors = std::min<int64_t>(4, kRunLanes / lanes);
  const int64_t whole = inner / kRunLanes * kRunLanes;
  const int64_t rest = inner - whole;
  auto load = [&](const Stored* p) {
    return hn::PromoteTo(dd, E::Load(df, p));
  };
  Stored padded[kRunLanes] = {};
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const Stored* run = x + r * stride + (c0 + c) * inner;
      if (r == r0) {
        double first[kRunLanes];
        for (int j = 0; j < kRunLanes; ++j) first[j] = E::Scalar(run[j]);
        center_out[c] = fold::SumLanes(first) / kRunLanes;
        dev_out[c] = sq_out[c] = 0.0;
      }
      const auto center = hn::Set(dd, center_out[c]);
      const Stored* tail = run + whole;
      if (rest > 0 && tail + kRunLanes > end) {
        std::copy(tail, tail + rest, padded);
        tail = padded;
      }
      double dev[kRunLanes];
      double sq[kRunLanes];
      for (int64_t p = 0; p < kRunLanes; p += vectors * lanes) {
        PanelSums(
            dd, vectors, p, whole, kRunLanes,
            [&](int64_t i, int v, auto& dev_v, auto& sq_v) NORMD_LAMBDA_INLINE {
              AddDeviation<false>(
                  dd, hn::Sub(load(run + i + v * lanes), center), dev_v, sq_v);
            },
            dev + p, sq + p,
            // The tail: value whole + j in lane j < rest.
            [&](int v, auto& dev_v, auto& sq_v) NORMD_LAMBDA_INLINE {
              const int64_t at = p + v * lanes;
              if (at >= rest) return;
              AddDeviation<false>(dd, hn::Sub(load(tail + at), center), dev_v,
                                  sq_v, rest - at);
            });
      }
      dev_out[c] += FoldArray<kRunLanes>(dev);
      sq_out[c] += FoldArray<kRunLanes>(sq);
    }
  }
}

// The shift (or mean), S1 and S2 of every channel of the block into sum,
// dev, sq, then its moments into out: by the fast paths where `fast` and
// the layout allow, else the exact loops. False when a fast result lost
// accuracy.
template <DType kType, typename Stored = typename Elements<kType>::Stored>
bool BlockSums(const Stored* HWY_RESTRICT x, const ChannelLayout& layout,
               const ChannelRowBlock& block, bool fast,
               double* HWY_RESTRICT scratch, Moments* HWY_RESTRICT out) {
  using E = Elements<kType>;
  const int64_t width = block.width();
  const int64_t inner = layout.inner;
  const int64_t stride = layout.channels * inner;
  double* HWY_RESTRICT sum = scratch;
  double* HWY_RESTRICT dev = sum + width;
  double* HWY_RESTRICT sq = dev + width;
  int64_t done = 0;  // Channels [0, done) summed by a fast path.
  if constexpr (kType == DType::kFloat64) {
    // fp64: the exact loops alone.
  } else if (fast && inner == 1) {
    // Blocks of two tiles or more prefetch.
    const bool prefetch =
        width / kTile + std::popcount(static_cast<uint64_t>(width % kTile)) >=
        2;
    for (int64_t at = 0; at < width;) {
      const int64_t left = width - at;
      // Whole tiles, then narrow ones: all the channels when they are whole
      // rows, else powers of two.
      const int64_t w = left >= kTile    ? left / kTile * kTile
                        : left == stride ? left
                                         : static_cast<int64_t>(std::bit_floor(
                                               static_cast<uint64_t>(left)));
      ChannelsLastSums<kType>(x, stride, block.c0 + at, w, block.r0, block.r1,
                              prefetch ? layout.outer : 0,
                              width * static_cast<int64_t>(sizeof(Stored)),
                              sum + at, dev + at, sq + at);
      at += w;
    }
    done = width;
  } else if (fast && inner >= kRunLanes) {
    RunSums<kType>(x, x + layout.NumElements(), inner, stride, block.c0, width,
                   block.r0, block.r1, sum, dev, sq);
    done = width;
  }
  std::fill(sum + done, sum + width, 0.0);
  std::fill(dev + done, dev + width, 0.0);
  std::fill(sq + done, sq + width, 0.0);
  for (int64_t r = block.r0; r < block.r1; ++r) {
    const Stored* HWY_RESTRICT row = x + r * stride + block.c0 * inner;
    for (int64_t c = done; c < width; ++c) {
      for (int64_t i = 0; i < inner; ++i) {
        sum[c] += static_cast<double>(E::Scalar(row[c * inner + i]));
      }
    }
  }
  const int64_t count = (block.r1 - block.r0) * inner;
  for (int64_t c = done; c < width; ++c) sum[c] /= static_cast<double>(count);
  for (int64_t r = block.r0; r < block.r1; ++r) {
    const Stored* HWY_RESTRICT row = x + r * stride + block.c0 * inner;
    for (int64_t c = done; c < width; ++c) {
      for (int64_t i = 0; i < inner; ++i) {
        const double d =
            static_cast<double>(E::Scalar(row[c * inner + i])) - sum[c];
        dev[c] += d;
        sq[c] += d * d;
      }
    }
  }
  bool accurate = true;
  for (int64_t c = 0; c < width; ++c) {
    out[c] = fold::Corrected(count, sum[c], dev[c], sq[c]);
    if (c < done && fold::NeedsExactPath(out[c], sq[c])) accurate = false;
  }
  return accurate;
}

}  // namespace

void RowBlockMoments(DType dtype, const void* x, const ChannelLayout& layout,
                     const ChannelRowBlock& block, double* scratch,
                     Moments* out) {
  ForDType(dtype, [&]<DType kType>() {
    const auto* values =
        static_cast<const typename Elements<kType>::Stored*>(x);
    if (kType == DType::kFloat64 ||
        !BlockSums<kType>(values, layout, block, /*fast=*/true, scratch, out)) {
      BlockSums<kType>(values, layout, block, /*fast=*/false, scratch, out);
    }
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {

HWY_EXPORT(RowBlockMoments);

void ChannelRowBlockMoments(DType dtype, const void* x,
                            const ChannelLayout& layout,
                            const ChannelRowBlock& block, double* scratch,
                            Moments* out) {
  HWY_DYNAMIC_DISPATCH(RowBlockMoments)(dtype, x, layout, block, scratch, out);
}

}  // namespace normd
#endif  // HWY_ONCE
