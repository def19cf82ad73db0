#include "server/core/moments.h"

#include <tbb/blocked_range.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

#include "server/core/half.h"
#include "server/core/half_avx512.h"
#include "server/core/parallel.h"
#include "server/core/simd.h"
#include "server/core/simd/block_moments.h"
#include "server/core/simd/fold.h"

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined_* placeholders (GCC bug 105593), in either form.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace normd {
namespace {

// Rows the channels-last passes average for their shifts.
constexpr int64_t kShiftSample = 32;
// Short rows (attention heads, small hidden sizes): ShortRowMoments16 takes
// rows of up to kShortBlock values, a multiple of kShortLanes.
constexpr int64_t kShortBlock = 128;
constexpr int kShortLanes = 16;

using fold::Corrected;
using fold::FoldHalves;
using fold::NeedsExactPath;
using fold::SumLanes;

// How the channel reductions read their elements: fp32 / fp64 as stored,
// 16-bit bits widened to fp32 (exactly) as they are loaded, so that the
// moments of a 16-bit tensor are those of its fp32 widening, bit for bit.
template <typename T>
struct Stored {
  using Storage = T;
  using Value = T;
  NORMD_INLINE_INTO_CLONES static T Load(T v) { return v; }
};
template <float (*kWiden)(uint16_t)>
struct Widening {
  using Storage = uint16_t;
  using Value = float;
  NORMD_INLINE_INTO_CLONES static float Load(uint16_t v) { return kWiden(v); }
};
using BFloat16Values = Widening<BFloat16ToFloat>;
using Float16Values = Widening<Float16ToFloat>;

#ifdef NORMD_HALF_AVX512
// x - shift for vector number v of a step: a subtraction for even v, a fused
// multiply-add x * 1 - shift for odd v, which rounds the same exact value
// once, as the subtraction does: the same bits. The shifted-sum loops do a
// subtraction, an addition and a fused multiply-add per vector; on Zen 4
// additions and multiply-adds issue on separate pipes, and moving half the
// subtractions to the multiply-add pipe balances them.
[[gnu::target("avx512f")]] inline __m512 ShiftedLanes(__m512 x, __m512 shift,
                                                      int v) {
  if (v % 2 == 0) return _mm512_sub_ps(x, shift);
  const __m512 negated_shift = _mm512_castsi512_ps(_mm512_xor_si512(
      _mm512_castps_si512(shift), _mm512_set1_epi32(INT32_MIN)));
  return _mm512_fmadd_ps(x, _mm512_set1_ps(1.0f), negated_shift);
}

// FoldHalves<8> of the lanes of v: lanes 0-3 += 4-7, then 0-1 += 2-3, then
// 0 += 1.
[[gnu::target("avx512f")]] inline double FoldLanes(__m512d v) {
  const __m256d quarter =
      _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd(v, 1));
  const __m128d half = _mm_add_pd(_mm256_castpd256_pd128(quarter),
                                  _mm256_extractf128_pd(quarter, 1));
  return _mm_cvtsd_f64(_mm_add_sd(half, _mm_unpackhi_pd(half, half)));
}

// One level of a fold across vectors: out[i] = the 128-bit quarters of
// in[2i] and in[2i + 1] that kLow picks (vshuff: two from each) plus those
// that kHigh picks, for fp32 or fp64 lanes.
[[gnu::target("avx512f")]] inline __m512 AddLanes(__m512 a, __m512 b) {
  return _mm512_add_ps(a, b);
}
[[gnu::target("avx512f")]] inline __m512d AddLanes(__m512d a, __m512d b) {
  return _mm512_add_pd(a, b);
}
template <int kPick>
[[gnu::target("avx512f")]] inline __m512 PickQuarters(__m512 a, __m512 b) {
  return _mm512_shuffle_f32x4(a, b, kPick);
}
template <int kPick>
[[gnu::target("avx512f")]] inline __m512d PickQuarters(__m512d a, __m512d b) {
  return _mm512_shuffle_f64x2(a, b, kPick);
}
template <int kLow, int kHigh, typename V, int N>
[[gnu::target("avx512f")]] inline void AddQuarterPairs(const V (&in)[N],
                                                       V (&out)[N / 2]) {
  for (int i = 0; i < N / 2; ++i) {
    out[i] = AddLanes(PickQuarters<kLow>(in[2 * i], in[2 * i + 1]),
                      PickQuarters<kHigh>(in[2 * i], in[2 * i + 1]));
  }
}

// FoldHalves<16> of each of 16 vectors at once: lane k of the result is
// vector k's lanes folded as FoldHalves<16> folds them (the same additions:
// 0-7 += 8-15, 0-3 += 4-7, 0-1 += 2-3, 0 += 1), each level adding the lower
// and upper halves of two vectors' live lanes gathered by one shuffle each.
[[gnu::target("avx512f")]] inline __m512 FoldSixteenVectors(
    const __m512 (&v)[16]) {
  __m512 c[8];  // Vector i: rows 2i (lanes 0-7) and 2i + 1 (8-15).
  AddQuarterPairs<0x44, 0xEE>(v, c);
  __m512 e[4];  // Quarter q of vector m: row 4m + q.
  AddQuarterPairs<0x88, 0xDD>(c, e);
  __m512 g[2];  // Quarter q of vector p: rows 8p + q (lanes 0-1), 8p + 4 + q.
  for (int p = 0; p < 2; ++p) {
    g[p] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * p], e[2 * p + 1], 0x44),
                         _mm512_shuffle_ps(e[2 * p], e[2 * p + 1], 0xEE));
  }
  // Lane 4q + r: row 4r + q; put back in row order.
  const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], 0x88),
                                 _mm512_shuffle_ps(g[0], g[1], 0xDD));
  alignas(64) static constexpr int32_t kRowOrder[16] = {
      0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
  return _mm512_permutexvar_ps(_mm512_load_si512(kRowOrder), t);
}

// std::isfinite of each lane: |a| < infinity (false for NaN).
[[gnu::target("avx512f")]] inline __mmask8 FiniteLanes(__m512d a) {
  const __m512d magnitude = _mm512_castsi512_pd(
      _mm512_and_si512(_mm512_castpd_si512(a), _mm512_set1_epi64(INT64_MAX)));
  return _mm512_cmp_pd_mask(
      magnitude, _mm512_set1_pd(std::numeric_limits<double>::infinity()),
      _CMP_LT_OQ);
}

// SumWidenedLanes of each of 16 vectors at once: out[h] lane r is vector
// 8 h + r's.
[[gnu::target("avx512f")]] inline void SumWidenedSixteenVectors(
    const __m512 (&v)[16], __m512d (&out)[2]) {
  __m512d a[16];  // Row k: its lanes 0-7 += 8-15, in fp64.
  for (int k = 0; k < 16; ++k) {
    a[k] =
        _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v[k])),
                      _mm512_cvtps_pd(_mm256_castpd_ps(
                          _mm512_extractf64x4_pd(_mm512_castps_pd(v[k]), 1))));
  }
  __m512d c[8];  // Vector i: rows 2i (lanes 0-3) and 2i + 1 (4-7).
  AddQuarterPairs<0x44, 0xEE>(a, c);
  __m512d e[4];  // Quarter q of vector m: row 4m + q.
  AddQuarterPairs<0x88, 0xDD>(c, e);
  // Lane 2q + h of vector p: row 8p + 4h + q; put back in row order.
  alignas(64) static constexpr int64_t kRowOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  const __m512i order = _mm512_load_si512(kRowOrder);
  for (int p = 0; p < 2; ++p) {
    const __m512d t = _mm512_add_pd(_mm512_unpacklo_pd(e[2 * p], e[2 * p + 1]),
                                    _mm512_unpackhi_pd(e[2 * p], e[2 * p + 1]));
    out[p] = _mm512_permutexvar_pd(order, t);
  }
}

