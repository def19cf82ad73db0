#include "server/core/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <tbb/blocked_range.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "server/core/half.h"
#include "server/core/half_avx512.h"
#include "server/core/moments.h"
#include "server/core/parallel.h"
#include "server/core/simd.h"
#include "server/core/simd/channel_affine.h"
#include "server/core/simd/row_affine.h"
#include "server/core/simd/stream_copy.h"

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined_* placeholders (GCC bug 105593), in either form.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace normd {
namespace {

// Elements per parallel work item of the elementwise passes.
constexpr int64_t kApplyChunk = 16384;
// Elements computed into the per-thread staging buffer per StreamCopy.
constexpr int64_t kStagingElements = 4096;
// Rows at least this long (kLongLayerNormRow) are reduced and written in
// parallel one at a time (ContiguousMoments reduces rows of two blocks or
// more in parallel) unless there are enough of them (see whole_long_rows
// in LayerNormKernel); shorter rows are processed whole, many rows per work
// item.
static_assert(kLongLayerNormRow >= kMomentsBlock);
// Long rows are still processed whole, one per work item, when every
// thread gets at least this many and a row has at most this many bytes
// (paths with a staging buffer grow it to a row).
constexpr int64_t kWholeLongRowsPerThread = 4;
constexpr int64_t kMaxWholeLongRowBytes = 8 << 20;

// A fp64 mean split into two floats, mean ~= hi + lo, so that fp32 lanes can
// subtract it first: (x - hi) is exact near the mean (Sterbenz), and lo
// restores the bits hi dropped.
struct SplitMean {
  float hi;
  float lo;
  explicit SplitMean(double mean)
      : hi(static_cast<float>(mean)),
        lo(static_cast<float>(mean - static_cast<double>(hi))) {}
};

// One fp32 row's affine with streaming stores:
// y[j] = ((x[j] - hi) - lo) * scale [* weight[j]] [+ bias[j]], the same
// operations in the same order as FloatRowAffine (simd/row_affine.h), so
// the bits equal those of the cached path.
struct StreamAffine {
  float hi, lo, scale;
  const float* weight;  // Per element, or null.
  const float* bias;    // Per element, or null.
};

// y = fma(x - hi[c], scale[c], shift[c]) in fp32, rounded once after the
// subtraction (see simd/channel_affine.h): hi is the channel's fp64 mean
// rounded to float, and shift also carries the part of the mean hi dropped
// (see ChannelConstantsOf).
struct ChannelParamsF32 {
  const float* hi;
  const float* scale;
  const float* shift;
  // One channel's constants.
  struct One {
    float hi, scale, shift;
  };
  One Constants(int64_t c) const { return {hi[c], scale[c], shift[c]}; }
};

// The fp32 constants of y = (x - mean) * scale + shift (fp64 parameters) for
// ChannelParamsF32: hi = mean rounded to float, so x - hi is exact near the
// mean (Sterbenz); the rest of the mean, (mean - hi) * scale, is taken from
// the shift in fp64. One rounding after the subtraction, where ((x - hi) -
// lo) * scale + shift had three. With a scale that is not finite in fp32
// (an infinite or NaN weight, or one that overflows) the rest is left out:
// each value's sign against hi decides, as with an fp32 mean.
ChannelParamsF32::One ChannelConstantsOf(double mean, double scale,
                                         double shift) {
  const float hi = static_cast<float>(mean);
  const float scale32 = static_cast<float>(scale);
  const double rest = (mean - static_cast<double>(hi)) * scale;
  const bool fold = std::isfinite(scale32) && std::isfinite(rest);
  return {hi, scale32, static_cast<float>(fold ? shift - rest : shift)};
}

// True if p is null or p[0..n) are all finite.
bool AllFinite(const float* p, int64_t n) {
  return p == nullptr ||
         std::all_of(p, p + n, [](float v) { return std::isfinite(v); });
}

// Splits channels-last elements [begin, end) of an output whose element
// `begin` is at address `y_begin` (elements of element_size bytes) for the
// streaming channel kernels: where the per-channel parameters repeat every
// lcm(channels, unit) elements and that is at most max_repeat (and at most
// `period`, the expanded parameters' length), the middle from the first
// 64-byte boundary on, in whole repeats, goes to repeating(from, to,
// repeat); the ends, and everything otherwise, to per_element(from, to).
template <typename PerElement, typename Repeating>
void SplitChannelsLast(int64_t begin, int64_t end, uintptr_t y_begin,
                       int64_t element_size, int64_t channels, int64_t period,
                       int64_t unit, int64_t max_repeat,
                       const PerElement& per_element,
                       const Repeating& repeating) {
  const int64_t repeat = std::lcm(channels, unit);
  if (repeat > max_repeat || repeat > period ||
      y_begin % static_cast<uintptr_t>(element_size) != 0) {
    per_element(begin, end);
    return;
  }
  const int64_t head = std::min<int64_t>(
      end - begin,
      static_cast<int64_t>((64 - y_begin % 64) % 64) / element_size);
  const int64_t middle = begin + head;
  const int64_t tail = middle + (end - middle) / repeat * repeat;
  per_element(begin, middle);
  if (tail > middle) repeating(middle, tail, repeat);
  per_element(tail, end);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define NORMD_AVX512 __attribute__((target("avx512f")))
// The 16-bit kernels may also round with the AVX512-BF16 instruction: only
// the instantiations that ForNarrowings picks where CpuHasAvx512Bf16() call
// it (the compiler emits it for no other code).
#define NORMD_AVX512BW __attribute__((target("avx512f,avx512bw,avx512bf16")))

// How far ahead of its loads a streaming kernel prefetches its input. With
// a dozen operations a line between the loads, the hardware prefetchers
// alone leave them waiting on DRAM (kernel_bench BM_HalfBatchNorm eval NCHW;
// 2 and 4 KiB ahead measure the same).
constexpr int64_t kStreamPrefetchBytes = 2048;

// Prefetches the input lines of elements [j, j + count) of x `ahead_bytes`
// ahead (a hint: never faults, even past the end).
template <typename In>
NORMD_AVX512 inline void PrefetchStreamInput(
    const In* x, int64_t j, int64_t count,
    int64_t ahead_bytes = kStreamPrefetchBytes) {
  const char* ahead = reinterpret_cast<const char*>(x + j) + ahead_bytes;
  for (int64_t b = 0; b < count * static_cast<int64_t>(sizeof(In)); b += 64) {
    _mm_prefetch(ahead + b, _MM_HINT_T0);
  }
}

// What a streaming row loop prefetches as it writes element j. By default
// its own input (`current`), kStreamPrefetchBytes ahead of j. A row kernel
// that has just read its row for the statistics (so the row is in cache)
// passes the next row's input instead, prefetched at j itself, so that the
// next row comes from memory while this one's stores drain; otherwise each
// core alternates between reading (statistics) and writing (outputs).
// Shown by kernel_bench BM_LayerNorm, BM_RmsNorm and BM_HalfRows
// [B,T,4096]; rows of 768 gain little, their own prefetch already reaches
// into the next row.
template <typename In>
struct StreamPrefetch {
  // `current` (the row being written) must not be null: it is offset.
  // `next_row` may be. In the order of the loops' own parameters (x, ...,
  // next_row).
  StreamPrefetch(const In* current, const In* next_row)
      : source(next_row != nullptr ? next_row : current),
        ahead_bytes(next_row != nullptr ? 0 : kStreamPrefetchBytes) {}
  const In* source;
  int64_t ahead_bytes;
};

// Stores the 64-byte line v at the 64-byte aligned p: a streaming store
// (kStream: large outputs, see StreamOutput), or an ordinary one that
// leaves the line in the cache for whoever reads the output next.
template <bool kStream>
NORMD_AVX512 inline void StoreLine(void* p, __m512i v) {
  if constexpr (kStream) {
    _mm512_stream_si512(static_cast<__m512i*>(p), v);
  } else {
    _mm512_store_si512(p, v);
  }
}

// kernel.template operator()<kStream>() for the store kind: kStream =
// `stream`, streaming stores (which the caller fences), else ordinary ones.
template <typename Kernel>
auto ForStore(bool stream, const Kernel& kernel) {
  return stream ? kernel.template operator()<true>()
                : kernel.template operator()<false>();
}

// Writes y[0..n) from compute(j, mask), the 16 results for elements
// [j, j + 16) of which `mask` selects the valid ones (loads must be masked):
// whole 64-byte lines with streaming stores (kStream; else ordinary ones), a
// partial line at either end with masked stores (y need not be aligned, rows
// need not be whole lines). `prefetch` is read ahead as y is written: the
// lines of element j of it, `ahead_bytes` further on (see StreamPrefetch).
template <bool kStream = true, typename In, typename Compute>
NORMD_AVX512 inline void StreamLinesAvx512(
    const In* prefetch, float* y, int64_t n, const Compute& compute,
    int64_t ahead_bytes = kStreamPrefetchBytes) {
  constexpr int64_t kLine = 16;
  auto mask = [](int64_t count) {
    return static_cast<__mmask16>((1u << count) - 1);
  };
  int64_t j = 0;
  const int64_t misaligned =
      static_cast<int64_t>(reinterpret_cast<uintptr_t>(y) & 63) /
      static_cast<int64_t>(sizeof(float));
  if (misaligned != 0 && n > 0) {
    const __mmask16 head = mask(std::min(n, kLine - misaligned));
    _mm512_mask_storeu_ps(y, head, compute(0, head));
    j = std::min(n, kLine - misaligned);
  }
  for (; j + kLine <= n; j += kLine) {
    PrefetchStreamInput(prefetch, j, kLine, ahead_bytes);
    StoreLine<kStream>(
        y + j, _mm512_castps_si512(compute(j, static_cast<__mmask16>(0xFFFF))));
  }
  if (j < n) {
    const __mmask16 tail = mask(n - j);
    _mm512_mask_storeu_ps(y + j, tail, compute(j, tail));
  }
}

// A StreamAffine in registers: At(x, j, m) is its 16 results for x[j..j+16)
// (the lanes `m` selects; loads are masked).
struct StreamAffineLanes {
  NORMD_AVX512 explicit StreamAffineLanes(const StreamAffine& affine)
      : a(affine),
        hi(_mm512_set1_ps(affine.hi)),
        lo(_mm512_set1_ps(affine.lo)),
        scale(_mm512_set1_ps(affine.scale)) {}

  NORMD_AVX512 __m512 At(const float* x, int64_t j, __mmask16 m) const {
    __m512 t =
        _mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j), hi), lo);
    t = _mm512_mul_ps(t, scale);
    if (a.weight != nullptr) {
      t = _mm512_mul_ps(t, _mm512_maskz_loadu_ps(m, a.weight + j));
    }
    if (a.bias != nullptr) {
      return _mm512_add_ps(t, _mm512_maskz_loadu_ps(m, a.bias + j));
    }
    return t;
  }

  const StreamAffine& a;
  __m512 hi, lo, scale;
};

NORMD_AVX512 void StreamAffineRunAvx512(const float* x, float* y, int64_t n,
                                        const StreamAffine& a,
                                        const float* next_row) {
  const StreamAffineLanes lanes(a);
  const StreamPrefetch<float> prefetch(x, next_row);
  StreamLinesAvx512(
      prefetch.source, y, n,
      [&](int64_t j, __mmask16 m) NORMD_AVX512 { return lanes.At(x, j, m); },
      prefetch.ahead_bytes);
}

