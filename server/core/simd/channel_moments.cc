// The moments of a row block's channels (see channel_moments.h), compiled
// per target.
#include "server/core/simd/channel_moments.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "server/core/simd/channel_affine.h"
#include "server/core/simd/fold.h"
#include "server/core/simd/streaming.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/channel_moments.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/highway.h"
#include "server/core/simd/channels_last_shifts-inl.h"
#include "server/core/simd/channels_last_write-inl.h"
#include "server/core/simd/half-inl.h"
#include "server/core/simd/moments_accumulator-inl.h"
#include "server/core/simd/ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

// The fixed lanes (see channel_moments.h; kTile: channels_last_write-inl.h).
constexpr int64_t kTileFlush = 16;
constexpr int kRunLanes = 16;
constexpr int kExactChannels = 8;
// How far ahead a block of two tiles or more prefetches rows into L2 (the
// hardware prefetcher falls behind at 1 KiB rows).
constexpr int64_t kRowsPrefetchBytes = 64 << 10;
// How far ahead a pass over whole rows of one tile prefetches each row into
// L1 as it reads one: out of cache the hardware prefetcher falls behind the
// reads of the moments alone as well as the reads and writes of a fused
// pass; a burst of rows into L2, as above, costs the fused pass time in
// cache. The moments alone read a row in about half the fused pass's time:
// twice the bytes are the same lead.
constexpr int64_t kTileRowPrefetchBytes = 4096;
constexpr int64_t kFusedTileRowPrefetchBytes = 2048;