// FloatBlockMoments (simd/block_moments.h) of 16 short rows at once (see
// ShortRowMoments16).
[[gnu::target("avx512f")]] void ShortRowMomentsAvx512(const float* x, int64_t n,
                                                      int count, Moments* out) {
  const float* rows[16];
  for (int k = 0; k < 16; ++k) rows[k] = x + std::min(k, count - 1) * n;
  __m512 v[16];
  for (int k = 0; k < 16; ++k) {
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += kShortLanes) {
      sum = _mm512_add_ps(sum, _mm512_loadu_ps(rows[k] + i));
    }
    v[k] = sum;
  }
  alignas(64) float centers[16];
  _mm512_store_ps(centers,
                  _mm512_div_ps(FoldSixteenVectors(v),
                                _mm512_set1_ps(static_cast<float>(n))));
  __m512 sq[16];
  for (int k = 0; k < 16; ++k) {
    const __m512 shift = _mm512_set1_ps(centers[k]);
    __m512 dev = _mm512_setzero_ps();
    __m512 squares = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += kShortLanes) {
      const __m512 d = ShiftedLanes(_mm512_loadu_ps(rows[k] + i), shift,
                                    static_cast<int>(i / kShortLanes));
      dev = _mm512_add_ps(dev, d);
      squares = _mm512_fmadd_ps(d, d, squares);
    }
    v[k] = dev;
    sq[k] = squares;
  }
  __m512d devs[2];
  __m512d sqs[2];
  SumWidenedSixteenVectors(v, devs);
  SumWidenedSixteenVectors(sq, sqs);
  // FinishFastBlock (no tail) of the 16 rows in fp64 vectors: Corrected,
  // then NeedsExactPath; the same operations, so the same bits.
  const __m512d zero = _mm512_setzero_pd();
  const __m512d count_n = _mm512_set1_pd(static_cast<double>(n));
  const __m512d nan = _mm512_set1_pd(std::numeric_limits<double>::quiet_NaN());
  auto finite = FiniteLanes;
  alignas(64) double means[16];
  alignas(64) double m2s[16];
  unsigned exact = 0;
  for (int h = 0; h < 2; ++h) {
    const __m512d mean0 = _mm512_cvtps_pd(h == 0 ? _mm256_load_ps(centers)
                                                 : _mm256_load_ps(centers + 8));
    const __m512d residual = _mm512_add_pd(devs[h], zero);
    const __m512d squares = _mm512_add_pd(sqs[h], zero);
    __m512d mean = _mm512_add_pd(mean0, _mm512_div_pd(residual, count_n));
    __m512d m2 = _mm512_max_pd(
        _mm512_sub_pd(
            squares, _mm512_div_pd(_mm512_mul_pd(residual, residual), count_n)),
        zero);
    const __mmask8 marked = ~(finite(mean0) & finite(squares));
    mean = _mm512_mask_mov_pd(mean, marked, nan);
    m2 = _mm512_mask_mov_pd(m2, marked, nan);
    const __mmask8 needs =
        ~(finite(mean) & finite(m2)) |
        _mm512_cmp_pd_mask(m2, _mm512_mul_pd(_mm512_set1_pd(1e-30), count_n),
                           _CMP_LT_OQ) |
        _mm512_cmp_pd_mask(
            _mm512_mul_pd(m2, _mm512_set1_pd(fold::kMaxCancellation)), squares,
            _CMP_LT_OQ);
    exact |= static_cast<unsigned>(needs) << (8 * h);
    _mm512_store_pd(means + 8 * h, mean);
    _mm512_store_pd(m2s + 8 * h, m2);
  }
  for (int k = 0; k < count; ++k) {
    if ((exact >> k) & 1) {
      out[k] = ExactFloatBlockMoments(rows[k], n);
    } else {
      out[k] = Moments{n, means[k], m2s[k]};
    }
  }
}

#endif  // NORMD_HALF_AVX512

// ContiguousMoments' block of x[0..n), n <= kMomentsBlock.
Moments BlockMoments(const float* x, int64_t n) {
  return FloatBlockMoments(x, n);
}
Moments BlockMoments(const double* x, int64_t n) {
  return DoubleBlockMoments(x, n);
}

Moments FoldInOrder(const Moments* parts, int64_t count, int64_t stride) {
  Moments total;
  for (int64_t k = 0; k < count; ++k) MergeMoments(total, parts[k * stride]);
  return total;
}

// Channel moments when each channel's values come in contiguous runs of at
// least kMinRun (e.g. NCHW): one ContiguousMoments per (outer, channel) run,
// folded over outer in order.
template <typename T>
std::vector<Moments> ChannelMomentsLongRuns(const T* x,
                                            const ChannelLayout& layout) {
  const int64_t runs = layout.outer * layout.channels;
  std::vector<Moments> per_run(runs);
  ParallelFor(tbb::blocked_range<int64_t>(0, runs), layout.NumElements(),
              [&](const tbb::blocked_range<int64_t>& range) {
                for (int64_t r = range.begin(); r < range.end(); ++r) {
                  per_run[r] =
                      ContiguousMoments(x + r * layout.inner, layout.inner);
                }
              });
  std::vector<Moments> result(layout.channels);
  ParallelFor(tbb::blocked_range<int64_t>(0, layout.channels), runs * 4,
              [&](const tbb::blocked_range<int64_t>& range) {
                for (int64_t c = range.begin(); c < range.end(); ++c) {
                  result[c] = FoldInOrder(per_run.data() + c, layout.outer,
                                          layout.channels);
                }
              });
  return result;
}

// ChannelMomentsLongRuns of a 16-bit tensor, as of its fp32 widening: each
// run in ContiguousMoments' blocks, widened a block at a time into a
// per-task buffer; the blocks of all runs in parallel, folded in order.
std::vector<Moments> HalfChannelMomentsLongRuns(DType dtype, const uint16_t* x,
                                                const ChannelLayout& layout) {
  const int64_t runs = layout.outer * layout.channels;
  const int64_t per_run = (layout.inner + kMomentsBlock - 1) / kMomentsBlock;
  std::vector<Moments> per_block(runs * per_run);
  ParallelFor(
      tbb::blocked_range<int64_t>(0, runs * per_run), layout.NumElements(),
      [&](const tbb::blocked_range<int64_t>& range) {
        thread_local std::vector<float> buffer(kMomentsBlock);
        for (int64_t i = range.begin(); i < range.end(); ++i) {
          const int64_t begin = (i % per_run) * kMomentsBlock;
          per_block[i] = HalfBlockMoments(
              dtype, x + (i / per_run) * layout.inner + begin, buffer.data(),
              std::min(kMomentsBlock, layout.inner - begin),
              /*store_widened=*/false);
        }
      });
  std::vector<Moments> result(layout.channels);
  for (int64_t c = 0; c < layout.channels; ++c) {
    for (int64_t o = 0; o < layout.outer; ++o) {
      MergeMoments(
          result[c],
          FoldInOrder(per_block.data() + (o * layout.channels + c) * per_run,
                      per_run, 1));
    }
  }
  return result;
}

// A block of a short-run layout: channels [c0, c1) over rows [r0, r1).
struct RowBlock {
  int64_t c0, c1, r0, r1;
  int64_t width() const { return c1 - c0; }
};

// Per-task scratch for row blocks of up to `width` channels.
struct RowScratch {
  explicit RowScratch(int64_t width) : wide(3 * width) {}
  std::vector<double> wide;
};

// What a channels-last tile does as it loads its rows: nothing, or steps
// an InterleavedWork every kInterleaveRows rows (of kTile values): 4 KiB of
// fp32 (2 KiB of 16-bit) values. In kernel_bench BM_GroupNorm NHWC, 8 or 16
// rows measure alike; 4 or fewer lose to the calls (each also spills the
// tile's registers), 32 or more lose the overlap.
struct NoInterleave {
  void Row() {}
};
constexpr int kInterleaveRows = 16;
struct StepInterleave {
  void Row() {
    if (++rows == kInterleaveRows) {
      rows = 0;
      work->Step(kInterleaveRows * kTileValues);
    }
  }
  static constexpr int64_t kTileValues = 64;
  InterleavedWork* work;
  int rows = 0;
};

// Channels-last (inner == 1) shifted sums of fp32 data for kTile consecutive
// channels starting at `c`, over rows [r0, r1), with the accumulators held in
// registers across rows: the shift of each channel is the fp32-rounded mean
// of its first kShiftSample rows; one pass accumulates d = x - shift and d^2
// in fp32, flushed into fp64 every kTileFlush rows. Writes the shifts, S1 and
// S2 (RowBlockMoments checks them with NeedsExactPath). side.Row() after
// each row of the pass.
constexpr int kTile = 64;
static_assert(StepInterleave::kTileValues == kTile);
// 16 rows per flush, as many values per lane as the contiguous blocks'
// (simd/block_moments.h: 1024 values over 64 lanes): with 32, the spec's
// accuracy data (1e4 + N(0,1)) came out with a relative variance error
// of 2.1e-7 at any count per channel (the bar is 1e-7; 4e-8 with 16).
constexpr int64_t kTileFlush = 16;

// The shifts of `channels` channels-last channels starting at `c` over rows
// [r0, r1): the fp32 mean of each one's first kShiftSample rows. The shift
// need only be near the mean: fp32 sums suffice (an overflow gives a
// non-finite shift, which NeedsExactPath catches). Inlined, with a constant
// `channels` in the tiles.
template <typename E>
NORMD_INLINE_INTO_CLONES void ChannelsLastShifts(
    const typename E::Storage* __restrict x, int64_t row_stride, int64_t c,
    int64_t channels, int64_t r0, int64_t r1, float* __restrict center) {
  const int64_t sample_end = std::min(r1, r0 + kShiftSample);
  for (int64_t j = 0; j < channels; ++j) center[j] = 0.0f;
  for (int64_t r = r0; r < sample_end; ++r) {
    const auto* __restrict row = x + r * row_stride + c;
    for (int64_t j = 0; j < channels; ++j) center[j] += E::Load(row[j]);
  }
  const float inverse = 1.0f / static_cast<float>(sample_end - r0);
  for (int64_t j = 0; j < channels; ++j) center[j] *= inverse;
}