// fma(x - hi, scale, shift): ChannelParamsF32's operations.
NORMD_AVX512 inline __m512 ChannelAffineLanes(__m512 x, __m512 hi, __m512 scale,
                                              __m512 shift) {
  return _mm512_fmadd_ps(_mm512_sub_ps(x, hi), scale, shift);
}

// y[0..n) = fma(x - k.hi, k.scale, k.shift) with streaming stores:
// one channel's run.
NORMD_AVX512 void StreamChannelRunAvx512(const float* x, float* y, int64_t n,
                                         const ChannelParamsF32::One& k) {
  const __m512 hi = _mm512_set1_ps(k.hi);
  const __m512 scale = _mm512_set1_ps(k.scale);
  const __m512 shift = _mm512_set1_ps(k.shift);
  StreamLinesAvx512(x, y, n, [&](int64_t j, __mmask16 m) NORMD_AVX512 {
    return ChannelAffineLanes(_mm512_maskz_loadu_ps(m, x + j), hi, scale,
                              shift);
  });
}

// y[j] = fma(x[j] - hi[j], scale[j], shift[j]) with streaming stores
// (kStream) or ordinary ones (ChannelParamsF32::Apply with the parameters
// indexed per element).
template <bool kStream>
NORMD_AVX512 void StreamChannelsLastRunAvx512(const float* x, float* y,
                                              int64_t n, const float* hi,
                                              const float* scale,
                                              const float* shift) {
  StreamLinesAvx512<kStream>(x, y, n, [&](int64_t j, __mmask16 m) NORMD_AVX512 {
    return ChannelAffineLanes(_mm512_maskz_loadu_ps(m, x + j),
                              _mm512_maskz_loadu_ps(m, hi + j),
                              _mm512_maskz_loadu_ps(m, scale + j),
                              _mm512_maskz_loadu_ps(m, shift + j));
  });
}

// The first 16 * kVectors entries of each channels-last parameter array,
// into kVectors registers each.
template <int kVectors>
NORMD_AVX512 inline void LoadChannelVectors(const float* hi, const float* scale,
                                            const float* shift, __m512* h,
                                            __m512* s, __m512* b) {
  for (int k = 0; k < kVectors; ++k) {
    h[k] = _mm512_loadu_ps(hi + 16 * k);
    s[k] = _mm512_loadu_ps(scale + 16 * k);
    b[k] = _mm512_loadu_ps(shift + 16 * k);
  }
}

// StreamChannelsLastRunAvx512 with the parameters held in registers: `n` is
// a multiple of 16 * kVectors, y is 64-byte aligned, and the parameters
// repeat every 16 * kVectors elements (a multiple of the channel count), so
// each of the four is loaded once into kVectors registers. The same
// operations as the per-element loads, so the same bits; it saves the loads
// that kept the per-element loop from streaming at copy speed.
// `prefetch_input`: x is prefetched ahead of the loads (see
// InterleavedChannelAffine for when it is not). kStream: streaming stores,
// else ordinary ones.
template <int kVectors, bool kStream>
NORMD_AVX512 void StreamChannelsLastRegistersAvx512(const float* x, float* y,
                                                    int64_t n, const float* hi,
                                                    const float* scale,
                                                    const float* shift,
                                                    bool prefetch_input) {
  __m512 h[kVectors], s[kVectors], b[kVectors];
  LoadChannelVectors<kVectors>(hi, scale, shift, h, s, b);
  for (int64_t j = 0; j < n; j += 16 * kVectors) {
    if (prefetch_input) PrefetchStreamInput(x, j, 16 * kVectors);
#pragma GCC unroll 4
    for (int k = 0; k < kVectors; ++k) {
      StoreLine<kStream>(y + j + 16 * k, _mm512_castps_si512(ChannelAffineLanes(
                                             _mm512_loadu_ps(x + j + 16 * k),
                                             h[k], s[k], b[k])));
    }
  }
}

// StreamChannelsLastRegistersAvx512 for parameters repeating every `repeat`
// (16, 32, 48 or 64) elements; `stream` as kStream.
void StreamChannelsLastRepeating(const float* x, float* y, int64_t n,
                                 int64_t repeat, const float* hi,
                                 const float* scale, const float* shift,
                                 bool prefetch_input, bool stream) {
  auto* body = ForStore(stream, [&]<bool kStream>() {
    return repeat == 16   ? StreamChannelsLastRegistersAvx512<1, kStream>
           : repeat == 32 ? StreamChannelsLastRegistersAvx512<2, kStream>
           : repeat == 48 ? StreamChannelsLastRegistersAvx512<3, kStream>
                          : StreamChannelsLastRegistersAvx512<4, kStream>;
  });
  body(x, y, n, hi, scale, shift, prefetch_input);
}

// The affine of the 16-bit rows in registers, with fused multiply-adds (two
// operations fewer per vector than StreamAffineLanes; one rounding where
// that has two): t = fma(x - hi, scale, -(lo * scale)), then
// fma(t, weight, bias) | t * weight | t + bias. HalfRowAffine
// (simd/row_affine.h) computes the same bits on every target.
struct HalfAffineLanes {
  NORMD_AVX512 explicit HalfAffineLanes(const StreamAffine& affine)
      : a(affine),
        hi(_mm512_set1_ps(affine.hi)),
        scale(_mm512_set1_ps(affine.scale)),
        low_term(_mm512_set1_ps(-(affine.lo * affine.scale))) {}

  NORMD_AVX512 __m512 At(const float* x, int64_t j, __mmask16 m) const {
    return Of(_mm512_maskz_loadu_ps(m, x + j), j, m);
  }

  // The results for the values v of elements [j, j + 16): weights and biases
  // from a.weight + j and a.bias + j, in the lanes `m` selects.
  NORMD_AVX512 __m512 Of(__m512 v, int64_t j, __mmask16 m) const {
    const __m512 t = _mm512_fmadd_ps(_mm512_sub_ps(v, hi), scale, low_term);
    if (a.weight != nullptr && a.bias != nullptr) {
      return _mm512_fmadd_ps(t, _mm512_maskz_loadu_ps(m, a.weight + j),
                             _mm512_maskz_loadu_ps(m, a.bias + j));
    }
    if (a.weight != nullptr) {
      return _mm512_mul_ps(t, _mm512_maskz_loadu_ps(m, a.weight + j));
    }
    if (a.bias != nullptr) {
      return _mm512_add_ps(t, _mm512_maskz_loadu_ps(m, a.bias + j));
    }
    return t;
  }

  const StreamAffine& a;
  __m512 hi, scale, low_term;
};

// Writes the 16-bit y[0..n) from line(j, mask), the 32 narrowed values of
// elements [j, j + 32) of which `mask` selects the valid ones (loads must be
// masked): whole 64-byte lines with StoreLine<kStream>, a partial line at
// either end with a masked store (y need not be aligned). `prefetch` is
// read ahead as y is written, as in StreamLinesAvx512.
template <typename In, typename Line, bool kStream = true>
NORMD_AVX512BW void StreamHalfLineWriterAvx512(
    const In* prefetch, uint16_t* y, int64_t n, const Line& line,
    int64_t ahead_bytes = kStreamPrefetchBytes) {
  auto partial = [&](int64_t j, int64_t count) NORMD_AVX512BW {
    const __mmask32 m =
        count == 32 ? ~__mmask32{0} : (__mmask32{1} << count) - 1;
    _mm512_mask_storeu_epi16(y + j, m, line(j, m));
  };
  constexpr int64_t kLine = 32;
  const auto address = reinterpret_cast<uintptr_t>(y);
  // An odd address never reaches a line boundary: all partial.
  const int64_t head =
      address % 2 != 0
          ? n
          : std::min(n, static_cast<int64_t>((64 - address % 64) % 64 / 2));
  int64_t j = 0;
  for (; j < head; j += kLine) partial(j, std::min(kLine, head - j));
  j = head;
  for (; j + kLine <= n; j += kLine) {
    PrefetchStreamInput(prefetch, j, kLine, ahead_bytes);
    StoreLine<kStream>(y + j, line(j, ~__mmask32{0}));
  }
  if (j < n) partial(j, n - j);
}

// Writes the 16-bit y[0..n) from compute(j, mask), the 16 fp32 results for
// elements [j, j + 16) of which `mask` selects the valid ones, narrowed as
// they are written: `kNarrow32` turns two vectors into one 64-byte line.
template <__m512i (*kNarrow32)(__m512, __m512), bool kStream = true,
          typename In, typename Compute>
NORMD_AVX512BW void StreamHalfLinesAvx512(
    const In* prefetch, uint16_t* y, int64_t n, const Compute& compute,
    int64_t ahead_bytes = kStreamPrefetchBytes) {
  auto line = [&](int64_t j, __mmask32 m) NORMD_AVX512BW {
    return kNarrow32(compute(j, static_cast<__mmask16>(m)),
                     compute(j + 16, static_cast<__mmask16>(m >> 16)));
  };
  StreamHalfLineWriterAvx512<In, decltype(line), kStream>(prefetch, y, n, line,
                                                          ahead_bytes);
}

// The HalfAffineLanes computation narrowed to 16-bit as it is written
// (StoreLine<kStream>).
template <__m512i (*kNarrow32)(__m512, __m512), bool kStream>
NORMD_AVX512BW void StreamAffineRunToHalfAvx512(const float* x, uint16_t* y,
                                                int64_t n,
                                                const StreamAffine& a,
                                                const uint16_t* next_row) {
  const HalfAffineLanes lanes(a);
  // Without a next row, its own (cached) row, as 16-bit lines: never a
  // null pointer to offset.
  const StreamPrefetch<uint16_t> prefetch(reinterpret_cast<const uint16_t*>(x),
                                          next_row);
  StreamHalfLinesAvx512<kNarrow32, kStream>(
      prefetch.source, y, n,
      [&](int64_t j, __mmask16 m) NORMD_AVX512BW { return lanes.At(x, j, m); },
      prefetch.ahead_bytes);
}

// 16 values of a 16-bit x from x[j], the lanes `m` selects (others 0),
// widened by kWiden.
template <__m512 (*kWiden)(__m256i)>
NORMD_AVX512BW inline __m512 WidenLanes(const uint16_t* x, int64_t j,
                                        __mmask16 m) {
  return kWiden(_mm512_castsi512_si256(
      _mm512_maskz_loadu_epi16(static_cast<__mmask32>(m), x + j)));
}

// The channel affine of 16-bit to 16-bit values, widened (kWiden) and
// narrowed (kNarrow32) in registers and streamed out; the same operations on
// the same fp32 values as the fp32 kernels, so the bits of widening, the
// fp32 kernel and narrowing. Runs of one channel (inner > 1): x[0..n) of
// channel constants k into y[0..n).
template <__m512 (*kWiden)(__m256i), __m512i (*kNarrow32)(__m512, __m512),
          bool kStream>
NORMD_AVX512BW void StreamHalfChannelRunAvx512(const uint16_t* x, uint16_t* y,
                                               int64_t n,
                                               const ChannelParamsF32::One& k) {
  const __m512 hi = _mm512_set1_ps(k.hi);
  const __m512 scale = _mm512_set1_ps(k.scale);
  const __m512 shift = _mm512_set1_ps(k.shift);
  StreamHalfLinesAvx512<kNarrow32, kStream>(
      x, y, n, [&](int64_t j, __mmask16 m) NORMD_AVX512BW {
        return ChannelAffineLanes(WidenLanes<kWiden>(x, j, m), hi, scale,
                                  shift);
      });
}