// into[j] += acc[j] in fp64, j < count.
void AddWidened(const float* HWY_RESTRICT acc, double* HWY_RESTRICT into,
                int64_t count) {
  for (int64_t j = 0; j < count; ++j) into[j] += static_cast<double>(acc[j]);
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
// rows before `prefetch_end` (into L2, `prefetch_bytes` of each of a flush
// interval's rows at a time; one tile of whole rows into L1, a row as it
// reads one), and hand every vector they read to `write` with its place in
// the panel (narrow ones write nothing). Whole tiles take their channels'
// shift hints (hints[c + j], if `hints`) where they fit (TakeHints); a
// writing pass whose tiles all took them hands `write` x - hint, the
// subtraction its affine would do (write's a are the hints).
template <DType kType, typename Stored, class Write = NoRowWrite>
void ChannelsLastSums(const Stored* HWY_RESTRICT x, int64_t stride, int64_t c,
                      int64_t width, int64_t r0, int64_t r1,
                      int64_t prefetch_end, int64_t prefetch_bytes,
                      double* HWY_RESTRICT center_out,
                      double* HWY_RESTRICT dev_out, double* HWY_RESTRICT sq_out,
                      const float* hints, const Write& write = {}) {
  using E = Elements<kType>;
  const FloatVectorTag d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  // A one-tile writer's width as a constant: the narrow paths drop out.
  if constexpr (Write::kOneTile) width = kTile;
  const bool narrow = width < kTile;
  const int64_t step_rows = narrow ? kTile / width : 1;
  const int64_t step_values = step_rows * width;
  const int64_t step_lanes = narrow ? kTile : width;
  // Whole bfloat16 tiles read in pair order (see EvenBFloat16), their
  // shifts and sums kept in it: a specialization kept on measurement: AVX2,
  // kernel_bench's bf16 rows against AVX3 (docs/design/kernels.md). When
  // writing, only for a writer whose constants are in pair order too
  // (Write::kPairOrder); the sums are the same.
  constexpr bool kPairOrder = kType == DType::kBFloat16 &&
                              HWY_TARGET != HWY_SCALAR && Write::kPairOrder;
  const bool pairs = kPairOrder && !narrow;
  static_assert(kTile >= 4 * hn::MaxLanes(FloatVectorTag()),
                "panels of 4 vectors: pairs for StorePanelAffine");
  HWY_ALIGN float center[kMaxChannelsLastBlock];
  Shifts<kType>(x, stride, c, width, r0, r1, center);
  const bool hinted =
      hints != nullptr && !narrow &&
      TakeHints<kType>(x, stride, c, width, r0, r1, hints + c, center);
  for (int64_t l = width; l < step_lanes; ++l) center[l] = center[l % width];
  if (pairs) PairOrder(center, width, lanes, /*back=*/false);
  HWY_ALIGN float staged[kTileFlush * kTile];
  // The interval's fp32 sums: S1 at acc, S2 a tile further than the widest
  // block, so that the two are not 4 KiB apart (a load from one after a
  // store to the other would wait on it: 4K aliasing).
  HWY_ALIGN float acc[2 * kMaxChannelsLastBlock + kTile];
  float* acc_dev = acc;
  float* acc_sq = acc + kMaxChannelsLastBlock + kTile;
  double narrow_dev[kTile], narrow_sq[kTile];
  double* dev = narrow ? narrow_dev : dev_out;
  double* sq = narrow ? narrow_sq : sq_out;
  std::fill(dev, dev + step_lanes, 0.0);
  std::fill(sq, sq + step_lanes, 0.0);
  // Adds one flush interval: steps [0, steps) of values(s, at, v), the
  // lanes [at, at + lanes) of step s. kMasked: the first `valid` values
  // only; kFull: steps of kTile values, the whole ones read by whole(s, at,
  // v) and the last, partial, by values; else steps of step_values, each
  // masked.
  // kGiven: values(s, at, v) gives x - shift.
  auto add = [&]<bool kMasked, bool kFull = true, bool kGiven = false>(
      int64_t steps, int64_t valid, const auto& values, const auto& whole)
      NORMD_LAMBDA_INLINE {
    const LaneShifts<float> shift{center};
    auto flush = [&](int64_t, int64_t p, int64_t panel) NORMD_LAMBDA_INLINE {
      AddWidened(acc_dev + p, dev + p, panel);
      AddWidened(acc_sq + p, sq + p, panel);
    };
    if constexpr (!kMasked) {
      constexpr LaneSums kAdd =
          kGiven ? LaneSums::kFusedGiven : LaneSums::kFusedDeviations;
      AccumulateMoments<kAdd, kTile>(d, step_lanes, steps, shift, values,
                                     acc_dev, acc_sq, flush);
    } else if constexpr (kFull) {
      const int64_t full = valid / kTile;
      AccumulateMoments<LaneSums::kFusedDeviations, kTile>(
          d, step_lanes, full, shift, whole, acc_dev, acc_sq, flush,
          EveryLane(),
          PartialStep{valid - full * kTile,
                      [&](int64_t at)
                          NORMD_LAMBDA_INLINE { return values(full, at, 0); }});
    } else {
      AccumulateMoments<LaneSums::kFusedDeviations, kTile>(
          d, step_lanes, steps, shift, values, acc_dev, acc_sq, flush,
          [&](int64_t s, int64_t at) NORMD_LAMBDA_INLINE {
            return std::min(step_values, valid - s * step_values) - at;
          });
    }
  };
  // The writer's own copy: a vector store may alias any object whose
  // address the compiler has seen, so it would reload a caller's writer's
  // pointer and stride for every vector; a local it keeps in registers.
  const Write local_write = write;
  const int64_t row_bytes = stride * static_cast<int64_t>(sizeof(Stored));
  const bool row_by_row = width == kTile && width == stride;
  const int64_t row_prefetch_bytes =
      Write::kWrites ? kFusedTileRowPrefetchBytes : kTileRowPrefetchBytes;
  const int64_t ahead = std::max<int64_t>(
      1, (row_by_row ? row_prefetch_bytes : kRowsPrefetchBytes) / row_bytes);
  // The intervals in turn; kGiven: the shifts taken off once, for the sums
  // and the write.
  auto intervals = [&]<bool kGiven>() NORMD_LAMBDA_INLINE {
    for (int64_t f = r0; f < r1; f += kTileFlush * step_rows) {
      const int64_t f_end = std::min(r1, f + kTileFlush * step_rows);
      if (!kGiven && narrow) {
        const int64_t values = (f_end - f) * width;
        const int64_t steps = (values + step_values - 1) / step_values;
        if (width == stride) {
          // Whole rows: the interval's values are contiguous. kFull: the steps
          // fill the kTile lanes (a constant step, which AVX2 needs for speed).
          const Stored* interval = x + f * stride;
          auto read = [&]<bool kFull>() NORMD_LAMBDA_INLINE {
            const int64_t step = kFull ? kTile : step_values;
            // Lanes past the step read the next step's values (add masks them
            // off); only the interval's end is not read past.
            auto part = [&](int64_t s, int64_t at, int) NORMD_LAMBDA_INLINE {
              const int64_t q = s * step + at;
              return E::Load(interval, q,
                             static_cast<size_t>(
                                 std::clamp<int64_t>(values - q, 0, lanes)));
            };
            auto whole = [&](int64_t s, int64_t at, int) NORMD_LAMBDA_INLINE {
              return E::Load(d, interval + s * kTile + at);
            };
            add.template operator()<true, kFull>(steps, values, part, whole);
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
        auto from_staged = [&](int64_t s, int64_t at, int) NORMD_LAMBDA_INLINE {
          return hn::Load(d, staged + s * kTile + at);
        };
        add.template operator()<true>(steps, values, from_staged, from_staged);
        continue;
      }
      for (int64_t r = f; !row_by_row && r < f_end && r + ahead < prefetch_end;
           ++r) {
        const char* row =
            reinterpret_cast<const char*>(x + (r + ahead) * stride + c);
        for (int64_t line = 0; line < prefetch_bytes; line += 64) {
          __builtin_prefetch(row + line, 0, 2);
        }
      }
      auto tile_rows = [&](int64_t s, int64_t at, int v) NORMD_LAMBDA_INLINE {
        const Stored* row = x + (f + s) * stride + c;
        if (row_by_row && at == 0 && f + s + ahead < prefetch_end) {
          const char* next =
              reinterpret_cast<const char*>(row + ahead * stride);
          for (size_t line = 0; line < kTile * sizeof(Stored); line += 64) {
            __builtin_prefetch(next + line, 0, 3);
          }
        }
        const auto values = [&]() NORMD_LAMBDA_INLINE {
#if HWY_TARGET != HWY_SCALAR
          if constexpr (kPairOrder) return PairVector(d, row + at, v);
#endif
          return E::Load(d, row + at);
        }();
        if constexpr (kGiven) {
          const auto e = hn::Sub(values, hn::Load(d, center + at));
          local_write.template Store<true>(f + s, c + at, e, v);
          return e;
        } else {
          local_write.template Store<false>(f + s, c + at, values, v);
          return values;
        }
      };
      add.template operator()<false, true, kGiven>(f_end - f, 0, tile_rows,
                                                   tile_rows);
    }
  };
  if (Write::kWrites && hinted) {
    intervals.template operator()<Write::kWrites>();
  } else {
    intervals.template operator()<false>();
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
  // A whole vector read in place, unless a tail's would pass `end`.
  auto load = [&](const Stored* p, int64_t count) NORMD_LAMBDA_INLINE {
    if (count < lanes && p + lanes > end) {
      Stored padded[kRunLanes] = {};
      std::copy(p, p + count, padded);
      return hn::PromoteTo(dd, E::Load(df, padded));
    }
    return hn::PromoteTo(dd, E::Load(df, p));
  };
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const Stored* run = x + r * stride + (c0 + c) * inner;
      if (r == r0) {
        double first[kRunLanes];
        for (int j = 0; j < kRunLanes; ++j) first[j] = E::Scalar(run[j]);
        center_out[c] = fold::SumLanes(first) / kRunLanes;
        dev_out[c] = sq_out[c] = 0.0;
      }
      double dev[kRunLanes];
      double sq[kRunLanes];
      AccumulateValues<LaneSums::kDeviations, kRunLanes>(
          dd, run, inner, center_out[c], load, dev, sq);
      dev_out[c] += FoldArray<kRunLanes>(dev);
      sq_out[c] += FoldArray<kRunLanes>(sq);
    }
  }
}

// Stored values [p, p + count) in fp64 lanes.
template <DType kType, class DD, typename Stored>
HWY_INLINE hn::Vec<DD> LoadAsDouble(DD dd, const Stored* p, size_t count) {
  if constexpr (kType == DType::kFloat64) {
    return LoadPart(dd, p, count);
  } else {
    const hn::Rebind<float, DD> df;
    if constexpr (kType == DType::kFloat32) {
      return hn::PromoteTo(dd, LoadPart(df, p, count));
    } else {
      return hn::PromoteTo(
          dd, WidenHalfBits<kType>(
                  df, LoadPart(HalfBitsTag<decltype(df)>(), p, count)));
    }
  }
}

// The exact loops for channels [from, width) of the block: each channel's
// mean, then d = x - mean and d^2 (not fused), in fp64, its values in
// order. Channels-last: a lane per channel, a step per row; otherwise one
// lane per channel, continued run by run.
template <DType kType, typename Stored>
void ExactChannelSums(const Stored* HWY_RESTRICT x, const ChannelLayout& layout,
                      const ChannelRowBlock& block, int64_t from,
                      double* HWY_RESTRICT sum, double* HWY_RESTRICT dev,
                      double* HWY_RESTRICT sq) {
  using E = Elements<kType>;
  const int64_t width = block.width();
  const int64_t inner = layout.inner;
  const int64_t stride = layout.channels * inner;
  const int64_t rows = block.r1 - block.r0;
  const auto count = static_cast<double>(rows * inner);
  if (from == width) return;  // The fast paths summed every channel.
  if (inner == 1) {
    const hn::CappedTag<double, kExactChannels> dd;
    const int64_t channels = width - from;
    const int64_t vector = static_cast<int64_t>(hn::Lanes(dd));
    auto load = [&](int64_t s, int64_t at, int) NORMD_LAMBDA_INLINE {
      return LoadAsDouble<kType>(
          dd, x + (block.r0 + s) * stride + block.c0 + from + at,
          static_cast<size_t>(std::clamp<int64_t>(channels - at, 0, vector)));
    };
    auto valid = [&](int64_t, int64_t at)
                     NORMD_LAMBDA_INLINE { return channels - at; };
    const int64_t lanes = hwy::RoundUpTo(channels, kExactChannels);
    HWY_ALIGN double mean[kMaxChannelsLastBlock + kExactChannels] = {};
    HWY_ALIGN double lane_dev[kMaxChannelsLastBlock + kExactChannels];
    HWY_ALIGN double lane_sq[kMaxChannelsLastBlock + kExactChannels];
    AccumulateMoments<LaneSums::kSums, kExactChannels>(
        dd, lanes, rows, SameShift{0.0}, load, mean, lane_sq, NoFlush(), valid);
    for (int64_t c = 0; c < channels; ++c) mean[c] /= count;
    AccumulateMoments<LaneSums::kDeviations, kExactChannels>(
        dd, lanes, rows, LaneShifts<double>{mean}, load, lane_dev, lane_sq,
        NoFlush(), valid);
    std::copy(mean, mean + channels, sum + from);
    std::copy(lane_dev, lane_dev + channels, dev + from);
    std::copy(lane_sq, lane_sq + channels, sq + from);
    return;
  }
  std::fill(sum + from, sum + width, 0.0);
  std::fill(dev + from, dev + width, 0.0);
  std::fill(sq + from, sq + width, 0.0);
  const hn::CappedTag<double, 1> d1;
  for (LaneSums pass : {LaneSums::kSums, LaneSums::kDeviations}) {
    for (int64_t r = block.r0; r < block.r1; ++r) {
      const Stored* HWY_RESTRICT row = x + r * stride + block.c0 * inner;
      for (int64_t c = from; c < width; ++c) {
        const auto run = [&](int64_t s, int64_t, int) NORMD_LAMBDA_INLINE {
          return hn::Set(d1,
                         static_cast<double>(E::Scalar(row[c * inner + s])));
        };
        if (pass == LaneSums::kSums) {  // sq[c] stays as it is.
          AccumulateMoments<LaneSums::kSums, 1, 0, StartFrom::kSums>(
              d1, 1, inner, SameShift{0.0}, run, sum + c, sq + c, NoFlush());
        } else {
          AccumulateMoments<LaneSums::kDeviations, 1, 0, StartFrom::kSums>(
              d1, 1, inner, SameShift{sum[c]}, run, dev + c, sq + c, NoFlush());
        }
      }
    }
    if (pass == LaneSums::kSums) {
      for (int64_t c = from; c < width; ++c) sum[c] /= count;
    }
  }
}

// The shift (or mean), S1 and S2 of every channel of the block into sum,
// dev, sq, then its moments into out: by the fast paths where `fast` and
// the layout allow, else the exact loops. False when a fast result lost
// accuracy.
// `hints` and `write`: ChannelsLastSums'.
template <DType kType, typename Stored = typename Elements<kType>::Stored,
          class Write = NoRowWrite>
bool BlockSums(const Stored* HWY_RESTRICT x, const ChannelLayout& layout,
               const ChannelRowBlock& block, bool fast,
               double* HWY_RESTRICT scratch, Moments* HWY_RESTRICT out,
               const float* hints = nullptr, const Write& write = {}) {
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
    // Blocks of two tiles or more prefetch, and those of one tile that are
    // whole rows or fused.
    const bool prefetch =
        Write::kWrites || width == stride ||
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
      if constexpr (Write::kWrites) {
        if (w == kTile) {
          typename Write::Tile tile;
          write.CopyTile(block.c0 + at, tile);
          ChannelsLastSums<kType>(x, stride, block.c0 + at, w, block.r0,
                                  block.r1, prefetch ? layout.outer : 0,
                                  width * static_cast<int64_t>(sizeof(Stored)),
                                  sum + at, dev + at, sq + at, hints, tile);
          at += w;
          continue;
        }
      }
      ChannelsLastSums<kType>(x, stride, block.c0 + at, w, block.r0, block.r1,
                              prefetch ? layout.outer : 0,
                              width * static_cast<int64_t>(sizeof(Stored)),
                              sum + at, dev + at, sq + at, hints, write);
      at += w;
    }
    done = width;
  } else if (fast && inner >= kRunLanes) {
    RunSums<kType>(x, x + layout.NumElements(), inner, stride, block.c0, width,
                   block.r0, block.r1, sum, dev, sq);
    done = width;
  }
  ExactChannelSums<kType>(x, layout, block, done, sum, dev, sq);
  const int64_t count = (block.r1 - block.r0) * inner;
  bool accurate = true;
  for (int64_t c = 0; c < width; ++c) {
    out[c] = fold::Corrected(count, sum[c], dev[c], sq[c]);
    if (c < done && fold::NeedsExactPath(out[c], sq[c])) accurate = false;
  }
  return accurate;
}

}  // namespace