template <typename E, typename Side>
NORMD_INLINE_INTO_CLONES void ChannelsLastTile(
    const typename E::Storage* __restrict x, int64_t row_stride, int64_t c,
    int64_t r0, int64_t r1, double* __restrict center_out,
    double* __restrict dev_out, double* __restrict sq_out, Side& side) {
  float center[kTile];
  ChannelsLastShifts<E>(x, row_stride, c, kTile, r0, r1, center);
  double dev[kTile] = {};
  double sq[kTile] = {};
  for (int64_t f = r0; f < r1; f += kTileFlush) {
    const int64_t f_end = std::min(r1, f + kTileFlush);
    float dev_acc[kTile] = {};
    float sq_acc[kTile] = {};
    for (int64_t r = f; r < f_end; ++r) {
      const auto* __restrict row = x + r * row_stride + c;
      for (int j = 0; j < kTile; ++j) {
        const float d = E::Load(row[j]) - center[j];
        dev_acc[j] += d;
        sq_acc[j] = std::fma(d, d, sq_acc[j]);
      }
      side.Row();
    }
    for (int j = 0; j < kTile; ++j) {
      dev[j] += static_cast<double>(dev_acc[j]);
      sq[j] += static_cast<double>(sq_acc[j]);
    }
  }
  for (int j = 0; j < kTile; ++j) {
    center_out[j] = static_cast<double>(center[j]);
    dev_out[j] = dev[j];
    sq_out[j] = sq[j];
  }
}

// Rows-first passes over channels-last blocks that would take two tiles or
// more (register tiles and NarrowChannelsLastTiles of 32, 16, .., 1
// channels). Tile after tile, each reading a few lines of every row, runs
// several times slower than one stream of the same bytes (shape_survey's
// channels-last BatchNorm training with 256 channels); reading each row
// whole, with
// the tiles' lanes in arrays, reads memory in order.
constexpr int kRowsFirstPasses = 2;
// The widest such block: ChannelMomentsShortRuns' channels-last ranges.
constexpr int64_t kMaxRowWidth = 1024;
// How far ahead of the row being summed a rows-first pass prefetches into L2:
// the hardware's own prefetch falls behind at 1 KiB rows (shape_survey's
// channels-last BatchNorm training with 256 channels).
constexpr int64_t kRowsPrefetchBytes = 64 << 10;

// Prefetches `bytes` of the row `rows_ahead` rows past `row` (row number
// `r`) into L2, if that row is before row `limit`.
NORMD_INLINE_INTO_CLONES void PrefetchRowAhead(const void* row,
                                               int64_t row_bytes, int64_t r,
                                               int64_t rows_ahead,
                                               int64_t limit, int64_t bytes) {
  if (r + rows_ahead >= limit) return;
  const char* ahead = static_cast<const char*>(row) + rows_ahead * row_bytes;
  for (int64_t line = 0; line < bytes; line += 64) {
    __builtin_prefetch(ahead + line, 0, 2);
  }
}

// Rows past the current one that PrefetchRowAhead looks for rows of
// `row_bytes`.
inline int64_t RowsAhead(int64_t row_bytes) {
  return std::max<int64_t>(1, kRowsPrefetchBytes / row_bytes);
}

// A narrow tile's results: channel j's shift, and its S1 and S2 as the sums
// in order of its `pack` lanes (lane s * width + j).
NORMD_INLINE_INTO_CLONES void FoldNarrowLanes(const float* center,
                                              const double* dev,
                                              const double* sq, int width,
                                              int pack, double* center_out,
                                              double* dev_out, double* sq_out) {
  for (int j = 0; j < width; ++j) {
    double dev_sum = 0.0;
    double sq_sum = 0.0;
    for (int k = 0; k < pack; ++k) {
      dev_sum += dev[k * width + j];
      sq_sum += sq[k * width + j];
    }
    center_out[j] = static_cast<double>(center[j]);
    dev_out[j] = dev_sum;
    sq_out[j] = sq_sum;
  }
}

// One NarrowChannelsLastTile (`width` = 32, 16, .., 1 channels from `c`)
// fed a row at a time: the same lanes (lane s * width + j: channel j of the
// rows s, s + pack, .. of each flush group of kTileFlush * pack rows), the
// same shifts and flushes, so the same bits.
struct NarrowRowLanes {
  int64_t c = 0;
  int width = 0;
  int pack = 0;  // kTile / width rows a step (a power of 2).
  int rows = 0;  // Rows of the current flush group so far.
  float center[kTile / 2];
  float dev_acc[kTile];
  float sq_acc[kTile];
  double dev[kTile];
  double sq[kTile];

  template <typename E>
  NORMD_INLINE_INTO_CLONES void Begin(const typename E::Storage* x,
                                      int64_t row_stride, int64_t first, int w,
                                      int64_t r0, int64_t r1) {
    c = first;
    width = w;
    pack = static_cast<int>(kTile) / w;
    ChannelsLastShifts<E>(x, row_stride, c, w, r0, r1, center);
    for (int l = 0; l < kTile; ++l) {
      dev_acc[l] = sq_acc[l] = 0.0f;
      dev[l] = sq[l] = 0.0;
    }
  }
  // `row`: the whole row's first element.
  template <typename E>
  NORMD_INLINE_INTO_CLONES void Row(const typename E::Storage* __restrict row) {
    // Row s of a step goes to lanes s * width + j.
    const int lane = (rows & (pack - 1)) * width;
    for (int j = 0; j < width; ++j) {
      const float d = E::Load(row[c + j]) - center[j];
      dev_acc[lane + j] += d;
      sq_acc[lane + j] = std::fma(d, d, sq_acc[lane + j]);
    }
    if (++rows == kTileFlush * pack) Flush();
  }
  NORMD_INLINE_INTO_CLONES void Flush() {
    for (int l = 0; l < kTile; ++l) {
      dev[l] += static_cast<double>(dev_acc[l]);
      sq[l] += static_cast<double>(sq_acc[l]);
      dev_acc[l] = sq_acc[l] = 0.0f;
    }
    rows = 0;
  }
  // After the last row: the block's shifts, S1 and S2 of the channels.
  NORMD_INLINE_INTO_CLONES void Finish(double* center_out, double* dev_out,
                                       double* sq_out) {
    if (rows > 0) Flush();
    FoldNarrowLanes(center, dev, sq, width, pack, center_out, dev_out, sq_out);
  }
};

// The channels past the whole tiles of a rows-first block, `count` < kTile
// from `c`, as NarrowChannelsLastTiles splits them: a NarrowRowLanes for each
// of 32, 16, .., 1 in turn that fits.
struct NarrowRows {
  NarrowRowLanes lanes[6];
  int used = 0;

  template <typename E>
  NORMD_INLINE_INTO_CLONES void Begin(const typename E::Storage* x,
                                      int64_t row_stride, int64_t c,
                                      int64_t count, int64_t r0, int64_t r1) {
    used = 0;
    int64_t done = 0;
    for (int w = kTile / 2; w >= 1; w /= 2) {
      if (count - done >= w) {
        lanes[used++].Begin<E>(x, row_stride, c + done, w, r0, r1);
        done += w;
      }
    }
  }
  template <typename E>
  NORMD_INLINE_INTO_CLONES void Row(const typename E::Storage* row) {
    for (int i = 0; i < used; ++i) lanes[i].Row<E>(row);
  }
  // Results of channel c + i at center / dev / sq [i].
  NORMD_INLINE_INTO_CLONES void Finish(double* center, double* dev,
                                       double* sq) {
    int64_t done = 0;
    for (int i = 0; i < used; ++i) {
      lanes[i].Finish(center + done, dev + done, sq + done);
      done += lanes[i].width;
    }
  }
};

// Whether a channels-last block of `width` channels goes rows first: it
// would take kRowsFirstPasses tiles or more.
inline bool RowsFirst(int64_t width) {
  const int64_t narrow = width % kTile;
  return width / kTile + std::popcount(static_cast<uint64_t>(narrow)) >=
         kRowsFirstPasses;
}