// Channels-last, parameters per element (the expanded arrays from the
// phase of x[0]).
template <__m512 (*kWiden)(__m256i), __m512i (*kNarrow32)(__m512, __m512),
          bool kStream>
NORMD_AVX512BW void StreamHalfChannelsLastRunAvx512(const uint16_t* x,
                                                    uint16_t* y, int64_t n,
                                                    const float* hi,
                                                    const float* scale,
                                                    const float* shift) {
  StreamHalfLinesAvx512<kNarrow32, kStream>(
      x, y, n, [&](int64_t j, __mmask16 m) NORMD_AVX512BW {
        return ChannelAffineLanes(WidenLanes<kWiden>(x, j, m),
                                  _mm512_maskz_loadu_ps(m, hi + j),
                                  _mm512_maskz_loadu_ps(m, scale + j),
                                  _mm512_maskz_loadu_ps(m, shift + j));
      });
}

// Channels-last with the parameters in registers, as
// StreamChannelsLastRegistersAvx512: `n` is a multiple of 16 * kVectors
// (kVectors even: whole 64-byte lines of y), y is 64-byte aligned and the
// parameters repeat every 16 * kVectors elements.
template <int kVectors, __m512 (*kWiden)(__m256i),
          __m512i (*kNarrow32)(__m512, __m512), bool kStream>
NORMD_AVX512BW void StreamHalfChannelsLastRegistersAvx512(
    const uint16_t* x, uint16_t* y, int64_t n, const float* hi,
    const float* scale, const float* shift, bool prefetch_input) {
  static_assert(kVectors % 2 == 0);
  __m512 h[kVectors], s[kVectors], b[kVectors];
  LoadChannelVectors<kVectors>(hi, scale, shift, h, s, b);
  auto lanes = [&](int64_t j, int k) NORMD_AVX512BW {
    const __m512 v = kWiden(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j + 16 * k)));
    return ChannelAffineLanes(v, h[k], s[k], b[k]);
  };
  for (int64_t j = 0; j < n; j += 16 * kVectors) {
    if (prefetch_input) PrefetchStreamInput(x, j, 16 * kVectors);
#pragma GCC unroll 3
    for (int k = 0; k < kVectors; k += 2) {
      StoreLine<kStream>(y + j + 16 * k,
                         kNarrow32(lanes(j, k), lanes(j, k + 1)));
    }
  }
}

// Writes the bfloat16 y[0..n) from compute(v, j), the fp32 results (a
// BFloat16Pair) of the widened values v = WidenBFloat16Pair(32 values from
// x[j], masked: zeros past the ends), 64-byte lines with
// StoreLine<kStream>, a partial line at either end with masked ones; `prefetch`
// as for StreamHalfLineWriterAvx512 (by default x itself, ahead of the loads).
template <__m512i (*kNarrowPair)(__m512, __m512), bool kStream = true,
          typename Compute>
NORMD_AVX512BW void StreamBFloat16PairsAvx512(
    const uint16_t* x, uint16_t* y, int64_t n, const Compute& compute,
    const uint16_t* next_row = nullptr) {
  const StreamPrefetch<uint16_t> prefetch(x, next_row);
  auto line = [&](int64_t j, __mmask32 m) NORMD_AVX512BW {
    const BFloat16Pair r =
        compute(WidenBFloat16Pair(_mm512_maskz_loadu_epi16(m, x + j)), j);
    return kNarrowPair(r.even, r.odd);
  };
  StreamHalfLineWriterAvx512<uint16_t, decltype(line), kStream>(
      prefetch.source, y, n, line, prefetch.ahead_bytes);
}

// The HalfAffineLanes computation of the 16-bit row x[0..n) into the 16-bit
// y[0..n), read from x itself (in cache: its statistics were just read) and
// narrowed in registers. bfloat16 is read as BFloat16Pairs (no word
// permutes), and a.weight / a.bias then hold each line's 32 values in pair
// order (see PairOrder), so with either of them every line must be whole.
// The same operations on the same values as StreamAffineRunToHalfAvx512 on
// the widened row: the same bits, without the widened row's stores and
// loads. kNarrow: NarrowBFloat16Pair or its Avx512Bf16 form for bfloat16,
// Float16x32 for float16.
template <bool kBFloat16, __m512i (*kNarrow)(__m512, __m512), bool kStream>
NORMD_AVX512BW void StreamHalfRowAvx512(const uint16_t* x, uint16_t* y,
                                        int64_t n, const StreamAffine& a,
                                        const uint16_t* next_row) {
  const HalfAffineLanes lanes(a);
  if constexpr (kBFloat16) {
    const auto all = static_cast<__mmask16>(0xFFFF);
    StreamBFloat16PairsAvx512<kNarrow, kStream>(
        x, y, n,
        [&](const BFloat16Pair& v, int64_t j) NORMD_AVX512BW {
          return BFloat16Pair{lanes.Of(v.even, j, all),
                              lanes.Of(v.odd, j + 16, all)};
        },
        next_row);
  } else {
    const StreamPrefetch<uint16_t> prefetch(x, next_row);
    StreamHalfLinesAvx512<kNarrow, kStream>(
        prefetch.source, y, n,
        [&](int64_t j, __mmask16 m) NORMD_AVX512BW {
          return lanes.Of(WidenLanes<FloatsOfFloat16x16>(x, j, m), j, m);
        },
        prefetch.ahead_bytes);
  }
}

// StreamHalfChannelRunAvx512 for bfloat16 in BFloat16Pairs (kNarrowPair:
// NarrowBFloat16Pair or its Avx512Bf16 form).
template <__m512i (*kNarrowPair)(__m512, __m512), bool kStream>
NORMD_AVX512BW void StreamBFloat16ChannelRunAvx512(
    const uint16_t* x, uint16_t* y, int64_t n, const ChannelParamsF32::One& k) {
  const __m512 hi = _mm512_set1_ps(k.hi);
  const __m512 scale = _mm512_set1_ps(k.scale);
  const __m512 shift = _mm512_set1_ps(k.shift);
  StreamBFloat16PairsAvx512<kNarrowPair, kStream>(
      x, y, n, [&](const BFloat16Pair& v, int64_t) NORMD_AVX512BW {
        return BFloat16Pair{ChannelAffineLanes(v.even, hi, scale, shift),
                            ChannelAffineLanes(v.odd, hi, scale, shift)};
      });
}