void RowBlockWithAffine(DType dtype, const void* x, void* y,
                        const ChannelLayout& layout,
                        const ChannelRowBlock& block, const float* a,
                        const float* b, const float* c, bool stream,
                        bool unchecked_nans, double* scratch, Moments* out) {
  ForDType(dtype, [&]<DType kType>() {
    if constexpr (kType != DType::kFloat64) {
      using Stored = typename Elements<kType>::Stored;
      const auto* values = static_cast<const Stored*>(x);
      auto* to = static_cast<Stored*>(y);
      const int64_t stride = layout.channels;
      // Every value is written by the fast pass, a the shift hints; a block
      // that lost accuracy has its moments taken again, exactly.
      auto fast = [&]<bool kStream, NaNs kNaNs>() {
        return BlockSums<kType>(values, layout, block, /*fast=*/true, scratch,
                                out, a,
                                ChannelsLastAffineWrite<kType, kStream, kNaNs>{
                                    to, stride, a, b, c, {}});
      };
      const bool accurate = ForWriteRule<kType>(stream, unchecked_nans, fast);
      if (!accurate) {
        BlockSums<kType>(values, layout, block, /*fast=*/false, scratch, out);
      }
    }
  });
}

void RowBlockMoments(DType dtype, const void* x, const ChannelLayout& layout,
                     const ChannelRowBlock& block, const float* hints,
                     double* scratch, Moments* out) {
  ForDType(dtype, [&]<DType kType>() {
    const auto* values =
        static_cast<const typename Elements<kType>::Stored*>(x);
    if (kType == DType::kFloat64 ||
        !BlockSums<kType>(values, layout, block, /*fast=*/true, scratch, out,
                          hints)) {
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
HWY_EXPORT(RowBlockWithAffine);

void ChannelRowBlockMoments(DType dtype, const void* x,
                            const ChannelLayout& layout,
                            const ChannelRowBlock& block, double* scratch,
                            Moments* out, const float* shift_hints) {
  HWY_DYNAMIC_DISPATCH(RowBlockMoments)
  (dtype, x, layout, block, shift_hints, scratch, out);
}

void ChannelRowBlockMomentsWithAffine(DType dtype, const void* x, void* y,
                                      const ChannelLayout& layout,
                                      const ChannelRowBlock& block,
                                      const float* a, const float* b,
                                      const float* c, bool stream,
                                      double* scratch, Moments* out) {
  // Where NaNs come only from x, the 16-bit narrowing leaves its NaN step
  // out, and a block that held a NaN, whose moments then are not all
  // finite, is written again (as BlockMomentsWithAffine does).
  bool unchecked_nans = true;
  for (int64_t k = block.c0; k < block.c1; ++k) {
    unchecked_nans = unchecked_nans && NaNOnlyFromInput(a[k], b[k], c[k]);
  }
  HWY_DYNAMIC_DISPATCH(RowBlockWithAffine)
  (dtype, x, y, layout, block, a, b, c, stream, unchecked_nans, scratch, out);
  if (!unchecked_nans ||
      std::all_of(out, out + block.width(),
                  [](const Moments& m) { return m.IsFinite(); })) {
    return;
  }
  if (stream) StreamFence();  // Before plain stores over the streamed ones.
  const int64_t size = ElementSize(dtype);
  const int64_t channels = layout.channels;
  for (int64_t r = block.r0; r < block.r1; ++r) {
    const int64_t begin = r * channels + block.c0;
    ChannelAffineWrite(dtype, static_cast<const char*>(x) + begin * size,
                       static_cast<char*>(y) + begin * size, begin,
                       begin + block.width(), channels, /*inner=*/1,
                       /*period=*/channels, a, b, c, {});
  }
}

}  // namespace normd
#endif  // HWY_ONCE