// ChannelsLastTile for `width` (at most kMaxRowWidth) consecutive channels
// starting at `c`, rows first: the whole tiles' lanes in arrays, the rest in
// NarrowRows; every lane does what its tile's would, in the same order (the
// same shift from the same rows, the same flushes), so the same bits. Rows
// before `rows_end` (the layout's) are prefetched.
template <typename E>
NORMD_INLINE_INTO_CLONES void ChannelsLastRows(
    const typename E::Storage* __restrict x, int64_t row_stride, int64_t c,
    int64_t width, int64_t r0, int64_t r1, int64_t rows_end,
    double* __restrict center_out, double* __restrict dev_out,
    double* __restrict sq_out) {
  alignas(64) float center[kMaxRowWidth];
  alignas(64) float dev_acc[kMaxRowWidth];
  alignas(64) float sq_acc[kMaxRowWidth];
  const int64_t tiled = width / kTile * kTile;
  NarrowRows narrow;
  narrow.Begin<E>(x, row_stride, c + tiled, width - tiled, r0, r1);
  ChannelsLastShifts<E>(x, row_stride, c, tiled, r0, r1, center);
  for (int64_t j = 0; j < tiled; ++j) dev_out[j] = sq_out[j] = 0.0;
  const int64_t row_bytes = row_stride * int64_t{sizeof(*x)};
  const int64_t ahead = RowsAhead(row_bytes);
  for (int64_t f = r0; f < r1; f += kTileFlush) {
    const int64_t f_end = std::min(r1, f + kTileFlush);
    for (int64_t j = 0; j < tiled; ++j) dev_acc[j] = sq_acc[j] = 0.0f;
    for (int64_t r = f; r < f_end; ++r) {
      const auto* __restrict row = x + r * row_stride + c;
      PrefetchRowAhead(row, row_bytes, r, ahead, rows_end,
                       width * int64_t{sizeof(*x)});
      for (int64_t j = 0; j < tiled; ++j) {
        const float d = E::Load(row[j]) - center[j];
        dev_acc[j] += d;
        sq_acc[j] = std::fma(d, d, sq_acc[j]);
      }
      narrow.Row<E>(x + r * row_stride);
    }
    for (int64_t j = 0; j < tiled; ++j) {
      dev_out[j] += static_cast<double>(dev_acc[j]);
      sq_out[j] += static_cast<double>(sq_acc[j]);
    }
  }
  for (int64_t j = 0; j < tiled; ++j) {
    center_out[j] = static_cast<double>(center[j]);
  }
  narrow.Finish(center_out + tiled, dev_out + tiled, sq_out + tiled);
}

// Adds rows [from, from + count) (count <= kPack) of kWidth channels at
// `c` into NarrowChannelsLastTile's lanes (lane s * kWidth + j: row
// from + s, channel c + j). A function, not a lambda, so that it is
// inlined into the caller's clone (see NarrowChannelsLastTilesFrom).
template <typename E, int kWidth, int kPack>
NORMD_INLINE_INTO_CLONES void NarrowTileRows(
    const typename E::Storage* __restrict x, int64_t row_stride, int64_t c,
    int64_t from, const float* __restrict lane_center,
    float* __restrict dev_acc, float* __restrict sq_acc,
    int64_t count = kPack) {
  for (int64_t s = 0; s < count; ++s) {
    const auto* __restrict row = x + (from + s) * row_stride + c;
    for (int j = 0; j < kWidth; ++j) {
      const int64_t l = s * kWidth + j;
      const float d = E::Load(row[j]) - lane_center[l];
      dev_acc[l] += d;
      sq_acc[l] = std::fma(d, d, sq_acc[l]);
    }
  }
}

// ChannelsLastTile for kWidth (32, 16, .., 1) consecutive channels starting
// at `c`, the channels past the last whole tile: its kTile fp32 lanes hold
// kTile / kWidth rows at a time (lane l: row l / kWidth of the step,
// channel l % kWidth), each channel's shift (the fp32 mean of its first
// kShiftSample rows) in all of its lanes, flushed into fp64 every
// kTileFlush steps (as many values per lane as the tile's), and a
// channel's lanes added in order at the end. The generic fp64 loops these
// replace read the block twice at a few values per cycle, a fraction of
// copy bandwidth (shape_survey's channels-last GroupNorm with 16
// channels).
template <typename E, int kWidth>
NORMD_INLINE_INTO_CLONES void NarrowChannelsLastTile(
    const typename E::Storage* __restrict x, int64_t row_stride, int64_t c,
    int64_t r0, int64_t r1, double* __restrict center_out,
    double* __restrict dev_out, double* __restrict sq_out) {
  static_assert(kTile % kWidth == 0);
  constexpr int kPack = kTile / kWidth;
  float center[kWidth];
  ChannelsLastShifts<E>(x, row_stride, c, kWidth, r0, r1, center);
  float lane_center[kTile];
  for (int l = 0; l < kTile; ++l) lane_center[l] = center[l % kWidth];
  double dev[kTile] = {};
  double sq[kTile] = {};
  for (int64_t f = r0; f < r1; f += kTileFlush * kPack) {
    const int64_t f_end = std::min(r1, f + kTileFlush * kPack);
    float dev_acc[kTile] = {};
    float sq_acc[kTile] = {};
    int64_t r = f;
    for (; r + kPack <= f_end; r += kPack) {
      NarrowTileRows<E, kWidth, kPack>(x, row_stride, c, r, lane_center,
                                       dev_acc, sq_acc);
    }
    // The block's last rows (fewer than kPack).
    NarrowTileRows<E, kWidth, kPack>(x, row_stride, c, r, lane_center, dev_acc,
                                     sq_acc, f_end - r);
    for (int l = 0; l < kTile; ++l) {
      dev[l] += static_cast<double>(dev_acc[l]);
      sq[l] += static_cast<double>(sq_acc[l]);
    }
  }
  FoldNarrowLanes(center, dev, sq, kWidth, kPack, center_out, dev_out, sq_out);
}

// NarrowChannelsLastTile<E, kWidth> for channels [c + done, ..) if at
// least kWidth of the `count` remain, then the narrower widths. Plain
// inlined calls, not a lambda: a lambda's body is compiled for the default
// target, outside the caller's clone (baseline x86-64: a libm call per
// fused multiply-add).
template <typename E, int kWidth>
NORMD_INLINE_INTO_CLONES void NarrowChannelsLastTilesFrom(
    const typename E::Storage* x, int64_t row_stride, int64_t c, int64_t count,
    int64_t done, int64_t r0, int64_t r1, double* center, double* dev,
    double* sq) {
  if (count - done >= kWidth) {
    NarrowChannelsLastTile<E, kWidth>(x, row_stride, c + done, r0, r1,
                                      center + done, dev + done, sq + done);
    done += kWidth;
  }
  if constexpr (kWidth > 1) {
    NarrowChannelsLastTilesFrom<E, kWidth / 2>(x, row_stride, c, count, done,
                                               r0, r1, center, dev, sq);
  }
}

// Channels [c, c + count) (count < kTile) of a channels-last row block in
// NarrowChannelsLastTiles of 32, 16, .., 1 channels; their shifts, S1 and
// S2 into center / dev / sq [0, count).
template <typename E>
NORMD_INLINE_INTO_CLONES void NarrowChannelsLastTiles(
    const typename E::Storage* x, int64_t row_stride, int64_t c, int64_t count,
    int64_t r0, int64_t r1, double* center, double* dev, double* sq) {
  NarrowChannelsLastTilesFrom<E, kTile / 2>(x, row_stride, c, count, 0, r0, r1,
                                            center, dev, sq);
}

#ifdef NORMD_HALF_AVX512
// One tile row (kTile 16-bit values at `row`) as fp32 vectors: float16 16
// channels per register in order; bfloat16 as two BFloat16Pairs (register
// 0: channels 0, 2, .., 30; 1: 1, 3, .., 31; 2 and 3 the same for 32..63).
template <bool kBFloat16>
[[gnu::target("avx512f,avx512bw")]] inline void LoadHalfTileRow(
    const uint16_t* row, __m512* f) {
  if constexpr (kBFloat16) {
    for (int h = 0; h < 2; ++h) {
      const BFloat16Pair p =
          WidenBFloat16Pair(_mm512_loadu_si512(row + 32 * h));
      f[2 * h] = p.even;
      f[2 * h + 1] = p.odd;
    }
  } else {
    for (int v = 0; v < 4; ++v) {
      f[v] = FloatsOfFloat16x16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row) + v));
    }
  }
}

// A 16-bit tile's shifts (4 registers in LoadHalfTileRow's lane order) and
// fp64 sums (8 registers: lanes 0-7 of fp32 register v in [2 v], 8-15 in
// [2 v + 1]) into center / dev / sq [0, kTile) in channel order.
template <bool kBFloat16>
[[gnu::target("avx512f")]] inline void StoreHalfTileLanes(
    const __m512* center, const __m512d* dev, const __m512d* sq,
    double* center_out, double* dev_out, double* sq_out) {
  alignas(64) float centers[kTile];
  alignas(64) double devs[kTile], squares[kTile];
  for (int v = 0; v < 4; ++v) _mm512_store_ps(centers + 16 * v, center[v]);
  for (int w = 0; w < 8; ++w) {
    _mm512_store_pd(devs + 8 * w, dev[w]);
    _mm512_store_pd(squares + 8 * w, sq[w]);
  }
  for (int v = 0; v < 4; ++v) {
    for (int e = 0; e < 16; ++e) {
      const int channel = kBFloat16 ? 32 * (v / 2) + 2 * e + v % 2 : 16 * v + e;
      center_out[channel] = static_cast<double>(centers[16 * v + e]);
      dev_out[channel] = devs[16 * v + e];
      sq_out[channel] = squares[16 * v + e];
    }
  }
}