// StreamHalfChannelsLastRegistersAvx512 for bfloat16 in BFloat16Pairs: the
// parameters of each 32-value line split into even and odd vectors once.
template <int kLines, __m512i (*kNarrowPair)(__m512, __m512), bool kStream>
NORMD_AVX512BW void StreamBFloat16ChannelsLastRegistersAvx512(
    const uint16_t* x, uint16_t* y, int64_t n, const float* hi,
    const float* scale, const float* shift, bool prefetch_input) {
  alignas(64) static constexpr int32_t kEven[16] = {
      0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  alignas(64) static constexpr int32_t kOdd[16] = {
      1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  const __m512i even = _mm512_load_si512(kEven);
  const __m512i odd = _mm512_load_si512(kOdd);
  // Parameter p of line k: [2k] even, [2k + 1] odd values.
  auto split = [&](const float* p, __m512* out) NORMD_AVX512BW {
    for (int k = 0; k < kLines; ++k) {
      const __m512 a = _mm512_loadu_ps(p + 32 * k);
      const __m512 b = _mm512_loadu_ps(p + 32 * k + 16);
      out[2 * k] = _mm512_permutex2var_ps(a, even, b);
      out[2 * k + 1] = _mm512_permutex2var_ps(a, odd, b);
    }
  };
  __m512 h[2 * kLines], s[2 * kLines], b[2 * kLines];
  split(hi, h);
  split(scale, s);
  split(shift, b);
  for (int64_t j = 0; j < n; j += 32 * kLines) {
    if (prefetch_input) PrefetchStreamInput(x, j, 32 * kLines);
#pragma GCC unroll 3
    for (int k = 0; k < kLines; ++k) {
      const BFloat16Pair v = WidenBFloat16Pair(
          _mm512_loadu_si512(reinterpret_cast<const void*>(x + j + 32 * k)));
      StoreLine<kStream>(
          y + j + 32 * k,
          kNarrowPair(ChannelAffineLanes(v.even, h[2 * k], s[2 * k], b[2 * k]),
                      ChannelAffineLanes(v.odd, h[2 * k + 1], s[2 * k + 1],
                                         b[2 * k + 1])));
    }
  }
}

// Runs shorter than this (and at least 16 values, so that 16 lanes hold
// at most two channels) are streamed line by line across runs rather than
// run by run.
constexpr int64_t kShortChannelRun = 256;
bool HasShortRuns(const ChannelLayout& layout) {
  return layout.inner >= 16 && layout.inner < kShortChannelRun;
}

// Where element begin + j of a layout with short runs (16 <= inner <
// kShortChannelRun) is, for j moving by a few lines at a time in either
// direction, without a division per line; and the channel constants of its
// 16 lanes. Mutable, one per streaming loop: not shared between threads.
struct ShortRunCursor {
  ShortRunCursor(const ChannelLayout& layout, int64_t begin,
                 const ChannelParamsF32& params)
      : inner(layout.inner),
        channels(layout.channels),
        p(params),
        c((begin / layout.inner) % layout.channels),
        offset(begin % layout.inner) {}

  void MoveTo(int64_t j) {
    offset += j - at;
    at = j;
    for (; offset >= inner; offset -= inner) c = c + 1 == channels ? 0 : c + 1;
    for (; offset < 0; offset += inner) c = c == 0 ? channels - 1 : c - 1;
  }

  // ChannelAffineLanes of the 16 values v of elements begin + j..: each
  // lane with its own channel's constants (a masked blend where a run ends
  // within them).
  NORMD_AVX512 __m512 Affine(__m512 v, int64_t j) {
    MoveTo(j);
    __m512 hi = _mm512_set1_ps(p.hi[c]);
    __m512 scale = _mm512_set1_ps(p.scale[c]);
    __m512 shift = _mm512_set1_ps(p.shift[c]);
    const int64_t left = inner - offset;
    if (left < 16) {
      // Lanes from `left` on belong to the next channel.
      const auto later = static_cast<__mmask16>(0xFFFFu << left);
      const int64_t d = c + 1 == channels ? 0 : c + 1;
      hi = _mm512_mask_blend_ps(later, hi, _mm512_set1_ps(p.hi[d]));
      scale = _mm512_mask_blend_ps(later, scale, _mm512_set1_ps(p.scale[d]));
      shift = _mm512_mask_blend_ps(later, shift, _mm512_set1_ps(p.shift[d]));
    }
    return ChannelAffineLanes(v, hi, scale, shift);
  }

  const int64_t inner, channels;
  const ChannelParamsF32& p;
  int64_t at = 0;  // j of the element (c, offset) describes.
  int64_t c, offset;
};

// The channel affine of elements [begin, begin + n) of a layout with short
// runs, x[0..n) into y[0..n): whole lines of y streamed whatever runs they
// hold, instead of a streamed run per channel with masked stores at both of
// its ends (runs of 49 values, 7x7 images: every run). The same operations
// per element as ChannelAffineLanes, so the same bits. (Short runs are a
// shape_survey row: BatchNorm eval of 7x7 images.)
NORMD_AVX512 void StreamShortChannelRunsAvx512(const float* x, float* y,
                                               int64_t begin, int64_t n,
                                               const ChannelLayout& layout,
                                               const ChannelParamsF32& p) {
  ShortRunCursor cursor(layout, begin, p);
  StreamLinesAvx512(x, y, n, [&](int64_t j, __mmask16 m) NORMD_AVX512 {
    return cursor.Affine(_mm512_maskz_loadu_ps(m, x + j), j);
  });
}

// The same for 16-bit values, widened (kWiden) and narrowed (kNarrow32) in
// registers as StreamHalfChannelRunAvx512.
template <__m512 (*kWiden)(__m256i), __m512i (*kNarrow32)(__m512, __m512),
          bool kStream>
NORMD_AVX512BW void StreamHalfShortChannelRunsAvx512(
    const uint16_t* x, uint16_t* y, int64_t begin, int64_t n,
    const ChannelLayout& layout, const ChannelParamsF32& p) {
  ShortRunCursor cursor(layout, begin, p);
  StreamHalfLinesAvx512<kNarrow32, kStream>(
      x, y, n, [&](int64_t j, __mmask16 m) NORMD_AVX512BW {
        return cursor.Affine(WidenLanes<kWiden>(x, j, m), j);
      });
}

// The half channel-affine bodies for one 16-bit dtype.
struct HalfChannelStreams {
  void (*run)(const uint16_t*, uint16_t*, int64_t,
              const ChannelParamsF32::One&);
  void (*short_runs)(const uint16_t*, uint16_t*, int64_t, int64_t,
                     const ChannelLayout&, const ChannelParamsF32&);
  void (*channels_last)(const uint16_t*, uint16_t*, int64_t, const float*,
                        const float*, const float*);
  // Registers, by lcm(channels, 32) / 32 - 1 (1, 2 or 3 lines).
  void (*registers[3])(const uint16_t*, uint16_t*, int64_t, const float*,
                       const float*, const float*, bool);
};

template <__m512 (*kWiden)(__m256i), __m512i (*kNarrow32)(__m512, __m512),
          bool kStream>
constexpr HalfChannelStreams kHalfChannelStreamsOf = {
    StreamHalfChannelRunAvx512<kWiden, kNarrow32, kStream>,
    StreamHalfShortChannelRunsAvx512<kWiden, kNarrow32, kStream>,
    StreamHalfChannelsLastRunAvx512<kWiden, kNarrow32, kStream>,
    {StreamHalfChannelsLastRegistersAvx512<2, kWiden, kNarrow32, kStream>,
     StreamHalfChannelsLastRegistersAvx512<4, kWiden, kNarrow32, kStream>,
     StreamHalfChannelsLastRegistersAvx512<6, kWiden, kNarrow32, kStream>}};

template <__m512i (*kNarrow32)(__m512, __m512),
          __m512i (*kNarrowPair)(__m512, __m512), bool kStream>
constexpr HalfChannelStreams kBFloat16ChannelStreams = {
    StreamBFloat16ChannelRunAvx512<kNarrowPair, kStream>,
    StreamHalfShortChannelRunsAvx512<FloatsOfBFloat16x16, kNarrow32, kStream>,
    StreamHalfChannelsLastRunAvx512<FloatsOfBFloat16x16, kNarrow32, kStream>,
    {StreamBFloat16ChannelsLastRegistersAvx512<1, kNarrowPair, kStream>,
     StreamBFloat16ChannelsLastRegistersAvx512<2, kNarrowPair, kStream>,
     StreamBFloat16ChannelsLastRegistersAvx512<3, kNarrowPair, kStream>}};

// kernel.template operator()<kBFloat16, kNarrow32, kNarrowPair>() for the
// narrowings of `dtype` (kBFloat16: whether it is bfloat16): 32 fp32
// results in natural order (kNarrow32) and, for bfloat16, in BFloat16Pair
// order (kNarrowPair; float16 gets kNarrow32 again); with the AVX512-BF16
// instruction where CpuHasAvx512Bf16(), and without the canonical-NaN fix-up
// when `never_nan` (the caller proved that no result is NaN: see
// HalfRowsJob::NeverNaN, ChannelAffineHalfKernel).
template <typename Kernel>
auto ForNarrowings(DType dtype, bool never_nan, const Kernel& kernel) {
  if (dtype == DType::kBFloat16) {
    if (CpuHasAvx512Bf16()) {
      return never_nan ? kernel.template
                         operator()<true, BFloat16x32Avx512Bf16<false>,
                                    NarrowBFloat16PairAvx512Bf16<false>>()
                       : kernel.template
                         operator()<true, BFloat16x32Avx512Bf16<true>,
                                    NarrowBFloat16PairAvx512Bf16<true>>();
    }
    return never_nan ? kernel.template operator()<true, BFloat16x32<false>,
                                                  NarrowBFloat16Pair<false>>()
                     : kernel.template operator()<true, BFloat16x32<true>,
                                                  NarrowBFloat16Pair<true>>();
  }
  return never_nan ? kernel.template
                     operator()<false, Float16x32<false>, Float16x32<false>>()
                   : kernel.template
                     operator()<false, Float16x32<true>, Float16x32<true>>();
}

// Only where CpuHasAvx512Bw(). `never_nan` as for ForNarrowings. `stream`:
// streaming stores (the caller fences), else ordinary ones.
const HalfChannelStreams& HalfChannelStreamsFor(DType dtype, bool never_nan,
                                                bool stream) {
  return *ForNarrowings(
      dtype, never_nan,
      [&]<bool kBFloat16, auto kNarrow32, auto kNarrowPair>()
          ->const HalfChannelStreams* {
            return ForStore(stream, [&]<bool kStream>() {
              if constexpr (kBFloat16) {
                return &kBFloat16ChannelStreams<kNarrow32, kNarrowPair,
                                                kStream>;
              } else {
                return &kHalfChannelStreamsOf<FloatsOfFloat16x16, kNarrow32,
                                              kStream>;
              }
            });
          });
}

// The channel affine of the 16-bit elements [begin, end) of x into y
// (same positions), widened and narrowed in registers, with streaming
// stores (`stream`; the caller fences) or ordinary ones (outputs that stay
// in the cache: twice as fast as widening a staging piece, running the fp32
// loop and narrowing it, bf16 in L2 on one thread); false if the CPU
// cannot. Channels-last (inner == 1) as StreamChannelsLastRuns: the
// 64-byte-aligned middle with the parameters in registers when they repeat
// within 96 elements (lcm(channels, 32) <= 96: 1-4, 6, 8, 12, 16, 24, 32, 48
// or 64 channels; x prefetched ahead if `prefetch_input`), else (and at the
// ends) per-element parameter loads.
bool StreamHalfChannelRange(DType dtype, const uint16_t* x, uint16_t* y,
                            int64_t begin, int64_t end,
                            const ChannelLayout& layout, int64_t period,
                            const ChannelParamsF32& p, bool never_nan,
                            bool prefetch_input, bool stream) {
  if (!CpuHasAvx512Bw()) return false;
  const HalfChannelStreams& f = HalfChannelStreamsFor(dtype, never_nan, stream);
  const int64_t channels = layout.channels;
  if (HasShortRuns(layout)) {
    f.short_runs(x + begin, y + begin, begin, end - begin, layout, p);
    return true;
  }
  if (layout.inner > 1) {
    for (int64_t pos = begin; pos < end;) {
      const int64_t c = (pos / layout.inner) % channels;
      const int64_t run =
          std::min(layout.inner - pos % layout.inner, end - pos);
      f.run(x + pos, y + pos, run, p.Constants(c));
      pos += run;
    }
    return true;
  }
  auto per_element = [&](int64_t from, int64_t to) {
    for (int64_t pos = from; pos < to; pos += period) {
      const int64_t phase = pos % channels;
      f.channels_last(x + pos, y + pos, std::min(period, to - pos),
                      p.hi + phase, p.scale + phase, p.shift + phase);
    }
  };
  SplitChannelsLast(begin, end, reinterpret_cast<uintptr_t>(y + begin),
                    sizeof(uint16_t), channels, period, /*unit=*/32,
                    /*max_repeat=*/96, per_element,
                    [&](int64_t from, int64_t to, int64_t repeat) {
                      const int64_t phase = from % channels;
                      f.registers[repeat / 32 - 1](
                          x + from, y + from, to - from, p.hi + phase,
                          p.scale + phase, p.shift + phase, prefetch_input);
                    });
  return true;
}

// Streams one run if the CPU can; false means the caller must write it.
bool StreamAffineRun(const float* x, float* y, int64_t n, const StreamAffine& a,
                     const float* next_row) {
  if (!CpuHasAvx512F()) return false;
  StreamAffineRunAvx512(x, y, n, a, next_row);
  return true;
}

// The same for one channel's run.
bool StreamChannelRun(const float* x, float* y, int64_t n,
                      const ChannelParamsF32::One& k) {
  if (!CpuHasAvx512F()) return false;
  StreamChannelRunAvx512(x, y, n, k);
  return true;
}

// StreamChannelsLastRunAvx512 with `stream` as kStream.
void StreamChannelsLastPerElement(const float* x, float* y, int64_t n,
                                  const float* hi, const float* scale,
                                  const float* shift, bool stream) {
  ForStore(stream, [&]<bool kStream>() {
    return StreamChannelsLastRunAvx512<kStream>;
  })(x, y, n, hi, scale, shift);
}

// kernel.template operator()<kNarrow32, kStream>() for the natural-order
// narrowing of `dtype` (see ForNarrowings) and the store kind (see
// ForStore).
template <typename Kernel>
auto ForNarrowing(DType dtype, bool never_nan, bool stream,
                  const Kernel& kernel) {
  return ForNarrowings(
      dtype, never_nan, [&]<bool, auto kNarrow32, auto>() {
        return ForStore(stream, [&]<bool kStream>() {
          return kernel.template operator()<kNarrow32, kStream>();
        });
      });
}

// StreamAffineRunToHalfAvx512 for `dtype`; only where CpuHasAvx512Bw().
// `never_nan` and `stream` as for ForNarrowing.
void StreamAffineRunToHalf(DType dtype, const float* x, uint16_t* y, int64_t n,
                           const StreamAffine& a, bool never_nan,
                           const uint16_t* next_row, bool stream) {
  ForNarrowing(
      dtype, never_nan, stream, []<auto kNarrow32, bool kStream>() {
        return StreamAffineRunToHalfAvx512<kNarrow32, kStream>;
      })(x, y, n, a, next_row);
}

// StreamAffineRunToHalfAvx512's computation for a row of whole lines (n a
// multiple of 32, y 64-byte aligned) without its line bookkeeping, for
// short rows; `ahead` (n 16-bit values, or null) is read into cache a line
// per line written.
template <__m512i (*kNarrow32)(__m512, __m512), bool kStream>
NORMD_AVX512BW void StreamHalfRowLinesAvx512(const float* x, uint16_t* y,
                                             int64_t n, const StreamAffine& a,
                                             const uint16_t* ahead) {
  const HalfAffineLanes lanes(a);
  const auto all = static_cast<__mmask16>(0xFFFF);
  for (int64_t j = 0; j < n; j += 32) {
    if (ahead != nullptr) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead + j), _MM_HINT_T0);
    }
    StoreLine<kStream>(
        y + j, kNarrow32(lanes.At(x, j, all), lanes.At(x, j + 16, all)));
  }
}

