#include "server/core/kernels.h"

#include <tbb/blocked_range.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "server/core/half.h"
#include "server/core/moments.h"
#include "server/core/parallel.h"
#include "server/core/simd/block_moments.h"
#include "server/core/simd/channel_affine.h"
#include "server/core/simd/row_affine.h"
#include "server/core/simd/streaming.h"

namespace normd {
namespace {

// Elements per parallel work item of the elementwise passes.
constexpr int64_t kApplyChunk = 16384;
// Elements per piece of a per-thread staging buffer (scattered input copied
// in, 16-bit values widened).
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
// 16-bit rows longer than this go one at a time (the per-thread buffers
// hold whole rows).
constexpr int64_t kMaxHalfKernelRow = 64 * 1024;

// How far ahead of the element it writes a stream writer prefetches its
// own input when it has no next row to prefetch (see RowPrefetch).
constexpr int64_t kStreamPrefetchBytes = 2048;

// What a row writer prefetches as it writes (RowWrite::prefetch): the next
// row's input (`next_row`, elements of `element_bytes`), at the element it
// writes, so that the next row comes from memory while this one's stores
// drain; without one, its own input (`current`) kStreamPrefetchBytes ahead.
// Otherwise each core alternates between reading (statistics) and writing
// (outputs): kernel_bench BM_LayerNorm, BM_RmsNorm and BM_HalfRows
// [B,T,4096].
RowWrite RowPrefetch(bool stream, const void* current, const void* next_row,
                     int64_t element_bytes) {
  return RowWrite{
      .stream = stream,
      .prefetch = next_row != nullptr ? next_row : current,
      .prefetch_element_bytes = element_bytes,
      .prefetch_ahead_bytes = next_row != nullptr ? 0 : kStreamPrefetchBytes};
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

// Per-thread buffers: kInputSlot holds input copied or widened for a piece,
// kOutputSlot the 16-bit rows' widened batch or statistics scratch.
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

// The affine of one row of T with these moments (simd/row_affine.h): fp32
// rows the mean split into two floats and a float scale, fp64 rows the
// mean and scale themselves.
template <typename T>
RowAffine RowConstants(const Moments& moments, double eps, LayerNormStyle style,
                       const AffineParams<T>& affine) {
  const double center = RowCenter(moments, style);
  const double scale = RowScale(moments, eps, style);
  if constexpr (std::is_same_v<T, double>) {
    return RowAffine{.hi = center,
                     .scale = scale,
                     .weight = affine.weight,
                     .bias = affine.bias};
  }
  // The mean split into two floats, mean ~= hi + lo, so that fp32 lanes can
  // subtract it first: (x - hi) is exact near the mean (Sterbenz), and lo
  // restores the bits hi dropped.
  const float hi = static_cast<float>(center);
  return RowAffine{.hi = hi,
                   .lo = static_cast<float>(center - static_cast<double>(hi)),
                   .scale = static_cast<float>(scale),
                   .weight = affine.weight,
                   .bias = affine.bias};
}

// True when the 16-bit rows x -> y should be computed from x itself rather
// than from a widened copy, which saves the copy's traffic (kernel_bench
// BM_HalfRows and BM_HalfLayerNormAffine): unless y sits less than 512
// bytes above x modulo 4 KiB, where loads of x look like (4K-aliasing)
// overlaps of the streaming stores just issued to y and wait for them (the
// widened copy is not affected).
bool ReadsHalfRowsDirectly(const void* x, const void* y) {
  constexpr uintptr_t kPage = 4096;
  constexpr uintptr_t kAliasWindow = 512;
  const uintptr_t y_above_x =
      (reinterpret_cast<uintptr_t>(y) - reinterpret_cast<uintptr_t>(x)) % kPage;
  return y_above_x == 0 || y_above_x >= kAliasWindow;
}

// The rows of one LayerNorm call, whatever their dtype: fp32 and fp64 rows
// computed in their own type, 16-bit rows in fp32 (widened exactly, as
// loaded or into a buffer, and narrowed as written). P is the type of the
// affine parameters: double for fp64, else float.
template <typename P>
struct RowsJob {
  DType dtype;
  int64_t n;  // Row length.
  double eps;
  LayerNormStyle style;
  const AffineParams<P>& affine;
  bool stream;  // Streaming stores (large outputs, see StreamOutput).
  // 16-bit rows computed from x itself (see ReadsHalfRowsDirectly).
  bool direct;

  int64_t RowBytes() const { return n * ElementSize(dtype); }

  // Rows per batch: short fp32 rows (and widened 16-bit ones) sixteen at a
  // time, their moments with FloatRowsMoments and their outputs in one
  // call (the same bits as a row at a time, without its per-row folds and
  // calls, which dominate rows of 16-128 values: shape_survey's short-row
  // LayerNorm).
  int Batch() const {
    const bool widened = IsHalf(dtype) && !direct;
    return (dtype == DType::kFloat32 || widened) && n <= kShortRow ? 16 : 1;
  }

  // Floats of the per-thread buffer of WriteRows (16-bit rows): a batch
  // widened, or (direct) one statistics block's scratch.
  int64_t BufferFloats() const {
    if (!IsHalf(dtype)) return 0;
    return direct ? std::min(n, kMomentsBlock) : Batch() * n;
  }

  // `count` rows from x to y, a batch at a time. Each batch is written as
  // the next one is prefetched (the next input row this thread reads:
  // `after` past the last one), so that it comes from memory while this
  // one's stores drain; fp32 and fp64 rows written into the cache do not
  // prefetch (a work item's rows are in L2).
  void WriteRows(const char* x, char* y, int64_t count, const char* after,
                 float* buffer) const {
    const int batch = Batch();
    Moments moments[16];
    RowAffine constants[16];
    for (int64_t r0 = 0; r0 < count; r0 += batch) {
      const int rows = static_cast<int>(std::min<int64_t>(batch, count - r0));
      const char* in = x + r0 * RowBytes();
      const char* next = r0 + batch < count ? in + batch * RowBytes() : after;
      const void* values = in;
      DType values_type = dtype;
      if (!IsHalf(dtype)) {
        if (batch > 1) {
          FloatRowsMoments(reinterpret_cast<const float*>(in), n, rows,
                           moments);
        } else {
          moments[0] = ContiguousMoments(dtype, in, n);
        }
      } else if (direct) {
        moments[0] = HalfMoments(dtype, reinterpret_cast<const uint16_t*>(in),
                                 buffer, n);
      } else {
        if (batch > 1) {
          WidenHalf(dtype, reinterpret_cast<const uint16_t*>(in), buffer,
                    rows * n);
          FloatRowsMoments(buffer, n, rows, moments);
        } else {
          moments[0] = WidenWithMoments(
              dtype, reinterpret_cast<const uint16_t*>(in), buffer, n);
        }
        values = buffer;
        values_type = DType::kFloat32;
      }
      for (int k = 0; k < rows; ++k) {
        constants[k] = RowConstants(moments[k], eps, style, affine);
      }
      RowsAffineWrite(
          values_type, dtype, values, y + r0 * RowBytes(), n, rows, constants,
          stream || IsHalf(dtype)
              ? RowPrefetch(stream, values, next, ElementSize(dtype))
              : RowWrite{});
    }
  }

  // One row, reduced and then written by every thread in pieces: its
  // blocks' moments in parallel, merged in order (the same moments), its
  // outputs in kApplyChunk pieces; 16-bit rows that are not direct are
  // widened a staging buffer at a time.
  void WriteLongRow(const char* x, char* y) const {
    const RowAffine row =
        RowConstants(ContiguousMoments(dtype, x, n), eps, style, affine);
    const int64_t size = ElementSize(dtype);
    ParallelFor(
        tbb::blocked_range<int64_t>(0, n, kApplyChunk), n,
        [&](const tbb::blocked_range<int64_t>& range) {
          for (int64_t j = range.begin(); j < range.end();
               j += kStagingElements) {
            const int64_t len = std::min(range.end() - j, kStagingElements);
            RowAffine piece = row;
            if (affine.weight != nullptr) piece.weight = affine.weight + j;
            if (affine.bias != nullptr) piece.bias = affine.bias + j;
            const void* values = x + j * size;
            DType values_type = dtype;
            if (IsHalf(dtype) && !direct) {
              float* const wide = Staging<float, kInputSlot>(kStagingElements);
              WidenHalf(dtype, reinterpret_cast<const uint16_t*>(values), wide,
                        len);
              values = wide;
              values_type = DType::kFloat32;
            }
            RowAffineWrite(values_type, dtype, values, y + j * size, len, piece,
                           {.stream = stream});
          }
          if (stream) StreamFence();
        });
  }
};

// LayerNormKernel with affine parameters of type P.
template <typename P>
void LayerNormRows(DType dtype, const InputSource& source, void* y,
                   const RowLayout& rows, double eps, LayerNormStyle style,
                   const double* weight, const double* bias) {
  const int64_t n = rows.row_size;
  if (rows.rows == 0 || n == 0) return;
  const AffineParams<P> affine(weight, bias, n);
  const RowsJob<P> job{
      .dtype = dtype,
      .n = n,
      .eps = eps,
      .style = style,
      .affine = affine,
      .stream = StreamOutput(rows.rows * n, ElementSize(dtype)),
      .direct = IsHalf(dtype) && ReadsHalfRowsDirectly(source.data, y)};
  const char* const x = source.data;
  auto* out = static_cast<char*>(y);
  // Long rows one at a time, each spread over every thread: two parallel
  // loops per row, and a row reduced on one core is written by another.
  // With enough rows, whole rows per work item instead, so that a row is
  // reduced and written by the same core (shape_survey's long LayerNorm
  // rows), unless a row is too large for the per-thread buffers.
  const bool whole_long_rows =
      x != nullptr && job.RowBytes() <= kMaxWholeLongRowBytes &&
      rows.rows >= kWholeLongRowsPerThread * ComputeConcurrency() &&
      job.BufferFloats() <= kMaxHalfKernelRow;
  if (n >= kLongLayerNormRow && !whole_long_rows) {
    for (int64_t r = 0; r < rows.rows; ++r) {
      job.WriteLongRow(x + r * job.RowBytes(), out + r * job.RowBytes());
    }
    return;
  }
  // Whole rows per work item, in pieces of as many rows as fit the input
  // staging buffer (scattered input is copied in).
  const int64_t rows_per_item = std::max<int64_t>(1, kApplyChunk / n);
  const int64_t rows_per_piece = std::max<int64_t>(1, kStagingElements / n);
  ParallelFor(
      tbb::blocked_range<int64_t>(0, rows.rows, rows_per_item), rows.rows * n,
      [&](const tbb::blocked_range<int64_t>& range) {
        // Long rows' statistics on this thread too (whole_long_rows: every
        // thread has rows of its own).
        const SerialLoopsScope serial;
        char* staging =
            x != nullptr
                ? nullptr
                : Staging<char, kInputSlot>(rows_per_piece * job.RowBytes());
        // 64-byte aligned, so that full-vector loads never split lines.
        float* buffer = Staging<float>(job.BufferFloats() + 16);
        buffer = reinterpret_cast<float*>(
            (reinterpret_cast<uintptr_t>(buffer) + 63) & ~uintptr_t{63});
        for (int64_t r0 = range.begin(); r0 < range.end();
             r0 += rows_per_piece) {
          const int64_t r1 = std::min(range.end(), r0 + rows_per_piece);
          job.WriteRows(source.Read(r0 * job.RowBytes(),
                                    (r1 - r0) * job.RowBytes(), staging),
                        out + r0 * job.RowBytes(), r1 - r0,
                        x != nullptr && r1 < range.end()
                            ? x + r1 * job.RowBytes()
                            : nullptr,
                        buffer);
        }
        // One fence per work item: fencing every few rows stalls on the
        // write-combining buffers.
        if (job.stream) StreamFence();
      });
}

}  // namespace

void LayerNormKernel(DType dtype, const InputSource& x, void* y,
                     const RowLayout& rows, double eps, LayerNormStyle style,
                     const double* weight, const double* bias) {
  if (dtype == DType::kFloat64) {
    LayerNormRows<double>(dtype, x, y, rows, eps, style, weight, bias);
  } else {
    LayerNormRows<float>(dtype, x, y, rows, eps, style, weight, bias);
  }
}

namespace {

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

// The per-channel parameters of the channel affines (simd/channel_affine.h)
// as arrays of T. fp32 (and 16-bit data): y = fma(x - hi, scale, shift -
// (mean - hi) * scale), hi the mean rounded to float, so that x - hi is
// exact near the mean (Sterbenz), the third operand folded in fp64: one
// rounding after the subtraction, where ((x - hi) - lo) * scale + shift had
// three. With a scale that is not finite in fp32 (an infinite or NaN
// weight, or one that overflows) the rest of the mean is left out: each
// value's sign against hi decides, as with an fp32 mean. fp64: the mean,
// scale and shift themselves. Channels-last (inner == 1): expanded to
// `period` + channels entries (entry i for channel i % channels), the
// period a multiple of the channel count long enough that the loop over
// one period vectorizes well.
template <typename T>
struct ChannelParams {
  explicit ChannelParams(const ChannelLayout& layout, const double* mean,
                         const double* scale, const double* shift) {
    const int64_t channels = layout.channels;
    constexpr int64_t kMinPeriod = 1024;
    period =
        layout.inner != 1
            ? channels
            : channels * std::max<int64_t>(
                             1, std::min(kMinPeriod / channels, layout.outer));
    const int64_t entries = layout.inner == 1 ? period + channels : channels;
    for (std::vector<T>* v : {&a, &b, &c}) v->resize(entries);
    for (int64_t k = 0; k < channels; ++k) {
      a[k] = static_cast<T>(mean[k]);
      b[k] = static_cast<T>(scale[k]);
      c[k] = static_cast<T>(shift[k]);
      if constexpr (std::is_same_v<T, float>) {
        const double rest = (mean[k] - static_cast<double>(a[k])) * scale[k];
        if (std::isfinite(b[k]) && std::isfinite(rest)) {
          c[k] = static_cast<float>(shift[k] - rest);
        }
      }
    }
    for (int64_t i = channels; i < entries; ++i) {
      a[i] = a[i - channels];
      b[i] = b[i - channels];
      c[i] = c[i - channels];
    }
  }
  // Elements [begin, end) of dtype from x (element begin at x[0]) to y + begin.
  void Write(DType dtype, const void* x, void* y, int64_t begin, int64_t end,
             const ChannelLayout& layout, const ChannelWrite& write) const {
    const int64_t size = ElementSize(dtype);
    ChannelAffineWrite(dtype, x, static_cast<char*>(y) + begin * size, begin,
                       end, layout.channels, layout.inner, period, a.data(),
                       b.data(), c.data(), write);
  }
  int64_t period;
  std::vector<T> a, b, c;
};

// ChannelAffineKernel with parameters of type P. Pieces of a whole work
// item for contiguous input, else of what the input staging buffer holds.
template <typename P>
void ChannelAffineRange(DType dtype, const InputSource& source, void* y,
                        const ChannelLayout& layout, const double* mean,
                        const double* scale, const double* shift,
                        int64_t output_elements, Traversal traversal) {
  const int64_t total = layout.NumElements();
  if (total == 0) return;
  const int64_t size = ElementSize(dtype);
  const bool stream = StreamOutput(std::max(total, output_elements), size);
  const ChannelParams<P> params(layout, mean, scale, shift);
  const int64_t piece = source.data != nullptr ? kApplyChunk : kStagingElements;
  TraversePieces(total, traversal, [&](const tbb::blocked_range<int64_t>& r) {
    char* staging = source.data != nullptr
                        ? nullptr
                        : Staging<char, kInputSlot>(kStagingElements * size);
    for (int64_t b = r.begin(); b < r.end(); b += piece) {
      const int64_t e = std::min(r.end(), b + piece);
      params.Write(dtype, source.Read(b * size, (e - b) * size, staging), y, b,
                   e, layout, {.stream = stream, .prefetch_input = true});
    }
    return stream;
  });
}

}  // namespace

void ChannelAffineKernel(DType dtype, const InputSource& x, void* y,
                         const ChannelLayout& layout, const double* mean,
                         const double* scale, const double* shift,
                         int64_t output_elements, Traversal traversal) {
  if (dtype == DType::kFloat64) {
    ChannelAffineRange<double>(dtype, x, y, layout, mean, scale, shift,
                               output_elements, traversal);
  } else {
    ChannelAffineRange<float>(dtype, x, y, layout, mean, scale, shift,
                              output_elements, traversal);
  }
}

}  // namespace normd