// ChannelsLastTile<BFloat16Values> / <Float16Values> (the same bits) in
// registers. float16 rows convert 16 channels per register in order;
// bfloat16 rows load as two BFloat16Pairs: register 0 holds channels 0, 2,
// .., 30 of the tile, 1 channels 1, 3, .., 31, 2 and 3 the same for 32..63.
// Each lane does what the generic loop does for its channel, and the results
// are put back in channel order at the end.
template <bool kBFloat16, typename Side>
[[gnu::target("avx512f,avx512bw")]] void HalfChannelsLastTileAvx512(
    const uint16_t* x, int64_t row_stride, int64_t c, int64_t r0, int64_t r1,
    double* center_out, double* dev_out, double* sq_out, Side& side) {
  static_assert(kTile == 64);
  auto load = [&](int64_t r, __m512 * f)
      __attribute__((target("avx512f,avx512bw"))) {
    LoadHalfTileRow<kBFloat16>(x + r * row_stride + c, f);
  };
  const int64_t sample_end = std::min(r1, r0 + kShiftSample);
  __m512 center[4];
  for (int v = 0; v < 4; ++v) center[v] = _mm512_setzero_ps();
  for (int64_t r = r0; r < sample_end; ++r) {
    __m512 f[4];
    load(r, f);
    for (int v = 0; v < 4; ++v) center[v] = _mm512_add_ps(center[v], f[v]);
  }
  const __m512 inverse =
      _mm512_set1_ps(1.0f / static_cast<float>(sample_end - r0));
  for (int v = 0; v < 4; ++v) center[v] = _mm512_mul_ps(center[v], inverse);
  __m512d dev[8], sq[8];
  for (int w = 0; w < 8; ++w) dev[w] = sq[w] = _mm512_setzero_pd();
  for (int64_t f0 = r0; f0 < r1; f0 += kTileFlush) {
    const int64_t f_end = std::min(r1, f0 + kTileFlush);
    __m512 dev_acc[4], sq_acc[4];
    for (int v = 0; v < 4; ++v) dev_acc[v] = sq_acc[v] = _mm512_setzero_ps();
    for (int64_t r = f0; r < f_end; ++r) {
      __m512 f[4];
      load(r, f);
      for (int v = 0; v < 4; ++v) {
        const __m512 d = ShiftedLanes(f[v], center[v], v);
        dev_acc[v] = _mm512_add_ps(dev_acc[v], d);
        sq_acc[v] = _mm512_fmadd_ps(d, d, sq_acc[v]);
      }
      side.Row();
    }
    for (int v = 0; v < 4; ++v) {
      dev[2 * v] = _mm512_add_pd(
          dev[2 * v], _mm512_cvtps_pd(_mm512_castps512_ps256(dev_acc[v])));
      dev[2 * v + 1] =
          _mm512_add_pd(dev[2 * v + 1],
                        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(
                            _mm512_castps_pd(dev_acc[v]), 1))));
      sq[2 * v] = _mm512_add_pd(
          sq[2 * v], _mm512_cvtps_pd(_mm512_castps512_ps256(sq_acc[v])));
      sq[2 * v + 1] =
          _mm512_add_pd(sq[2 * v + 1],
                        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(
                            _mm512_castps_pd(sq_acc[v]), 1))));
    }
  }
  StoreHalfTileLanes<kBFloat16>(center, dev, sq, center_out, dev_out, sq_out);
}