// StreamHalfRowLinesAvx512 for `dtype`; only where CpuHasAvx512Bw().
// `never_nan` and `stream` as for ForNarrowing.
void StreamHalfRowLines(DType dtype, const float* x, uint16_t* y, int64_t n,
                        const StreamAffine& a, bool never_nan,
                        const uint16_t* ahead, bool stream) {
  ForNarrowing(
      dtype, never_nan, stream, []<auto kNarrow32, bool kStream>() {
        return StreamHalfRowLinesAvx512<kNarrow32, kStream>;
      })(x, y, n, a, ahead);
}

// StreamHalfRowAvx512 for `dtype`; only where CpuHasAvx512Bw(). `never_nan`
// and `stream` as for StreamAffineRunToHalf.
void StreamHalfRow(DType dtype, const uint16_t* x, uint16_t* y, int64_t n,
                   const StreamAffine& a, bool never_nan,
                   const uint16_t* next_row, bool stream) {
  ForNarrowings(
      dtype, never_nan, [&]<bool kBFloat16, auto, auto kNarrowPair>() {
        return ForStore(stream, [&]<bool kStream>() {
          return StreamHalfRowAvx512<kBFloat16, kNarrowPair, kStream>;
        });
      })(x, y, n, a, next_row);
}

void StreamFence() { _mm_sfence(); }
#else
void StreamChannelsLastPerElement(const float*, float*, int64_t, const float*,
                                  const float*, const float*, bool) {}
void StreamChannelsLastRepeating(const float*, float*, int64_t, int64_t,
                                 const float*, const float*, const float*, bool,
                                 bool) {}
bool StreamAffineRun(const float*, float*, int64_t, const StreamAffine&,
                     const float*) {
  return false;
}
bool StreamChannelRun(const float*, float*, int64_t,
                      const ChannelParamsF32::One&) {
  return false;
}
bool StreamHalfChannelRange(DType, const uint16_t*, uint16_t*, int64_t, int64_t,
                            const ChannelLayout&, int64_t,
                            const ChannelParamsF32&, bool, bool, bool) {
  return false;
}
void StreamAffineRunToHalf(DType, const float*, uint16_t*, int64_t,
                           const StreamAffine&, bool, const uint16_t*, bool) {}
void StreamHalfRowLines(DType, const float*, uint16_t*, int64_t,
                        const StreamAffine&, bool, const uint16_t*, bool) {}
void StreamHalfRow(DType, const uint16_t*, uint16_t*, int64_t,
                   const StreamAffine&, bool, const uint16_t*, bool) {}
void StreamFence() {}
#endif

// p + j, or null for a null p (optional per-element parameters).
template <typename T>
const T* OffsetOrNull(const T* p, int64_t j) {
  return p == nullptr ? nullptr : p + j;
}

// The per-call affine parameters in the element type of the data.
template <typename T>
struct AffineParams {
  AffineParams(const double* w, const double* b, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      if (w != nullptr) weight_storage.assign(w, w + n);
      if (b != nullptr) bias_storage.assign(b, b + n);
      weight = w == nullptr ? nullptr : weight_storage.data();
      bias = b == nullptr ? nullptr : bias_storage.data();
    } else {
      weight = w;
      bias = b;
    }
  }
  std::vector<T> weight_storage;
  std::vector<T> bias_storage;
  const T* weight;
  const T* bias;
};

// `affine` for StreamHalfRow's bfloat16 (n a multiple of 32): each 32 values in
// pair order, the 16 even elements and then the 16 odd, as BFloat16Pair's
// lanes hold them.
AffineParams<float> PairOrder(const AffineParams<float>& affine, int64_t n) {
  AffineParams<float> paired(nullptr, nullptr, 0);
  auto order = [n](const float* from, std::vector<float>& to) -> const float* {
    if (from == nullptr) return nullptr;
    to.resize(n);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t k = j % 32;
      to[j - k + k % 2 * 16 + k / 2] = from[j];
    }
    return to.data();
  };
  paired.weight = order(affine.weight, paired.weight_storage);
  paired.bias = order(affine.bias, paired.bias_storage);
  return paired;
}

void AffineRow(const float* x, float* y, int64_t n, double mean, double scale,
               const float* weight, const float* bias) {
  const SplitMean split(mean);
  FloatRowAffine(x, y, n, split.hi, split.lo, static_cast<float>(scale), weight,
                 bias);
}
void AffineRow(const double* x, double* y, int64_t n, double mean, double scale,
               const double* weight, const double* bias) {
  DoubleRowAffine(x, y, n, mean, scale, weight, bias);
}

// The fp32 results of a 16-bit row (see HalfRowAffine in simd/row_affine.h).
void AffineRowHalf(const float* x, float* y, int64_t n, const StreamAffine& a) {
  HalfRowAffine(x, y, n, a.hi, a.lo, a.scale, a.weight, a.bias);
}

// Elements per channels-last period: a multiple of the channel count, long
// enough that the loop over one period vectorizes well.
int64_t ChannelsLastPeriod(int64_t channels, int64_t outer) {
  constexpr int64_t kMinPeriod = 1024;
  return channels *
         std::max<int64_t>(1, std::min(kMinPeriod / channels, outer));
}

// The period of the channel kernels' parameter arrays for `layout`:
// ChannelsLastPeriod channels-last, else the channel count.
int64_t ParamsPeriod(const ChannelLayout& layout) {
  return layout.inner == 1 ? ChannelsLastPeriod(layout.channels, layout.outer)
                           : layout.channels;
}

// values[c] repeated over period + channels entries: entry i is
// values[i % channels].
template <typename T>
std::vector<T> ExpandChannelsLast(std::vector<T> values, int64_t period) {
  const int64_t channels = static_cast<int64_t>(values.size());
  values.resize(period + channels);
  for (int64_t i = channels; i < period + channels; ++i) {
    values[i] = values[i - channels];
  }
  return values;
}

// y = (x - mean[c]) * scale[c] + shift[c] in fp64.
struct ChannelParamsF64 {
  const double* mean;
  const double* scale;
  const double* shift;
};

// The cached channel affines (simd/channel_affine.h) with their parameters.
void ChannelAffineRangeF32(const float* x, float* out, int64_t begin,
                           int64_t end, int64_t channels, int64_t inner,
                           int64_t period, const ChannelParamsF32& p) {
  FloatChannelAffineRange(x, out, begin, end, channels, inner, period, p.hi,
                          p.scale, p.shift);
}

void ChannelAffineRangeF64(const double* x, double* out, int64_t begin,
                           int64_t end, int64_t channels, int64_t inner,
                           int64_t period, const ChannelParamsF64& p) {
  DoubleChannelAffineRange(x, out, begin, end, channels, inner, period, p.mean,
                           p.scale, p.shift);
}

// Per-thread buffers: outputs are computed into kOutputSlot before
// StreamCopy; scattered inputs are copied into kInputSlot.
enum StagingSlot { kOutputSlot, kInputSlot };
template <typename T, StagingSlot kSlot = kOutputSlot>
T* Staging(int64_t elements) {
  thread_local std::vector<T> buffer;
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(elements);
  return buffer.data();
}

double RowScale(const Moments& moments, double eps, LayerNormStyle style) {
  switch (style) {
    case LayerNormStyle::kBertUnbiasedStd:
      return 1.0 / (std::sqrt(moments.UnbiasedVariance()) + eps);
    case LayerNormStyle::kRms:
      // mean(x^2) = M2 / n + mean^2, both exact in fp64.
      return 1.0 / std::sqrt(moments.BiasedVariance() +
                             moments.mean * moments.mean + eps);
    case LayerNormStyle::kPyTorch:
      break;
  }
  return 1.0 / std::sqrt(moments.BiasedVariance() + eps);
}

// What a row kernel subtracts before scaling: the mean, or 0 for RMSNorm.
double RowCenter(const Moments& moments, LayerNormStyle style) {
  return style == LayerNormStyle::kRms ? 0.0 : moments.mean;
}

// The fp32 affine of one row with these moments.
StreamAffine RowAffine(const Moments& moments, double eps, LayerNormStyle style,
                       const AffineParams<float>& affine) {
  const SplitMean mean(RowCenter(moments, style));
  return StreamAffine{mean.hi, mean.lo,
                      static_cast<float>(RowScale(moments, eps, style)),
                      affine.weight, affine.bias};
}

}  // namespace

#ifdef NORMD_HALF_AVX512
// The StreamAffine of each of up to 16 rows (RowAffine without weights or
// biases), computed in fp64 vectors: the same operations in lanes (the
// conversions to float round to nearest, as casts do), so the same bits,
// without a square root and two divisions in a row per row. A value, built
// and read by one thread.
struct ShortRowAffines {
  NORMD_AVX512 ShortRowAffines(const Moments* moments, int count, double eps,
                               LayerNormStyle style) {
    alignas(64) double mean[16] = {};
    alignas(64) double m2[16] = {};
    for (int k = 0; k < count; ++k) {
      mean[k] = moments[k].mean;
      m2[k] = moments[k].m2;
    }
    const double n = static_cast<double>(moments[0].count);
    const __m512d one = _mm512_set1_pd(1.0);
    const __m512d epsilon = _mm512_set1_pd(eps);
    for (int h = 0; h < 2; ++h) {
      const __m512d mu = _mm512_load_pd(mean + 8 * h);
      const __m512d q = _mm512_load_pd(m2 + 8 * h);
      const __m512d center =
          style == LayerNormStyle::kRms ? _mm512_setzero_pd() : mu;
      const __m256 high = _mm512_cvtpd_ps(center);
      const __m256 low =
          _mm512_cvtpd_ps(_mm512_sub_pd(center, _mm512_cvtps_pd(high)));
      __m512d root;
      switch (style) {
        case LayerNormStyle::kBertUnbiasedStd:
          root = _mm512_add_pd(
              _mm512_sqrt_pd(_mm512_div_pd(q, _mm512_set1_pd(n - 1.0))),
              epsilon);
          break;
        case LayerNormStyle::kRms:
          root = _mm512_sqrt_pd(
              _mm512_add_pd(_mm512_add_pd(_mm512_div_pd(q, _mm512_set1_pd(n)),
                                          _mm512_mul_pd(mu, mu)),
                            epsilon));
          break;
        case LayerNormStyle::kPyTorch:
        default:
          root = _mm512_sqrt_pd(
              _mm512_add_pd(_mm512_div_pd(q, _mm512_set1_pd(n)), epsilon));
          break;
      }
      _mm256_store_ps(hi + 8 * h, high);
      _mm256_store_ps(lo + 8 * h, low);
      _mm256_store_ps(scale + 8 * h, _mm512_cvtpd_ps(_mm512_div_pd(one, root)));
    }
  }

  // Row k's StreamAffine with these weights and biases.
  StreamAffine Of(int k, const AffineParams<float>& affine) const {
    return StreamAffine{hi[k], lo[k], scale[k], affine.weight, affine.bias};
  }

  alignas(32) float hi[16];
  alignas(32) float lo[16];
  alignas(32) float scale[16];
};

// Short rows (n a multiple of 16, at most 128: HasShortRowMoments16) sixteen at
// a time: their moments with the folds done across the rows, then each row
// written whole lines at a time (y 64-byte aligned). The bits of the row
// at a time loop below (ContiguousMoments, RowAffine, StreamAffineRun),
// without its per-row folds, calls and line bookkeeping, which dominate
// rows of 16-128 values (shape_survey's short-row LayerNorm rows).
NORMD_AVX512 void StreamShortRowsAvx512(const float* x, float* y, int64_t count,
                                        int64_t n, double eps,
                                        LayerNormStyle style,
                                        const AffineParams<float>& affine) {
  Moments moments[16];
  for (int64_t r0 = 0; r0 < count; r0 += 16) {
    const int rows = static_cast<int>(std::min<int64_t>(16, count - r0));
    ShortRowMoments16(x + r0 * n, n, rows, moments);
    // The next batch is read into cache as this one is written, one line
    // ahead per line written (as StreamAffineRun reads the next row).
    const int64_t next = r0 + 16;
    const int64_t next_end = std::min(count, next + 16) * n;
    const ShortRowAffines runs(moments, rows, eps, style);
    for (int k = 0; k < rows; ++k) {
      const StreamAffine run = runs.Of(k, affine);
      const StreamAffineLanes lanes(run);
      const float* xr = x + (r0 + k) * n;
      float* yr = y + (r0 + k) * n;
      for (int64_t j = 0; j < n; j += 16) {
        if ((next + k) * n + j < next_end) {
          _mm_prefetch(reinterpret_cast<const char*>(xr + 16 * n + j),
                       _MM_HINT_T0);
        }
        _mm512_stream_ps(yr + j,
                         lanes.At(xr, j, static_cast<__mmask16>(0xFFFF)));
      }
    }
  }
}
#endif

// StreamShortRowsAvx512 where it applies; false (nothing written) if not.
bool StreamShortRows(const float* x, float* y, int64_t count, int64_t n,
                     double eps, LayerNormStyle style,
                     const AffineParams<float>& affine) {
#ifdef NORMD_HALF_AVX512
  if (count < 1 || reinterpret_cast<uintptr_t>(y) % 64 != 0 ||
      !HasShortRowMoments16(n)) {
    return false;
  }
  StreamShortRowsAvx512(x, y, count, n, eps, style, affine);
  return true;
#else
  return false;
#endif
}

// LayerNorm of `count` fp32 rows from x straight to y with streaming stores
// (the caller fences); false (nothing written) if the CPU cannot. `after`:
// the input row that this thread reads next, if known (see StreamPrefetch).
bool StreamRows(const float* x, float* y, int64_t count, int64_t n, double eps,
                LayerNormStyle style, const AffineParams<float>& affine,
                const float* after) {
  if (StreamShortRows(x, y, count, n, eps, style, affine)) return true;
  for (int64_t r = 0; r < count; ++r) {
    const Moments moments = ContiguousMoments(x + r * n, n);
    const StreamAffine run = RowAffine(moments, eps, style, affine);
    const float* next_row = r + 1 < count ? x + (r + 1) * n : after;
    if (!StreamAffineRun(x + r * n, y + r * n, n, run, next_row)) return false;
  }
  return true;
}

template <typename T>
void LayerNormKernel(const InputSource<T>& source, T* y, const RowLayout& rows,
                     double eps, LayerNormStyle style, const double* weight,
                     const double* bias) {
  const int64_t n = rows.row_size;
  if (rows.rows == 0 || n == 0) return;
  const AffineParams<T> affine(weight, bias, n);
  const bool stream = StreamOutput(rows.rows * n, sizeof(T));
  // Long rows one at a time, each spread over every thread: two parallel
  // loops per row, and a row reduced on one core is written by another.
  // With enough rows, whole rows per work item instead, so that a row is
  // reduced and written by the same core (shape_survey's long LayerNorm
  // rows).
  const bool whole_long_rows =
      source.data != nullptr &&
      n * static_cast<int64_t>(sizeof(T)) <= kMaxWholeLongRowBytes &&
      rows.rows >= kWholeLongRowsPerThread * ComputeConcurrency();
  if (n >= kLongLayerNormRow && !whole_long_rows) {
    const T* x = source.data;
    for (int64_t r = 0; r < rows.rows; ++r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      const Moments moments = ContiguousMoments(xr, n);
      const double scale = RowScale(moments, eps, style);
      ParallelFor(tbb::blocked_range<int64_t>(0, n, kApplyChunk), n,
                  [&](const tbb::blocked_range<int64_t>& range) {
                    for (int64_t j = range.begin(); j < range.end();
                         j += kStagingElements) {
                      const int64_t len =
                          std::min(range.end() - j, kStagingElements);
                      T* out = stream ? Staging<T>(kStagingElements) : yr + j;
                      AffineRow(xr + j, out, len, RowCenter(moments, style),
                                scale, OffsetOrNull(affine.weight, j),
                                OffsetOrNull(affine.bias, j));
                      if (stream) StreamCopy(yr + j, out, len * sizeof(T));
                    }
                  });
    }
    return;
  }
  // Short rows: whole rows per work item, in pieces of as many rows as fit
  // the staging buffers (scattered input is copied in, streamed output
  // computed there first unless it can be streamed directly).
  const int64_t rows_per_item = std::max<int64_t>(1, kApplyChunk / n);
  const int64_t rows_per_piece = std::max<int64_t>(1, kStagingElements / n);
  ParallelFor(
      tbb::blocked_range<int64_t>(0, rows.rows, rows_per_item), rows.rows * n,
      [&](const tbb::blocked_range<int64_t>& range) {
        // Long rows' statistics on this thread too (whole_long_rows: every
        // thread has rows of its own).
        const SerialLoopsScope serial;
        T* in = source.data != nullptr
                    ? nullptr
                    : Staging<T, kInputSlot>(rows_per_piece * n);
        bool fence = false;
        for (int64_t r0 = range.begin(); r0 < range.end();
             r0 += rows_per_piece) {
          const int64_t r1 = std::min(range.end(), r0 + rows_per_piece);
          const T* x = source.Read(r0 * n, (r1 - r0) * n, in);
          if constexpr (std::is_same_v<T, float>) {
            // One fence per work item: fencing every few rows stalls on
            // the write-combining buffers.
            if (stream &&
                StreamRows(x, y + r0 * n, r1 - r0, n, eps, style, affine,
                           source.data != nullptr && r1 < range.end()
                               ? source.data + r1 * n
                               : nullptr)) {
              fence = true;
              continue;
            }
          }
          T* out = stream ? Staging<T>(rows_per_piece * n) : y + r0 * n;
          // Short fp32 rows' moments sixteen rows at a time (the same bits
          // as a row at a time, see ShortRowMoments16).
          const int64_t batch =
              std::is_same_v<T, float> && HasShortRowMoments16(n) ? 16 : 1;
          Moments moments[16];
          for (int64_t b = 0; b < r1 - r0; b += batch) {
            const int count = static_cast<int>(std::min(batch, r1 - r0 - b));
            if constexpr (std::is_same_v<T, float>) {
              if (batch > 1) ShortRowMoments16(x + b * n, n, count, moments);
            }
            if (batch == 1) moments[0] = ContiguousMoments(x + b * n, n);
            for (int k = 0; k < count; ++k) {
              const int64_t r = b + k;
              AffineRow(x + r * n, out + r * n, n, RowCenter(moments[k], style),
                        RowScale(moments[k], eps, style), affine.weight,
                        affine.bias);
            }
          }
          if (stream) StreamCopy(y + r0 * n, out, (r1 - r0) * n * sizeof(T));
        }
        if (fence) StreamFence();
      });
}

namespace {

// What every work item of LayerNormHalfKernel needs.
struct HalfRowsJob {
  DType dtype;
  const uint16_t* x;
  uint16_t* y;
  int64_t n;  // Row length.
  double eps;
  LayerNormStyle style;
  const AffineParams<float>& affine;
  int64_t rows_per_piece;
  // Widened, computed and narrowed in registers (AVX-512 BW), with streaming
  // stores when `stream` (large outputs, see StreamOutput), else ordinary
  // ones: faster than widening a piece, running the fp32 loop, then
  // narrowing it (kernel_bench BM_HalfRequests).
  bool fused;
  bool stream;
  bool finite_affine;  // Every weight and bias (as float) is finite.
  // Fused, computed from the 16-bit rows themselves (StreamHalfRow) with
  // `direct_affine` (bfloat16: in pair order, see PairOrder).
  bool direct;
  const AffineParams<float>& direct_affine;

  // True when no result of a row can be NaN: its values are finite and
  // deviate from the mean by less than 1e37 (DeviationsBounded), so x - hi
  // is finite; scale and lo * scale are finite; the affine
  // parameters are finite. Every operation of HalfAffineLanes then has
  // finite operands, and such operations give finite or infinite results,
  // never NaN (RMSNorm subtracts 0: x itself is finite).
  bool NeverNaN(const Moments& moments, const StreamAffine& run) const {
    return finite_affine && DeviationsBounded(moments) &&
           std::isfinite(run.scale) && std::isfinite(run.lo * run.scale);
  }

  // Whether Run takes rows sixteen at a time (RunShortRows): fused rows
  // short enough for ShortRowMoments16, in whole 64-byte lines of y.
  bool ShortRows() const {
    return fused && n % 32 == 0 && HasShortRowMoments16(n) &&
           reinterpret_cast<uintptr_t>(y) % 64 == 0;
  }

  // Rows [begin, end) sixteen at a time, as StreamShortRows does fp32 rows:
  // widened into `widened` (16 n floats), their moments with
  // ShortRowMoments16, then each row narrowed and written (streamed if
  // `stream`) from its widened values while the next sixteen rows are read into
  // cache. The bits of a row at a time (the widened path below), without its
  // per-row folds and calls, which dominate short rows (shape_survey's
  // 16-bit short rows).
  void RunShortRows(int64_t begin, int64_t end, float* widened) const {
#ifdef NORMD_HALF_AVX512
    Moments moments[16];
    for (int64_t r0 = begin; r0 < end; r0 += 16) {
      const int rows = static_cast<int>(std::min<int64_t>(16, end - r0));
      WidenHalf(dtype, x + r0 * n, widened, rows * n);
      ShortRowMoments16(widened, n, rows, moments);
      const ShortRowAffines runs(moments, rows, eps, style);
      for (int k = 0; k < rows; ++k) {
        const int64_t r = r0 + k;
        const StreamAffine run = runs.Of(k, affine);
        StreamHalfRowLines(dtype, widened + k * n, y + r * n, n, run,
                           NeverNaN(moments[k], run),
                           r + 16 < end ? x + (r + 16) * n : nullptr, stream);
      }
    }
    if (stream) StreamFence();
#endif
  }