// HalfChannelsLastTileAvx512 for `width` (at most kMaxRowWidth) channels,
// rows first as ChannelsLastRows: each whole tile's registers become
// entries of arrays, used in the same order, so the same bits; the rest in
// NarrowRows.
template <bool kBFloat16>
[[gnu::target("avx512f,avx512bw")]] void HalfChannelsLastRowsAvx512(
    const uint16_t* x, int64_t row_stride, int64_t c, int64_t width, int64_t r0,
    int64_t r1, int64_t rows_end, double* center_out, double* dev_out,
    double* sq_out) {
  static_assert(kTile == 64);
  using E = std::conditional_t<kBFloat16, BFloat16Values, Float16Values>;
  constexpr int kVectors = kMaxRowWidth / 16;
  const int64_t tiles = width / kTile;
  NarrowRows narrow;
  narrow.Begin<E>(x, row_stride, c + kTile * tiles, width - kTile * tiles, r0,
                  r1);
  // Vector v of tile t (16 lanes) at [4 t + v].
  auto load = [&](int64_t r, int64_t t, __m512 * f)
      __attribute__((target("avx512f,avx512bw"))) {
    LoadHalfTileRow<kBFloat16>(x + r * row_stride + c + kTile * t, f);
  };
  __m512 center[kVectors];
  __m512 dev_acc[kVectors];
  __m512 sq_acc[kVectors];
  // fp64 sums: lanes 0-7 of vector i at [2 i], 8-15 at [2 i + 1].
  __m512d dev[2 * kVectors];
  __m512d sq[2 * kVectors];
  const int64_t vectors = 4 * tiles;
  const int64_t sample_end = std::min(r1, r0 + kShiftSample);
  for (int64_t i = 0; i < vectors; ++i) center[i] = _mm512_setzero_ps();
  for (int64_t r = r0; r < sample_end; ++r) {
    for (int64_t t = 0; t < tiles; ++t) {
      __m512 f[4];
      load(r, t, f);
      for (int v = 0; v < 4; ++v) {
        center[4 * t + v] = _mm512_add_ps(center[4 * t + v], f[v]);
      }
    }
  }
  const __m512 inverse =
      _mm512_set1_ps(1.0f / static_cast<float>(sample_end - r0));
  for (int64_t i = 0; i < vectors; ++i) {
    center[i] = _mm512_mul_ps(center[i], inverse);
  }
  for (int64_t w = 0; w < 2 * vectors; ++w)
    dev[w] = sq[w] = _mm512_setzero_pd();
  const int64_t row_bytes = row_stride * int64_t{sizeof(uint16_t)};
  const int64_t ahead = RowsAhead(row_bytes);
  for (int64_t f0 = r0; f0 < r1; f0 += kTileFlush) {
    const int64_t f_end = std::min(r1, f0 + kTileFlush);
    for (int64_t i = 0; i < vectors; ++i) {
      dev_acc[i] = sq_acc[i] = _mm512_setzero_ps();
    }
    for (int64_t r = f0; r < f_end; ++r) {
      PrefetchRowAhead(x + r * row_stride + c, row_bytes, r, ahead, rows_end,
                       width * int64_t{sizeof(uint16_t)});
      for (int64_t t = 0; t < tiles; ++t) {
        __m512 f[4];
        load(r, t, f);
        for (int v = 0; v < 4; ++v) {
          const int64_t i = 4 * t + v;
          const __m512 d = ShiftedLanes(f[v], center[i], v);
          dev_acc[i] = _mm512_add_ps(dev_acc[i], d);
          sq_acc[i] = _mm512_fmadd_ps(d, d, sq_acc[i]);
        }
      }
      narrow.Row<E>(x + r * row_stride);
    }
    for (int64_t i = 0; i < vectors; ++i) {
      auto widen_add = [](__m512d & low, __m512d & high, __m512 v)
          __attribute__((target("avx512f"))) {
        low = _mm512_add_pd(low, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        high = _mm512_add_pd(
            high, _mm512_cvtps_pd(_mm256_castpd_ps(
                      _mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
      };
      widen_add(dev[2 * i], dev[2 * i + 1], dev_acc[i]);
      widen_add(sq[2 * i], sq[2 * i + 1], sq_acc[i]);
    }
  }
  for (int64_t t = 0; t < tiles; ++t) {
    StoreHalfTileLanes<kBFloat16>(center + 4 * t, dev + 8 * t, sq + 8 * t,
                                  center_out + kTile * t, dev_out + kTile * t,
                                  sq_out + kTile * t);
  }
  narrow.Finish(center_out + kTile * tiles, dev_out + kTile * tiles,
                sq_out + kTile * tiles);
}
#endif  // NORMD_HALF_AVX512

// Shifted sums of a row block whose channels are short runs (1 < inner <
// kMinRun): channel c of each row is a run of `inner` values, whose
// d = x - shift and d^2 are summed in kRunLanes fp64 lanes (value i in lane
// i % kRunLanes), folded in a fixed order and added to the channel's sums.
// Each channel's shift is RunCenter of its first run in the block. fp64
// rather than fp32 as the other fast paths, so that these statistics stay
// as exact as those of the loops this replaces (the 16-bit tests bound
// pooled statistics of such shapes at 1e-12; fp32 lanes gave 1e-8), whose
// one sum per channel made every addition wait on the previous one
// (shape_survey's BatchNorm training of 8x8 images). Writes the shifts, S1
// and S2 of channels [0, width) (RowBlockMoments checks them with
// NeedsExactPath).
constexpr int kRunLanes = 16;

// ShortRunSums' shift for a channel: the mean of the first kRunLanes values
// of its first run in the block, summed as FoldHalves does.
template <typename E>
NORMD_INLINE_INTO_CLONES double RunCenter(const typename E::Storage* run) {
  double lanes[kRunLanes];
  for (int j = 0; j < kRunLanes; ++j) {
    lanes[j] = static_cast<double>(E::Load(run[j]));
  }
  FoldHalves<kRunLanes>(lanes);
  return lanes[0] / kRunLanes;
}

template <typename E>
NORMD_INLINE_INTO_CLONES void ShortRunSums(const typename E::Storage* x,
                                           const ChannelLayout& layout,
                                           const RowBlock& block,
                                           double* __restrict center_out,
                                           double* __restrict dev_out,
                                           double* __restrict sq_out) {
  const int64_t inner = layout.inner;
  const int64_t row_stride = layout.channels * inner;
  for (int64_t r = block.r0; r < block.r1; ++r) {
    for (int64_t c = 0; c < block.width(); ++c) {
      const auto* __restrict run = x + r * row_stride + (block.c0 + c) * inner;
      if (r == block.r0) {
        center_out[c] = RunCenter<E>(run);
        dev_out[c] = sq_out[c] = 0.0;
      }
      const double center = center_out[c];
      double dev[kRunLanes] = {};
      double sq[kRunLanes] = {};
      int64_t i = 0;
      for (; i + kRunLanes <= inner; i += kRunLanes) {
        for (int j = 0; j < kRunLanes; ++j) {
          const double d = static_cast<double>(E::Load(run[i + j])) - center;
          dev[j] += d;
          sq[j] += d * d;
        }
      }
      for (int j = 0; i < inner; ++i, ++j) {
        const double d = static_cast<double>(E::Load(run[i])) - center;
        dev[j] += d;
        sq[j] += d * d;
      }
      FoldHalves<kRunLanes>(dev);
      FoldHalves<kRunLanes>(sq);
      dev_out[c] += dev[0];
      sq_out[c] += sq[0];
    }
  }
}

#ifdef NORMD_HALF_AVX512
// ShortRunSums in AVX-512 registers: lanes 0-7 and 8-15 in two vectors, the
// same additions (no fused multiply-adds) and the same folds, so the same
// bits. The compiled loop splits its 16 lanes into vectors of 8, 4 and 2 and
// two scalars (GCC 12; shape_survey's BatchNorm training of 8x8 images).
template <typename E>
[[gnu::target("avx512f,avx512bw")]] void ShortRunSumsAvx512(
    const typename E::Storage* x, const ChannelLayout& layout,
    const RowBlock& block, double* center_out, double* dev_out,
    double* sq_out) {
  static_assert(kRunLanes == 16);
  const int64_t inner = layout.inner;
  const int64_t row_stride = layout.channels * inner;
  // The 16 values at p, the lanes `m` selects (others 0), as fp64 lanes 0-7
  // and 8-15.
  auto load = [](const typename E::Storage* p, __mmask16 m, __m512d* halves)
      __attribute__((target("avx512f,avx512bw"))) {
    __m512 f;
    if constexpr (std::is_same_v<E, Stored<float>>) {
      f = _mm512_maskz_loadu_ps(m, p);
    } else {
      const __m256i h = _mm512_castsi512_si256(
          _mm512_maskz_loadu_epi16(static_cast<__mmask32>(m), p));
      f = std::is_same_v<E, BFloat16Values> ? FloatsOfBFloat16x16(h)
                                            : FloatsOfFloat16x16(h);
    }
    halves[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
    halves[1] = _mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
  };
  // FoldHalves<16> of lanes 0-7 in a, 8-15 in b.
  auto fold = [](__m512d a, __m512d b) __attribute__((target("avx512f"))) {
    return FoldLanes(_mm512_add_pd(a, b));
  };
  for (int64_t r = block.r0; r < block.r1; ++r) {
    for (int64_t c = 0; c < block.width(); ++c) {
      const auto* run = x + r * row_stride + (block.c0 + c) * inner;
      __m512d halves[2];
      if (r == block.r0) {  // RunCenter.
        load(run, 0xFFFF, halves);
        center_out[c] = fold(halves[0], halves[1]) / kRunLanes;
        dev_out[c] = sq_out[c] = 0.0;
      }
      const __m512d center = _mm512_set1_pd(center_out[c]);
      __m512d dev[2], sq[2];
      for (int h = 0; h < 2; ++h) dev[h] = sq[h] = _mm512_setzero_pd();
      // Adds the 16 values at p, the lanes `m` selects, into the lanes.
      auto add = [&](const typename E::Storage* p, __mmask16 m)
          __attribute__((target("avx512f,avx512bw"))) {
        load(p, m, halves);
        for (int h = 0; h < 2; ++h) {
          const auto lanes = static_cast<__mmask8>(m >> (8 * h));
          const __m512d d = _mm512_sub_pd(halves[h], center);
          dev[h] = _mm512_mask_add_pd(dev[h], lanes, dev[h], d);
          sq[h] = _mm512_mask_add_pd(sq[h], lanes, sq[h], _mm512_mul_pd(d, d));
        }
      };
      int64_t i = 0;
      for (; i + kRunLanes <= inner; i += kRunLanes) add(run + i, 0xFFFF);
      if (i < inner) {
        add(run + i, static_cast<__mmask16>((1u << (inner - i)) - 1));
      }
      dev_out[c] += fold(dev[0], dev[1]);
      sq_out[c] += fold(sq[0], sq[1]);
    }
  }
}
#endif  // NORMD_HALF_AVX512

// Runs at least this long take ShortRunSums (shorter ones: the exact loops,
// whose chains are as short as the runs).
constexpr int64_t kMinSummedRun = kRunLanes;

// How RowBlockMomentsImpl reduces a block: kFast with the fp32-value fast
// paths (register tiles, short-run sums), their hand-written AVX-512 loops
// where the CPU has them; kFastCompiled the same with the compiled loops
// only (the same bits; for tests); kExact all in the exact fp64 two-pass
// generic loops.
enum class RowPass { kFast, kFastCompiled, kExact };

// Moments of every channel of a row block into out[0..width): per-channel
// accumulators, vectorized across channels (fp32 data channels-last: in
// register tiles of kTile channels, see ChannelsLastTile, or, where a block
// would take two tiles or more (register or narrow), their lanes rows first,
// see ChannelsLastRows; the rest in
// NarrowChannelsLastTiles; runs of kMinSummedRun or more: ShortRunSums), as
// `pass` says; the exact pass and other layouts in the generic fp64 loops.
// scratch.wide holds the shifts (or means), S1 and S2 of every channel
// afterwards.
template <typename E, typename Side>
NORMD_INLINE_INTO_CLONES void RowBlockMomentsImpl(const typename E::Storage* x,
                                                  const ChannelLayout& layout,
                                                  const RowBlock& block,
                                                  RowScratch& scratch,
                                                  Moments* out, RowPass pass,
                                                  Side& side) {
  using T = typename E::Storage;
  const bool tile = pass != RowPass::kExact;
  [[maybe_unused]] const bool hand_written =
      pass == RowPass::kFast && CpuHasAvx512Bw();
  const int64_t width = block.width();
  const int64_t inner = layout.inner;
  const int64_t row_stride = layout.channels * inner;
  double* __restrict sum = scratch.wide.data();
  double* __restrict dev = sum + width;
  double* __restrict sq = dev + width;
  std::fill(sum, sum + 3 * width, 0.0);
  // Channels [0, tiled) in register tiles or short-run sums; the rest in the
  // generic loops.
  int64_t tiled = 0;
  if constexpr (std::is_same_v<typename E::Value, float>) {
    if (tile && inner == 1) tiled = width / kTile * kTile;
    // Two tiles or more (register or narrow): rows first; else the one tile
    // (register or narrow) alone.
    int64_t tile_by_tile = tiled;
    if (tile && inner == 1 && RowsFirst(width)) {
      tile_by_tile = 0;
      bool done = false;
#ifdef NORMD_HALF_AVX512
      if constexpr (!std::is_same_v<E, Stored<float>>) {
        if (hand_written) {
          HalfChannelsLastRowsAvx512<std::is_same_v<E, BFloat16Values>>(
              x, row_stride, block.c0, width, block.r0, block.r1, layout.outer,
              sum, dev, sq);
          done = true;
        }
      }
#endif
      if (!done) {
        ChannelsLastRows<E>(x, row_stride, block.c0, width, block.r0, block.r1,
                            layout.outer, sum, dev, sq);
      }
      tiled = width;
    }
    for (int64_t t = 0; t < tile_by_tile; t += kTile) {
#ifdef NORMD_HALF_AVX512
      if constexpr (!std::is_same_v<E, Stored<float>>) {
        if (hand_written) {
          HalfChannelsLastTileAvx512<std::is_same_v<E, BFloat16Values>>(
              x, row_stride, block.c0 + t, block.r0, block.r1, sum + t, dev + t,
              sq + t, side);
          continue;
        }
      }
#endif
      ChannelsLastTile<E>(x, row_stride, block.c0 + t, block.r0, block.r1,
                          sum + t, dev + t, sq + t, side);
    }
    if (tile && inner == 1 && tiled < width) {
      NarrowChannelsLastTiles<E>(x, row_stride, block.c0 + tiled, width - tiled,
                                 block.r0, block.r1, sum + tiled, dev + tiled,
                                 sq + tiled);
      tiled = width;
    }
    if (tile && inner >= kMinSummedRun) {
#ifdef NORMD_HALF_AVX512
      if (hand_written) {
        ShortRunSumsAvx512<E>(x, layout, block, sum, dev, sq);
      } else {
        ShortRunSums<E>(x, layout, block, sum, dev, sq);
      }
#else
      ShortRunSums<E>(x, layout, block, sum, dev, sq);
#endif
      tiled = width;
    }
  }
  for (int64_t r = block.r0; r < block.r1; ++r) {
    const T* __restrict row = x + r * row_stride + block.c0 * inner;
    for (int64_t c = tiled; c < width; ++c) {
      for (int64_t i = 0; i < inner; ++i) {
        sum[c] += static_cast<double>(E::Load(row[c * inner + i]));
      }
    }
  }
  const int64_t count = (block.r1 - block.r0) * inner;
  for (int64_t c = tiled; c < width; ++c) sum[c] /= static_cast<double>(count);
  for (int64_t r = block.r0; r < block.r1; ++r) {
    const T* __restrict row = x + r * row_stride + block.c0 * inner;
    for (int64_t c = tiled; c < width; ++c) {
      for (int64_t i = 0; i < inner; ++i) {
        const double d =
            static_cast<double>(E::Load(row[c * inner + i])) - sum[c];
        dev[c] += d;
        sq[c] += d * d;
      }
    }
  }
  for (int64_t c = 0; c < width; ++c) {
    out[c] = Corrected(count, sum[c], dev[c], sq[c]);
  }
}

NORMD_MULTIVERSION void RowBlockMomentsF32(const float* x,
                                           const ChannelLayout& layout,
                                           const RowBlock& block,
                                           RowScratch& scratch, Moments* out,
                                           RowPass pass) {
  NoInterleave none;
  RowBlockMomentsImpl<Stored<float>>(x, layout, block, scratch, out, pass,
                                     none);
}

NORMD_MULTIVERSION void RowBlockMomentsBF16(const uint16_t* x,
                                            const ChannelLayout& layout,
                                            const RowBlock& block,
                                            RowScratch& scratch, Moments* out,
                                            RowPass pass) {
  NoInterleave none;
  RowBlockMomentsImpl<BFloat16Values>(x, layout, block, scratch, out, pass,
                                      none);
}

NORMD_MULTIVERSION void RowBlockMomentsF16(const uint16_t* x,
                                           const ChannelLayout& layout,
                                           const RowBlock& block,
                                           RowScratch& scratch, Moments* out,
                                           RowPass pass) {
  NoInterleave none;
  RowBlockMomentsImpl<Float16Values>(x, layout, block, scratch, out, pass,
                                     none);
}

NORMD_MULTIVERSION void RowBlockMomentsF64(const double* x,
                                           const ChannelLayout& layout,
                                           const RowBlock& block,
                                           RowScratch& scratch, Moments* out) {
  NoInterleave none;
  RowBlockMomentsImpl<Stored<double>>(x, layout, block, scratch, out,
                                      RowPass::kExact, none);
}

#ifdef NORMD_HALF_AVX512
// The fast pass of RowBlockMomentsF32 / BF16 / F16 with `side` stepped by
// the tiles: the AVX-512 instance only (the same bits as every clone).
template <typename E>
[[gnu::target("avx512f,avx512bw")]] void RowBlockMomentsInterleaved(
    const typename E::Storage* x, const ChannelLayout& layout,
    const RowBlock& block, RowScratch& scratch, Moments* out,
    StepInterleave& side) {
  RowBlockMomentsImpl<E>(x, layout, block, scratch, out, RowPass::kFast, side);
}
#endif

// Moments of a row block of elements E: fp32 values (stored or widened) on
// the fast paths (`hand_written`: with their AVX-512 loops where the CPU has
// them), redone with the exact fp64 loops where they lost accuracy (see
// NeedsExactPath); fp64 always exact. `side` (hand-written only, and not on
// the exact redo) as for ChannelsLastTile.
template <typename E>
void RowBlockMoments(const typename E::Storage* x, const ChannelLayout& layout,
                     const RowBlock& block, RowScratch& scratch, Moments* out,
                     bool hand_written, StepInterleave* side) {
  auto run = [&](RowPass pass) {
#ifdef NORMD_HALF_AVX512
    if constexpr (!std::is_same_v<E, Stored<double>>) {
      if (side != nullptr && pass == RowPass::kFast) {
        RowBlockMomentsInterleaved<E>(x, layout, block, scratch, out, *side);
        return;
      }
    }
#endif
    if constexpr (std::is_same_v<E, Stored<float>>) {
      RowBlockMomentsF32(x, layout, block, scratch, out, pass);
    } else if constexpr (std::is_same_v<E, BFloat16Values>) {
      RowBlockMomentsBF16(x, layout, block, scratch, out, pass);
    } else if constexpr (std::is_same_v<E, Float16Values>) {
      RowBlockMomentsF16(x, layout, block, scratch, out, pass);
    }
  };
  if constexpr (std::is_same_v<E, Stored<double>>) {
    RowBlockMomentsF64(x, layout, block, scratch, out);
  } else {
    run(hand_written ? RowPass::kFast : RowPass::kFastCompiled);
    const double* squares = scratch.wide.data() + 2 * block.width();
    for (int64_t c = 0; c < block.width(); ++c) {
      if (NeedsExactPath(out[c], squares[c])) {
        run(RowPass::kExact);
        return;
      }
    }
  }
}

// Channel moments for short runs (inner < kMinRun, e.g. channels-last or
// (N, C)). Work items are (channel range, row group); the ranges and groups
// depend only on the shape. Each item folds its row blocks in order; the
// groups are then folded per channel in order.
// `work` as for ChannelMoments.
template <typename E>
std::vector<Moments> ChannelMomentsShortRuns(const typename E::Storage* x,
                                             const ChannelLayout& layout,
                                             bool hand_written = true,
                                             InterleavedWork* work = nullptr) {
  // Elements of one row per block: channels-last, kMaxRowWidth channels
  // (kTile register tiles, rows first); runs of one channel (inner > 1),
  // 16 Ki elements. Runs read as strips of 1 Ki elements leave the hardware
  // prefetcher starting afresh on every 4 KiB page (shape_survey's
  // BatchNorm training of 8x8 images).
  const int64_t row_width = layout.inner == 1 ? kMaxRowWidth : 16384;
  // Elements per row block: larger than kMomentsBlock because the tiles keep
  // their sums in registers, and each block's shift sample, finish and
  // merges leave the loads idle (kernel_bench BM_Fit NHWC); still L2-sized
  // (1 MiB of fp32) so that an exact-path redo reads from cache.
  constexpr int64_t kShortRunBlock = 8 * kMomentsBlock;
  constexpr int64_t kMinPerGroup = 1024;
  constexpr int64_t kMaxGroups = 256;
  const int64_t channels = layout.channels;
  const int64_t range_width =
      std::clamp<int64_t>(row_width / layout.inner, 1, channels);
  const int64_t num_ranges = (channels + range_width - 1) / range_width;
  const int64_t rows_per_block =
      std::max<int64_t>(1, kShortRunBlock / (range_width * layout.inner));
  const int64_t num_blocks =
      (layout.outer + rows_per_block - 1) / rows_per_block;
  const int64_t num_groups = std::clamp<int64_t>(
      layout.PerChannel() / kMinPerGroup, 1, std::min(num_blocks, kMaxGroups));

  // Only a serial reduction steps `work` (on this thread, in order).
  StepInterleave side{work};
  const bool interleave = work != nullptr && hand_written &&
                          ChannelMomentsStepWork(layout) &&
                          SerialLoopsScope::Active() && CpuHasAvx512Bw();
  std::vector<Moments> per_group(num_groups * channels);
  ParallelFor(
      tbb::blocked_range<int64_t>(0, num_ranges * num_groups),
      layout.NumElements(), [&](const tbb::blocked_range<int64_t>& items) {
        RowScratch scratch(range_width);
        std::vector<Moments> block_moments(range_width);
        for (int64_t item = items.begin(); item < items.end(); ++item) {
          const int64_t group = item / num_ranges;
          const int64_t c0 = (item % num_ranges) * range_width;
          const int64_t c1 = std::min(channels, c0 + range_width);
          const int64_t b0 = group * num_blocks / num_groups;
          const int64_t b1 = (group + 1) * num_blocks / num_groups;
          Moments* acc = per_group.data() + group * channels + c0;
          for (int64_t b = b0; b < b1; ++b) {
            const int64_t r0 = b * rows_per_block;
            const RowBlock block{c0, c1, r0,
                                 std::min(layout.outer, r0 + rows_per_block)};
            RowBlockMoments<E>(x, layout, block, scratch, block_moments.data(),
                               hand_written, interleave ? &side : nullptr);
            for (int64_t c = 0; c < c1 - c0; ++c) {
              MergeMoments(acc[c], block_moments[c]);
            }
          }
        }
      });
  std::vector<Moments> result(channels);
  for (int64_t c = 0; c < channels; ++c) {
    result[c] = FoldInOrder(per_group.data() + c, num_groups, channels);
  }
  return result;
}

}  // namespace

double Moments::BiasedVariance() const {
  return count > 0 ? m2 / static_cast<double>(count)
                   : std::numeric_limits<double>::quiet_NaN();
}

double Moments::UnbiasedVariance() const {
  return count > 1 ? m2 / static_cast<double>(count - 1)
                   : std::numeric_limits<double>::quiet_NaN();
}

bool Moments::IsFinite() const {
  return std::isfinite(mean) && std::isfinite(m2);
}

void MergeMoments(Moments& into, const Moments& other) {
  if (other.count == 0) return;
  if (into.count == 0) {
    into = other;
    return;
  }
  const double na = static_cast<double>(into.count);
  const double nb = static_cast<double>(other.count);
  const double n = na + nb;
  const double delta = other.mean - into.mean;
  into.mean += delta * (nb / n);
  into.m2 += other.m2 + delta * delta * (na * nb / n);
  into.count += other.count;
}

template <typename T>
Moments ContiguousMoments(const T* x, int64_t n) {
  if (n <= 0) return Moments{};
  const int64_t num_blocks = (n + kMomentsBlock - 1) / kMomentsBlock;
  auto block = [&](int64_t b) {
    const int64_t begin = b * kMomentsBlock;
    return BlockMoments(x + begin, std::min(kMomentsBlock, n - begin));
  };
  if (num_blocks < 2) {
    Moments total;
    for (int64_t b = 0; b < num_blocks; ++b) MergeMoments(total, block(b));
    return total;
  }
  std::vector<Moments> parts(num_blocks);
  ParallelFor(tbb::blocked_range<int64_t>(0, num_blocks), n,
              [&](const tbb::blocked_range<int64_t>& range) {
                for (int64_t b = range.begin(); b < range.end(); ++b) {
                  parts[b] = block(b);
                }
              });
  return FoldInOrder(parts.data(), num_blocks, 1);
}

// Channels whose runs are at least this long are reduced run by run
// (ChannelMomentsLongRuns), shorter ones in row blocks across channels.
constexpr int64_t kMinRun = 256;

// Whether every channel is one run of 16-255 values (outer == 1: the sets of
// GroupNorm / InstanceNorm chunks of small images), reduced as rows by
// OneRunChannelMoments.
bool OneShortRunPerChannel(const ChannelLayout& layout) {
  return layout.outer == 1 && layout.inner >= 16 && layout.inner < kMinRun;
}

// The moments of channels that are one run each, as ChannelMomentsLongRuns
// reduces runs (ContiguousMoments), sixteen runs at a time with
// ShortRowMoments16: the short-run sums (ShortRunSums) spent ~70 operations
// per run on fp64 lanes, a shift sample and folds. `runs(c0, count,
// buffer)` gives the fp32 values of channels [c0, c0 + count) (count <=
// 16), in place or widened into `buffer` (16 inner floats).
template <typename Runs>
std::vector<Moments> OneRunChannelMoments(const ChannelLayout& layout,
                                          const Runs& runs) {
  const int64_t inner = layout.inner;
  const int64_t batches = (layout.channels + 15) / 16;
  std::vector<Moments> result(layout.channels);
  ParallelFor(tbb::blocked_range<int64_t>(0, batches), layout.NumElements(),
              [&](const tbb::blocked_range<int64_t>& range) {
                thread_local std::vector<float> buffer;
                if (static_cast<int64_t>(buffer.size()) < 16 * inner) {
                  buffer.resize(16 * inner);
                }
                for (int64_t b = range.begin(); b < range.end(); ++b) {
                  const int64_t c0 = 16 * b;
                  const int count = static_cast<int>(
                      std::min<int64_t>(16, layout.channels - c0));
                  ShortRowMoments16(runs(c0, count, buffer.data()), inner,
                                    count, result.data() + c0);
                }
              });
  return result;
}

template <typename T>
std::vector<Moments> ChannelMoments(const T* x, const ChannelLayout& layout,
                                    InterleavedWork* work) {
  if (layout.channels == 0) return {};
  if (layout.PerChannel() == 0) return std::vector<Moments>(layout.channels);
  if (layout.inner >= kMinRun) return ChannelMomentsLongRuns(x, layout);
  if constexpr (std::is_same_v<T, float>) {
    if (OneShortRunPerChannel(layout)) {
      return OneRunChannelMoments(layout, [&](int64_t c0, int count, float*) {
        return x + c0 * layout.inner;
      });
    }
  }
  return ChannelMomentsShortRuns<Stored<T>>(x, layout, true, work);
}

std::vector<Moments> HalfChannelMoments(DType dtype, const uint16_t* x,
                                        const ChannelLayout& layout,
                                        InterleavedWork* work) {
  if (layout.channels == 0) return {};
  if (layout.PerChannel() == 0) return std::vector<Moments>(layout.channels);
  if (layout.inner >= kMinRun) {
    return HalfChannelMomentsLongRuns(dtype, x, layout);
  }
  if (OneShortRunPerChannel(layout)) {
    return OneRunChannelMoments(
        layout, [&](int64_t c0, int count, float* buffer) {
          WidenHalf(dtype, x + c0 * layout.inner, buffer, count * layout.inner);
          return static_cast<const float*>(buffer);
        });
  }
  return dtype == DType::kBFloat16
             ? ChannelMomentsShortRuns<BFloat16Values>(x, layout, true, work)
             : ChannelMomentsShortRuns<Float16Values>(x, layout, true, work);
}

bool ChannelMomentsStepWork(const ChannelLayout& layout) {
  return layout.inner == 1 && layout.channels == kTile;
}

std::vector<Moments> ShortRunChannelMoments(DType dtype, const void* x,
                                            const ChannelLayout& layout,
                                            bool hand_written) {
  if (layout.channels == 0) return {};
  if (layout.PerChannel() == 0) return std::vector<Moments>(layout.channels);
  switch (dtype) {
    case DType::kBFloat16:
      return ChannelMomentsShortRuns<BFloat16Values>(
          static_cast<const uint16_t*>(x), layout, hand_written);
    case DType::kFloat16:
      return ChannelMomentsShortRuns<Float16Values>(
          static_cast<const uint16_t*>(x), layout, hand_written);
    default:
      return ChannelMomentsShortRuns<Stored<float>>(
          static_cast<const float*>(x), layout, hand_written);
  }
}

bool HasShortRowMoments16(int64_t n) {
#ifdef NORMD_HALF_AVX512
  return n > 0 && n % kShortLanes == 0 && n <= kShortBlock && CpuHasAvx512F();
#else
  return false;
#endif
}

void ShortRowMoments16(const float* x, int64_t n, int count, Moments* out) {
#ifdef NORMD_HALF_AVX512
  if (HasShortRowMoments16(n) && count >= 1 && count <= 16) {
    ShortRowMomentsAvx512(x, n, count, out);
    return;
  }
#endif
  for (int k = 0; k < count; ++k) {
    out[k] = FloatBlockMoments(x + k * n, n);
  }
}

namespace {

// ContiguousMoments' blocks of the widened x, merged in the same order
// (kStore: widened into out[0..n); else out is one block's scratch).
template <bool kStore>
Moments WidenedMoments(DType dtype, const uint16_t* x, float* out, int64_t n) {
  Moments total;
  for (int64_t begin = 0; begin < n; begin += kMomentsBlock) {
    MergeMoments(total,
                 HalfBlockMoments(dtype, x + begin, kStore ? out + begin : out,
                                  std::min(kMomentsBlock, n - begin), kStore));
  }
  return total;
}

}  // namespace

Moments WidenWithMoments(DType dtype, const uint16_t* x, float* out,
                         int64_t n) {
  return WidenedMoments</*kStore=*/true>(dtype, x, out, n);
}

Moments HalfMoments(DType dtype, const uint16_t* x, float* scratch, int64_t n) {
  return WidenedMoments</*kStore=*/false>(dtype, x, scratch, n);
}

template Moments ContiguousMoments<float>(const float*, int64_t);
template Moments ContiguousMoments<double>(const double*, int64_t);
template std::vector<Moments> ChannelMoments<float>(const float*,
                                                    const ChannelLayout&,
                                                    InterleavedWork*);
template std::vector<Moments> ChannelMoments<double>(const double*,
                                                     const ChannelLayout&,
                                                     InterleavedWork*);

}  // namespace normd