  // Rows [begin, end), a piece at a time.
  void Run(int64_t begin, int64_t end) const {
    const bool short_batches = ShortRows();
    // The widened piece and (unless fused) its results, or (direct) one
    // statistics block's scratch, or (short_batches) sixteen widened rows;
    // 64-byte aligned, so that full-vector loads never split lines.
    const int64_t piece = short_batches ? 16 * n
                          : direct      ? std::min(n, kMomentsBlock)
                                        : (rows_per_piece * n + 15) / 16 * 16;
    thread_local std::vector<float> storage;
    if (static_cast<int64_t>(storage.size()) < 2 * piece + 16) {
      storage.resize(2 * piece + 16);
    }
    float* const buffer = reinterpret_cast<float*>(
        (reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t{63});
    float* const results = buffer + piece;
    if (short_batches) {
      RunShortRows(begin, end, buffer);
      return;
    }
    // Short rows without AVX-512 BW: the piece widened at once, their
    // moments sixteen rows at a time (the same bits as WidenWithMoments row
    // by row).
    const bool short_rows = !fused && !direct && HasShortRowMoments16(n);
    for (int64_t r0 = begin; r0 < end; r0 += rows_per_piece) {
      const int64_t count = std::min(end - r0, rows_per_piece);
      if (short_rows) {
        WidenHalf(dtype, x + r0 * n, buffer, count * n);
        Moments moments[16];
        for (int64_t b = 0; b < count; b += 16) {
          const int rows = static_cast<int>(std::min<int64_t>(16, count - b));
          ShortRowMoments16(buffer + b * n, n, rows, moments);
          for (int k = 0; k < rows; ++k) {
            AffineRowHalf(buffer + (b + k) * n, results + (b + k) * n, n,
                          RowAffine(moments[k], eps, style, affine));
          }
        }
        NarrowToHalf(dtype, results, y + r0 * n, count * n);
        continue;
      }
      for (int64_t r = 0; r < count; ++r) {
        const int64_t next = r0 + r + 1;
        const uint16_t* const next_row = next < end ? x + next * n : nullptr;
        if (direct) {
          const uint16_t* const in = x + (r0 + r) * n;
          const Moments moments = HalfMoments(dtype, in, buffer, n);
          const StreamAffine run =
              RowAffine(moments, eps, style, direct_affine);
          StreamHalfRow(dtype, in, y + (r0 + r) * n, n, run,
                        NeverNaN(moments, run), next_row, stream);
          continue;
        }
        float* const row = buffer + r * n;
        const Moments moments =
            WidenWithMoments(dtype, x + (r0 + r) * n, row, n);
        const StreamAffine run = RowAffine(moments, eps, style, affine);
        if (fused) {
          // The next row of this work item, read while this one's
          // stores drain (see StreamPrefetch).
          StreamAffineRunToHalf(dtype, row, y + (r0 + r) * n, n, run,
                                NeverNaN(moments, run), next_row, stream);
        } else {
          AffineRowHalf(row, results + r * n, n, run);
        }
      }
      if (!fused) NarrowToHalf(dtype, results, y + r0 * n, count * n);
    }
    // One fence per work item, as in LayerNormKernel.
    if (stream) StreamFence();
  }
};

}  // namespace

// True when the fused 16-bit rows x -> y (rows of n values) should be
// computed from x itself (StreamHalfRow) rather than from a widened copy,
// which saves the copy's traffic (kernel_bench BM_HalfRows and
// BM_HalfLayerNormAffine). Not for bfloat16 with weights or biases in
// lines the rows do not fill (n not a multiple of 32 or y not 64-byte
// aligned). Nor when y sits less than 512 bytes above x modulo 4 KiB: loads
// of x then look like (4K-aliasing) overlaps of the streaming stores just
// issued to y and wait for them (the widened copy is not affected).
bool ReadsHalfRowsDirectly(DType dtype, const uint16_t* x, const uint16_t* y,
                           int64_t n, const AffineParams<float>& affine) {
  const auto x_address = reinterpret_cast<uintptr_t>(x);
  const auto y_address = reinterpret_cast<uintptr_t>(y);
  constexpr uintptr_t kPage = 4096;
  constexpr uintptr_t kAliasWindow = 512;
  const uintptr_t y_above_x = (y_address - x_address) % kPage;
  if (y_above_x > 0 && y_above_x < kAliasWindow) return false;
  return dtype != DType::kBFloat16 ||
         (affine.weight == nullptr && affine.bias == nullptr) ||
         (n % 32 == 0 && y_address % 64 == 0);
}

// 16-bit rows one at a time, each spread over every thread (rows too long
// for HalfRowsJob's per-thread buffers, or long and too few to give every
// thread several): the row's HalfMoments blocks in parallel, merged in
// order (the same moments), then its outputs in parallel pieces, each
// widened a staging buffer at a time and narrowed as written (in registers
// when job.fused, streamed when job.stream); the same per-element operations
// as HalfRowsJob. (Widening such rows whole into a fresh fp32 tensor, as
// before, cost many times a copy: shape_survey's 16-bit long rows.)
void LongHalfRows(const HalfRowsJob& job, int64_t num_rows) {
  const int64_t n = job.n;
  const int64_t num_blocks = (n + kMomentsBlock - 1) / kMomentsBlock;
  std::vector<Moments> parts(num_blocks);
  for (int64_t r = 0; r < num_rows; ++r) {
    const uint16_t* const xr = job.x + r * n;
    uint16_t* const yr = job.y + r * n;
    ParallelFor(tbb::blocked_range<int64_t>(0, num_blocks), n,
                [&](const tbb::blocked_range<int64_t>& range) {
                  float* const scratch = Staging<float>(kMomentsBlock);
                  for (int64_t b = range.begin(); b < range.end(); ++b) {
                    const int64_t begin = b * kMomentsBlock;
                    parts[b] = HalfMoments(job.dtype, xr + begin, scratch,
                                           std::min(kMomentsBlock, n - begin));
                  }
                });
    Moments moments;
    for (const Moments& part : parts) MergeMoments(moments, part);
    const StreamAffine run = RowAffine(moments, job.eps, job.style, job.affine);
    const bool never_nan = job.NeverNaN(moments, run);
    ParallelFor(
        tbb::blocked_range<int64_t>(0, n, kApplyChunk), n,
        [&](const tbb::blocked_range<int64_t>& range) {
          float* const wide = Staging<float, kInputSlot>(kStagingElements);
          float* const results = Staging<float>(kStagingElements);
          for (int64_t j = range.begin(); j < range.end();
               j += kStagingElements) {
            const int64_t len = std::min(range.end() - j, kStagingElements);
            StreamAffine piece = run;
            piece.weight = OffsetOrNull(run.weight, j);
            piece.bias = OffsetOrNull(run.bias, j);
            WidenHalf(job.dtype, xr + j, wide, len);
            if (job.fused) {
              StreamAffineRunToHalf(job.dtype, wide, yr + j, len, piece,
                                    never_nan, nullptr, job.stream);
            } else {
              AffineRowHalf(wide, results, len, piece);
              NarrowToHalf(job.dtype, results, yr + j, len);
            }
          }
          if (job.stream) StreamFence();
        });
  }
}

void LayerNormHalfKernel(DType dtype, const uint16_t* x, uint16_t* y,
                         const RowLayout& rows, double eps,
                         LayerNormStyle style, const double* weight,
                         const double* bias) {
  const int64_t n = rows.row_size;
  if (rows.rows == 0 || n == 0) return;
  const AffineParams<float> affine(weight, bias, n);
  const bool fused = CpuHasAvx512Bw();
  const bool stream = fused && StreamOutput(rows.rows * n, sizeof(uint16_t));
  const bool direct = fused && ReadsHalfRowsDirectly(dtype, x, y, n, affine);
  // Whole rows need a widened row per thread unless direct.
  const bool one_at_a_time =
      (n > kMaxHalfKernelRow && !direct) ||
      (n >= kLongLayerNormRow &&
       rows.rows < kWholeLongRowsPerThread * ComputeConcurrency());
  // LongHalfRows widens its pieces: the pair order only for whole rows.
  const AffineParams<float> paired =
      direct && !one_at_a_time && dtype == DType::kBFloat16
          ? PairOrder(affine, n)
          : AffineParams<float>(nullptr, nullptr, 0);
  const HalfRowsJob job{
      .dtype = dtype,
      .x = x,
      .y = y,
      .n = n,
      .eps = eps,
      .style = style,
      .affine = affine,
      .rows_per_piece = std::max<int64_t>(1, kStagingElements / n),
      .fused = fused,
      .stream = stream,
      .finite_affine = AllFinite(affine.weight, n) && AllFinite(affine.bias, n),
      .direct = direct && !one_at_a_time,
      .direct_affine = dtype == DType::kBFloat16 ? paired : affine};
  if (one_at_a_time) {
    LongHalfRows(job, rows.rows);
    return;
  }
  ParallelFor(tbb::blocked_range<int64_t>(0, rows.rows, job.rows_per_piece),
              rows.rows * n, [&](const tbb::blocked_range<int64_t>& range) {
                job.Run(range.begin(), range.end());
              });
}

// Channel affine of fp32 elements [begin, end), read from x[0..end - begin)
// (inner > 1: runs of one channel), straight to y + begin with streaming
// stores (the caller fences); false if the CPU cannot. (Into the cache, the
// compiled loop is as fast on long runs and faster on short ones.)
bool StreamChannelRuns(const float* x, float* y, int64_t begin, int64_t end,
                       const ChannelLayout& layout, const ChannelParamsF32& p) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (HasShortRuns(layout) && CpuHasAvx512F()) {
    StreamShortChannelRunsAvx512(x, y + begin, begin, end - begin, layout, p);
    return true;
  }
#endif
  int64_t pos = begin;
  while (pos < end) {
    const int64_t c = (pos / layout.inner) % layout.channels;
    const int64_t run = std::min(layout.inner - pos % layout.inner, end - pos);
    if (!StreamChannelRun(x + (pos - begin), y + pos, run, p.Constants(c))) {
      return false;
    }
    pos += run;
  }
  return true;
}

// The same for channels-last (parameters expanded as for
// FloatChannelAffineRange, simd/channel_affine.h). When the parameters repeat
// within 64 elements (lcm(channels, 16) <= 64: 1-4, 6, 8, 12, 16, 24, 32, 48 or
// 64 channels), the 64-byte-aligned middle of the range runs with them in
// registers, x prefetched ahead if `prefetch_input`. `stream`: streaming stores
// (the caller fences), else ordinary ones (outputs that stay in the cache,
// where parameters in registers beat the compiled loop's per-element parameter
// loads: kernel_bench BM_GroupNorm and BM_BatchNorm NHWC).
bool StreamChannelsLastRuns(const float* x, float* y, int64_t begin,
                            int64_t end, int64_t channels, int64_t period,
                            const ChannelParamsF32& p, bool prefetch_input,
                            bool stream) {
  if (!CpuHasAvx512F()) return false;
  // Elements [from, to) with per-element parameter loads.
  auto per_element = [&](int64_t from, int64_t to) {
    for (int64_t pos = from; pos < to; pos += period) {
      const int64_t phase = pos % channels;
      StreamChannelsLastPerElement(x + (pos - begin), y + pos,
                                   std::min(period, to - pos), p.hi + phase,
                                   p.scale + phase, p.shift + phase, stream);
    }
  };
  SplitChannelsLast(
      begin, end, reinterpret_cast<uintptr_t>(y + begin), sizeof(float),
      channels, period, /*unit=*/16, /*max_repeat=*/64, per_element,
      [&](int64_t from, int64_t to, int64_t repeat) {
        const int64_t phase = from % channels;
        StreamChannelsLastRepeating(x + (from - begin), y + from, to - from,
                                    repeat, p.hi + phase, p.scale + phase,
                                    p.shift + phase, prefetch_input, stream);
      });
  return true;
}

// Calls write(range) for the kApplyChunk-element pieces of [0, total) in
// parallel, or backwards on this thread (see Traversal); write returns true
// when it left streaming stores unfenced, and they are fenced.
template <typename Write>
void TraversePieces(int64_t total, Traversal traversal, const Write& write) {
  if (traversal == Traversal::kParallel) {
    ParallelFor(tbb::blocked_range<int64_t>(0, total, kApplyChunk), total,
                [&](const tbb::blocked_range<int64_t>& range) {
                  if (write(range)) StreamFence();
                });
    return;
  }
  // One fence at the end: a fence per piece costs time for nothing.
  bool fence = false;
  for (int64_t b = (total - 1) / kApplyChunk * kApplyChunk; b >= 0;
       b -= kApplyChunk) {
    fence |=
        write(tbb::blocked_range<int64_t>(b, std::min(total, b + kApplyChunk)));
  }
  if (fence) StreamFence();
}

// Per-channel fp32 parameters of ChannelParamsF32 (ChannelConstantsOf),
// expanded for channels-last (inner == 1) to `period` + channels entries.
struct ChannelParamsF32Storage {
  ChannelParamsF32Storage(const ChannelLayout& layout, int64_t period,
                          const double* mean, const double* scale,
                          const double* shift) {
    const int64_t channels = layout.channels;
    for (std::vector<float>* v : {&hi, &s, &b}) v->resize(channels);
    for (int64_t c = 0; c < channels; ++c) {
      const ChannelParamsF32::One k =
          ChannelConstantsOf(mean[c], scale[c], shift[c]);
      hi[c] = k.hi;
      s[c] = k.scale;
      b[c] = k.shift;
    }
    if (layout.inner == 1) {
      for (std::vector<float>* v : {&hi, &s, &b}) {
        *v = ExpandChannelsLast(std::move(*v), period);
      }
    }
  }
  ChannelParamsF32 params() const { return {hi.data(), s.data(), b.data()}; }
  // Whether the 16-bit kernels can skip their canonical-NaN fix-up: every
  // operation of ChannelAffineLanes has finite operands (x - hi cannot
  // overflow, given `deviations_bounded`), and such operations give finite
  // or infinite results, never NaN.
  bool NeverNaN(int64_t channels, bool deviations_bounded) const {
    return deviations_bounded && AllFinite(hi.data(), channels) &&
           AllFinite(s.data(), channels) && AllFinite(b.data(), channels);
  }
  std::vector<float> hi, s, b;
};

template <typename T>
void ChannelAffineKernel(const InputSource<T>& source, T* y,
                         const ChannelLayout& layout, const double* mean,
                         const double* scale, const double* shift,
                         int64_t output_elements, Traversal traversal) {
  const int64_t channels = layout.channels;
  const int64_t inner = layout.inner;
  const bool stream =
      StreamOutput(std::max(layout.NumElements(), output_elements), sizeof(T));
  const int64_t period = ParamsPeriod(layout);
  // Per-channel parameters as arrays of U, expanded for channels-last.
  auto channel_values = [&]<typename U>(U (*convert)(double),
                                        const double* values) {
    std::vector<U> out(channels);
    for (int64_t c = 0; c < channels; ++c) out[c] = convert(values[c]);
    return inner == 1 ? ExpandChannelsLast(std::move(out), period) : out;
  };
  // Elements per piece: a whole work item for contiguous input, else what
  // the input staging buffer holds.
  const int64_t piece = source.data != nullptr ? kApplyChunk : kStagingElements;
  auto run = [&](const auto& params, auto range_fn) {
    const int64_t total = layout.NumElements();
    // Writes elements [range); true if it left streaming stores unfenced.
    auto write = [&](const tbb::blocked_range<int64_t>& range) {
      T* in = source.data != nullptr ? nullptr
                                     : Staging<T, kInputSlot>(kStagingElements);
      bool fence = false;
      for (int64_t b = range.begin(); b < range.end(); b += piece) {
        const int64_t e = std::min(range.end(), b + piece);
        const T* x = source.Read(b, e - b, in);
        if constexpr (std::is_same_v<T, float>) {
          // Channels-last in registers, into the cache too; runs only when
          // streaming (see StreamChannelRuns).
          if (inner > 1
                  ? stream && StreamChannelRuns(x, y, b, e, layout, params)
                  : StreamChannelsLastRuns(x, y, b, e, channels, period, params,
                                           /*prefetch_input=*/true, stream)) {
            fence |= stream;
            continue;
          }
        }
        if (!stream) {
          range_fn(x, y + b, b, e, channels, inner, period, params);
          continue;
        }
        T* out = Staging<T>(kStagingElements);
        for (int64_t k = b; k < e; k += kStagingElements) {
          const int64_t k_end = std::min(e, k + kStagingElements);
          range_fn(x + (k - b), out, k, k_end, channels, inner, period, params);
          StreamCopy(y + k, out, (k_end - k) * sizeof(T));
        }
      }
      return fence;
    };
    TraversePieces(total, traversal, write);
  };
  if constexpr (std::is_same_v<T, float>) {
    const ChannelParamsF32Storage params(layout, period, mean, scale, shift);
    run(params.params(), ChannelAffineRangeF32);
  } else {
    auto same = +[](double v) { return v; };
    const std::vector<double> m = channel_values(same, mean);
    const std::vector<double> s = channel_values(same, scale);
    const std::vector<double> b = channel_values(same, shift);
    run(ChannelParamsF64{m.data(), s.data(), b.data()}, ChannelAffineRangeF64);
  }
}

void ChannelAffineHalfKernel(DType dtype, const uint16_t* x, uint16_t* y,
                             const ChannelLayout& layout, const double* mean,
                             const double* scale, const double* shift,
                             int64_t output_elements, Traversal traversal,
                             bool deviations_bounded) {
  const int64_t total = layout.NumElements();
  if (total == 0) return;
  const bool stream =
      StreamOutput(std::max(total, output_elements), sizeof(uint16_t));
  const int64_t period = ParamsPeriod(layout);
  const ChannelParamsF32Storage storage(layout, period, mean, scale, shift);
  const ChannelParamsF32 params = storage.params();
  const bool never_nan = storage.NeverNaN(layout.channels, deviations_bounded);
  TraversePieces(total, traversal, [&](const tbb::blocked_range<int64_t>& r) {
    if (StreamHalfChannelRange(dtype, x, y, r.begin(), r.end(), layout, period,
                               params, never_nan, /*prefetch_input=*/true,
                               stream)) {
      return stream;
    }
    // Without AVX-512 BW: widen a staging piece, run the fp32 kernel's loop
    // on it, narrow.
    float* wide = Staging<float, kInputSlot>(kStagingElements);
    float* out = Staging<float>(kStagingElements);
    for (int64_t k = r.begin(); k < r.end(); k += kStagingElements) {
      const int64_t k_end = std::min(r.end(), k + kStagingElements);
      WidenHalf(dtype, x + k, wide, k_end - k);
      ChannelAffineRangeF32(wide, out, k, k_end, layout.channels, layout.inner,
                            period, params);
      NarrowToHalf(dtype, out, y + k, k_end - k);
    }
    return false;
  });
}

namespace {

// InterleavedChannelAffine: the pieces of ChannelAffineKernel<float>'s and
// ChannelAffineHalfKernel's streaming branches, in order.
class InterleavedChannelAffineImpl final : public InterleavedChannelAffine {
 public:
  InterleavedChannelAffineImpl(DType dtype, const void* x, void* y,
                               const ChannelLayout& layout, int64_t period,
                               const double* mean, const double* scale,
                               const double* shift, bool deviations_bounded)
      : dtype_(dtype),
        x_(x),
        y_(y),
        layout_(layout),
        period_(period),
        storage_(layout, period, mean, scale, shift),
        never_nan_(storage_.NeverNaN(layout.channels, deviations_bounded)) {}

  void Step(int64_t elements) override {
    const int64_t end = std::min(layout_.NumElements(), written_ + elements);
    if (end > written_) Write(written_, end, /*prefetch_input=*/false);
    written_ = end;
  }

  void Finish() override {
    Write(written_, layout_.NumElements(), /*prefetch_input=*/true);
    written_ = layout_.NumElements();
    StreamFence();
  }

 private:
  // Elements [begin, end); the stream loops exist (see Create).
  void Write(int64_t begin, int64_t end, bool prefetch_input) {
    if (begin >= end) return;
    const ChannelParamsF32 params = storage_.params();
    if (dtype_ == DType::kFloat32) {
      const float* x = static_cast<const float*>(x_) + begin;
      float* y = static_cast<float*>(y_);
      if (layout_.inner > 1) {
        StreamChannelRuns(x, y, begin, end, layout_, params);
      } else {
        StreamChannelsLastRuns(x, y, begin, end, layout_.channels, period_,
                               params, prefetch_input, /*stream=*/true);
      }
      return;
    }
    StreamHalfChannelRange(dtype_, static_cast<const uint16_t*>(x_),
                           static_cast<uint16_t*>(y_), begin, end, layout_,
                           period_, params, never_nan_, prefetch_input,
                           /*stream=*/true);
  }

  const DType dtype_;
  const void* const x_;
  void* const y_;
  const ChannelLayout layout_;
  const int64_t period_;
  const ChannelParamsF32Storage storage_;
  const bool never_nan_;
  int64_t written_ = 0;
};

std::atomic<int64_t> interleaved_sample_bytes{kDefaultInterleavedSampleBytes};

}  // namespace

int64_t InterleavedSampleBytes() {
  return interleaved_sample_bytes.load(std::memory_order_relaxed);
}

void SetInterleavedSampleBytes(int64_t bytes) {
  interleaved_sample_bytes.store(bytes, std::memory_order_relaxed);
}

bool InterleavedChannelAffine::Supported(DType dtype, int64_t output_elements) {
  const bool dtype_supported = dtype == DType::kFloat32 ||
                               dtype == DType::kBFloat16 ||
                               dtype == DType::kFloat16;
  return dtype_supported && CpuHasAvx512Bw() &&
         StreamOutput(output_elements, ElementSize(dtype));
}

std::unique_ptr<InterleavedChannelAffine> InterleavedChannelAffine::Create(
    DType dtype, const void* x, void* y, const ChannelLayout& layout,
    const double* mean, const double* scale, const double* shift,
    int64_t output_elements, bool deviations_bounded) {
  const int64_t total = layout.NumElements();
  if (total == 0 || !Supported(dtype, std::max(total, output_elements))) {
    return nullptr;
  }
  const int64_t period = ParamsPeriod(layout);
  return std::make_unique<InterleavedChannelAffineImpl>(
      dtype, x, y, layout, period, mean, scale, shift, deviations_bounded);
}

template void LayerNormKernel<float>(const InputSource<float>&, float*,
                                     const RowLayout&, double, LayerNormStyle,
                                     const double*, const double*);
template void LayerNormKernel<double>(const InputSource<double>&, double*,
                                      const RowLayout&, double, LayerNormStyle,
                                      const double*, const double*);
template void ChannelAffineKernel<float>(const InputSource<float>&, float*,
                                         const ChannelLayout&, const double*,
                                         const double*, const double*, int64_t,
                                         Traversal);
template void ChannelAffineKernel<double>(const InputSource<double>&, double*,
                                          const ChannelLayout&, const double*,
                                          const double*, const double*, int64_t,
                                          Traversal);

}  // namespace normd
