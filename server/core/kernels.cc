#include "server/core/kernels.h"

#include <tbb/blocked_range.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "server/core/euclidean_norm.h"
#include "server/core/half.h"
#include "server/core/moments.h"
#include "server/core/parallel.h"
#include "server/core/simd/block_moments.h"
#include "server/core/simd/channel_affine.h"
#include "server/core/simd/channel_moments.h"
#include "server/core/simd/row_affine.h"
#include "server/core/simd/streaming.h"
#include "server/core/staging.h"
#include "server/core/thread_paths.h"

namespace normd {
namespace {

// Elements per parallel work item of the elementwise passes.
constexpr int64_t kApplyChunk = 16384;
// Elements per piece of a per-thread staging buffer.
constexpr int64_t kStagingElements = 4096;
// Long rows (kLongLayerNormRow: two moments blocks or more) go one at a
// time, each over every thread, unless every thread gets this many and a
// row has at most this many bytes: then whole rows per work item.
static_assert(kLongLayerNormRow >= kMomentsBlock);
constexpr int64_t kWholeLongRowsPerThread = 4;
constexpr int64_t kMaxWholeLongRowBytes = 8 << 20;
// 16-bit rows longer than this go one at a time (the per-thread buffers
// hold whole rows).
constexpr int64_t kMaxHalfKernelRow = 64 * 1024;
// How far ahead a row writer prefetches its own input when it has no next
// row to prefetch.
constexpr int64_t kStreamPrefetchBytes = 2048;

// The affine parameters in the computation's type, or null: fp64 ones as
// given, fp32 ones rounded once per call in vectors (a call of one row has
// as many of them to round as values to normalize, or twice as many).
template <typename T>
struct AffineParams {
  AffineParams(const double* w, const double* b, int64_t n)
      : weight(InType(w, n, weight_storage)),
        bias(InType(b, n, bias_storage)) {}
  static const T* InType(const double* p, int64_t n, VectorArray<T>& storage) {
    if constexpr (std::is_same_v<T, double>) {
      return p;
    } else {
      if (p == nullptr) return nullptr;
      storage = hwy::AllocateAligned<T>(n);
      DoublesToFloats(p, storage.get(), n);
      return storage.get();
    }
  }
  VectorArray<T> weight_storage, bias_storage;
  const T* weight;
  const T* bias;
};

// The scales of `count` rows of n values of `dtype` from `rows` (which L2
// reads) with these moments: one loop per style, which GCC vectorizes but
// for L2 (the divisions and square roots wait on one another otherwise).
void RowScales(const Moments* moments, int count, double eps,
               LayerNormStyle style, DType dtype, const char* rows, int64_t n,
               double* scales) {
  const double values = static_cast<double>(n);  // Each row's count.
  switch (style) {
    case LayerNormStyle::kL2:
      for (int k = 0; k < count; ++k) {
        // std::max keeps a NaN norm (NaN < eps is false), as PyTorch does.
        scales[k] =
            1.0 / std::max(EuclideanNorm(moments[k], dtype,
                                         rows + k * n * ElementSize(dtype),
                                         ChannelLayout{1, 1, n}, 0),
                           eps);
      }
      return;
    case LayerNormStyle::kBertUnbiasedStd:
      for (int k = 0; k < count; ++k) {
        scales[k] = 1.0 / (std::sqrt(moments[k].UnbiasedVariance()) + eps);
      }
      return;
    case LayerNormStyle::kRms:
    case LayerNormStyle::kPyTorch:
      // RMSNorm's mean(x^2) is M2 / n + mean^2; PyTorch's variance M2 / n
      // (+ 0.0 changes no M2 / n >= 0).
      for (int k = 0; k < count; ++k) {
        const double mean = moments[k].mean;
        scales[k] = 1.0 / std::sqrt(moments[k].m2 / values +
                                    (style == LayerNormStyle::kRms ? mean * mean
                                                                   : 0.0) +
                                    eps);
      }
      return;
  }
}

// The affine of one row of T with these moments and scale
// (simd/row_affine.h): the center (mean, or 0 for RMSNorm and L2) and scale
// themselves for fp64; for fp32, floats, the center split as hi + lo so that
// x - hi is exact near it.
template <typename T>
RowAffine RowConstants(const Moments& moments, double scale,
                       LayerNormStyle style, const AffineParams<T>& affine) {
  const bool centered =
      style != LayerNormStyle::kRms && style != LayerNormStyle::kL2;
  const double center = centered ? moments.mean : 0.0;
  const bool fp64 = std::is_same_v<T, double>;
  const double hi = fp64 ? center : static_cast<float>(center);
  return RowAffine{.hi = hi,
                   .lo = fp64 ? 0.0 : static_cast<float>(center - hi),
                   .scale = fp64 ? scale : static_cast<float>(scale),
                   .weight = affine.weight,
                   .bias = affine.bias};
}

// Whether 16-bit rows x -> y of n values are computed from x itself rather
// than a widened copy (saving the copy's traffic): not short rows, which
// the copy lets go sixteen at a time, nor where y sits less than 512 bytes
// above x modulo 4 KiB, where loads of x wait on the streaming stores just
// issued to y (4K aliasing). A specialization kept on measurement: float16
// on AVX3 and AVX2, kernel_bench's 16-bit LayerNorm [B,T,4096]
// (docs/design/kernels.md).
bool ReadsHalfRowsDirectly(const void* x, const void* y, int64_t n) {
  if (n <= kShortRow) return false;
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
  // 16-bit rows widened into a buffer before their moments and affine.
  bool Widened() const { return IsHalf(dtype) && !direct; }

  // Rows per batch: short fp32 (or widened) rows sixteen at a time through
  // FloatRowsMoments and one affine call: per-row folds and calls dominate
  // rows of 16-256 values. A specialization kept on measurement: AVX3 and
  // AVX2, bench case RowNorm*/64 (docs/design/kernels.md).
  int Batch() const {
    return (dtype == DType::kFloat32 || Widened()) && n <= kShortRow ? 16 : 1;
  }

  // Floats of WriteRows' per-thread buffer: a widened batch, or (direct
  // 16-bit rows) one statistics block's scratch.
  int64_t BufferFloats() const {
    if (!IsHalf(dtype)) return 0;
    return direct ? std::min(n, kMomentsBlock) : Batch() * n;
  }

  // `count` rows from x to y, a batch at a time. Streamed and 16-bit rows
  // prefetch the next input row this thread reads (`after` the last one)
  // as they write, so that it comes from memory while the stores drain.
  void WriteRows(const char* x, char* y, int64_t count, const char* after,
                 float* buffer) const {
    const int batch = Batch();
    Moments moments[16];
    RowAffine constants[16];
    for (int64_t r0 = 0; r0 < count; r0 += batch) {
      const int rows = static_cast<int>(std::min<int64_t>(batch, count - r0));
      const char* in = x + r0 * RowBytes();
      const char* next = r0 + batch < count ? in + batch * RowBytes() : after;
      const auto* halves = reinterpret_cast<const uint16_t*>(in);
      if (batch > 1) {
        if (IsHalf(dtype)) WidenHalf(dtype, halves, buffer, rows * n);
        FloatRowsMoments(
            IsHalf(dtype) ? buffer : reinterpret_cast<const float*>(in), n,
            rows, moments);
      } else if (!IsHalf(dtype)) {
        moments[0] = ContiguousMoments(dtype, in, n);
      } else {
        moments[0] = WidenedMoments(dtype, halves, buffer, n, !direct);
      }
      double scales[16];
      RowScales(moments, rows, eps, style, dtype, in, n, scales);
      for (int k = 0; k < rows; ++k) {
        constants[k] = RowConstants(moments[k], scales[k], style, affine);
      }
      const void* values = Widened() ? buffer : static_cast<const void*>(in);
      RowWrite write{.stream = stream};
      if (stream || IsHalf(dtype)) {
        write.prefetch = next != nullptr ? next : values;
        write.prefetch_element_bytes = ElementSize(dtype);
        write.prefetch_ahead_bytes = next != nullptr ? 0 : kStreamPrefetchBytes;
      }
      RowsAffineWrite(Widened() ? DType::kFloat32 : dtype, dtype, values,
                      y + r0 * RowBytes(), n, rows, constants, write);
    }
  }

  // One row, reduced and then written by every thread in pieces (widened
  // 16-bit rows a staging buffer at a time).
  void WriteLongRow(const char* x, char* y) const {
    const Moments moments = ContiguousMoments(dtype, x, n);
    double scale;
    RowScales(&moments, 1, eps, style, dtype, x, n, &scale);
    const RowAffine row = RowConstants(moments, scale, style, affine);
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
            if (Widened()) {
              float* const wide =
                  Staging<float, StagingSlot::kKernelInput>(kStagingElements);
              WidenHalf(dtype, static_cast<const uint16_t*>(values), wide, len);
              values = wide;
            }
            RowAffineWrite(Widened() ? DType::kFloat32 : dtype, dtype, values,
                           y + j * size, len, piece, {.stream = stream});
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
      .direct = IsHalf(dtype) && ReadsHalfRowsDirectly(source.data, y, n)};
  const char* const x = source.data;
  auto* out = static_cast<char*>(y);
  // Long rows one at a time over every thread, unless there are enough to
  // give each thread whole rows (reduced and written by one core) and they
  // fit the per-thread buffers.
  const bool whole_long_rows =
      x != nullptr && job.RowBytes() <= kMaxWholeLongRowBytes &&
      rows.rows >= kWholeLongRowsPerThread * ComputeConcurrency() &&
      job.BufferFloats() <= kMaxHalfKernelRow;
  if (n >= kLongLayerNormRow) {
    CountThreadPath(whole_long_rows ? ThreadPath::kLayerNormWholeLongRows
                                    : ThreadPath::kLayerNormLongRowsSpread);
  }
  if (n >= kLongLayerNormRow && !whole_long_rows) {
    for (int64_t r = 0; r < rows.rows; ++r) {
      job.WriteLongRow(x + r * job.RowBytes(), out + r * job.RowBytes());
    }
    return;
  }
  // Whole rows per work item, in pieces that fit the staging buffer.
  const int64_t rows_per_item = std::max<int64_t>(1, kApplyChunk / n);
  const int64_t rows_per_piece = std::max<int64_t>(1, kStagingElements / n);
  ParallelFor(
      tbb::blocked_range<int64_t>(0, rows.rows, rows_per_item), rows.rows * n,
      [&](const tbb::blocked_range<int64_t>& range) {
        const SerialLoopsScope serial;  // Each thread has rows of its own.
        char* staging = x != nullptr ? nullptr
                                     : Staging<char, StagingSlot::kKernelInput>(
                                           rows_per_piece * job.RowBytes());
        float* buffer =
            Staging<float, StagingSlot::kKernelOutput>(job.BufferFloats());
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

// write(range) for the kApplyChunk pieces of [0, total) as `traversal`
// says; write returns true when it left streaming stores to fence.
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

// The per-channel arrays of ChannelAffineWrite (simd/channel_affine.h) of
// type P: for fp32, hi (the mean as a float, so that x - hi is exact near
// it), scale, and shift - (mean - hi) * scale folded in fp64 (left out when
// not finite in fp32, as for an infinite weight: x's sign against hi
// decides); for fp64, mean, scale and shift. Channels-last: `period` +
// channels entries, the period a multiple of channels long enough to
// vectorize well. A value, read-only once built.
template <typename P>
struct ChannelAffineArrays {
  int64_t period = 0;
  VectorArray<P> hi;
  VectorArray<P> mul;
  VectorArray<P> add;

  ChannelAffineArrays(const ChannelLayout& layout, const double* mean,
                      const double* scale, const double* shift) {
    const int64_t channels = layout.channels;
    constexpr int64_t kMinPeriod = 1024;
    period =
        layout.inner != 1
            ? channels
            : channels * std::max<int64_t>(
                             1, std::min(kMinPeriod / channels, layout.outer));
    const size_t entries = layout.inner == 1 ? period + channels : channels;
    hi = hwy::AllocateAligned<P>(entries);
    mul = hwy::AllocateAligned<P>(entries);
    add = hwy::AllocateAligned<P>(entries);
    for (int64_t k = 0; k < channels; ++k) {
      hi[k] = static_cast<P>(mean[k]);
      mul[k] = static_cast<P>(scale[k]);
      add[k] = static_cast<P>(shift[k]);
      if constexpr (std::is_same_v<P, float>) {
        const double rest = (mean[k] - static_cast<double>(hi[k])) * scale[k];
        if (std::isfinite(mul[k]) && std::isfinite(rest)) {
          add[k] = static_cast<float>(shift[k] - rest);
        }
      }
    }
    // The channels-last period's entries: copies of the channels' own, the
    // filled prefix (a multiple of channels, as entries is) doubled each
    // time, so that few channels take few copies.
    for (size_t filled = channels; filled < entries; filled *= 2) {
      const size_t n = std::min(filled, entries - filled);
      std::copy_n(hi.get(), n, hi.get() + filled);
      std::copy_n(mul.get(), n, mul.get() + filled);
      std::copy_n(add.get(), n, add.get() + filled);
    }
  }

  // Elements [begin, end) of the tensor, from x (element begin at x[0]) to
  // y (element begin at y[0]).
  void Write(DType dtype, const ChannelLayout& layout, const char* x, char* y,
             int64_t begin, int64_t end, const ChannelWrite& write) const {
    ChannelAffineWrite(dtype, x, y, begin, end, layout.channels, layout.inner,
                       period, hi.get(), mul.get(), add.get(), write);
  }
};

// ChannelAffineKernel with parameters of type P, in pieces of a work item
// (contiguous input) or of the staging buffer.
template <typename P>
void ChannelAffineRange(DType dtype, const InputSource& source, void* y,
                        const ChannelLayout& layout, const double* mean,
                        const double* scale, const double* shift,
                        int64_t output_elements, Traversal traversal) {
  const int64_t total = layout.NumElements();
  if (total == 0) return;
  const int64_t size = ElementSize(dtype);
  const bool stream = StreamOutput(std::max(total, output_elements), size);
  const ChannelAffineArrays<P> arrays(layout, mean, scale, shift);
  const int64_t piece = source.data != nullptr ? kApplyChunk : kStagingElements;
  TraversePieces(total, traversal, [&](const tbb::blocked_range<int64_t>& r) {
    char* staging =
        source.data != nullptr
            ? nullptr
            : Staging<char, StagingSlot::kKernelInput>(kStagingElements * size);
    for (int64_t begin = r.begin(); begin < r.end(); begin += piece) {
      const int64_t end = std::min(r.end(), begin + piece);
      arrays.Write(dtype, layout,
                   source.Read(begin * size, (end - begin) * size, staging),
                   static_cast<char*>(y) + begin * size, begin, end,
                   {.stream = stream, .prefetch_input = true});
    }
    return stream;
  });
}

// ChannelAffineWithMoments' work on each block of ChannelMoments, with
// parameters of type P: fp32 and 16-bit blocks that the moments kernels
// can write as they read them (simd/block_moments.h,
// simd/channel_moments.h) are, unless in place (a block that lost accuracy
// is read again); others are written once their moments are taken, from
// cache. Thread-safe: blocks write disjoint outputs.
template <typename P>
class AffinePass final : public BlockPass {
 public:
  AffinePass(DType dtype, const char* x, char* y, const ChannelLayout& layout,
             const double* mean, const double* scale, const double* shift)
      : dtype_(dtype),
        size_(ElementSize(dtype)),
        x_(x),
        y_(y),
        layout_(layout),
        stream_(StreamOutput(layout.NumElements(), size_)),
        arrays_(layout, mean, scale, shift) {}

  Moments RunBlock(int64_t at, int64_t n) const override {
    const char* x = x_ + at * size_;
    char* y = y_ + at * size_;
    if constexpr (std::is_same_v<P, float>) {
      if (x_ != y_ && n > kShortRow && Aligned(y)) {
        const int64_t channel = layout_.ChannelOf(at);
        const Moments moments = BlockMomentsWithAffine(
            dtype_, x, y, n, arrays_.hi[channel], arrays_.mul[channel],
            arrays_.add[channel], stream_);
        if (stream_) StreamFence();
        return moments;
      }
    }
    const float* hints = Hints();
    const Moments moments = BlockMoments(
        dtype_, x, n, Staging<float, StagingSlot::kBlockScratch>(kMomentsBlock),
        /*store_widened=*/false,
        hints == nullptr ? nullptr : hints + layout_.ChannelOf(at));
    AfterRange(at, at + n);
    return moments;
  }

  void RunRowBlock(const ChannelRowBlock& block, double* scratch,
                   Moments* out) const override {
    const int64_t row = layout_.channels * layout_.inner;
    if constexpr (std::is_same_v<P, float>) {
      if (x_ != y_ && layout_.inner == 1 && block.width() % 64 == 0 &&
          Aligned(y_ + block.c0 * size_) &&
          (!stream_ || row * size_ % 64 == 0)) {
        ChannelRowBlockMomentsWithAffine(
            dtype_, x_, y_, layout_, block, arrays_.hi.get(), arrays_.mul.get(),
            arrays_.add.get(), stream_, scratch, out);
        if (stream_) StreamFence();
        return;
      }
    }
    ChannelRowBlockMoments(dtype_, x_, layout_, block, scratch, out, Hints());
    const int64_t length = block.width() * layout_.inner;
    if (length == row) {  // Every channel: one range.
      AfterRange(block.r0 * row, block.r1 * row);
      return;
    }
    for (int64_t r = block.r0; r < block.r1; ++r) {
      const int64_t begin = r * row + block.c0 * layout_.inner;
      Write(begin, begin + length);
    }
    if (stream_) StreamFence();
  }

  void AfterRange(int64_t begin, int64_t end) const override {
    Write(begin, end);
    if (stream_) StreamFence();
  }

 private:
  // The moments' shift hints, as the fused blocks and tiles take them: the
  // fp32 means (none for fp64 data, whose moments are exact).
  const float* Hints() const {
    if constexpr (std::is_same_v<P, float>) {
      return arrays_.hi.get();
    } else {
      return nullptr;
    }
  }
  // Whether streaming stores may start at y.
  bool Aligned(const char* y) const {
    return !stream_ || reinterpret_cast<uintptr_t>(y) % 64 == 0;
  }
  // Elements [begin, end) from cache. The next range of a thread's run of
  // work is usually the next in memory: fetched into L2 meanwhile.
  void Write(int64_t begin, int64_t end) const {
    arrays_.Write(
        dtype_, layout_, x_ + begin * size_, y_ + begin * size_, begin, end,
        {.stream = stream_, .prefetch_next_bytes = (end - begin) * size_});
  }

  const DType dtype_;
  const int64_t size_;
  const char* const x_;
  char* const y_;
  const ChannelLayout layout_;
  const bool stream_;
  const ChannelAffineArrays<P> arrays_;
};

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

std::vector<Moments> ChannelAffineWithMoments(
    DType dtype, const void* x, void* y, const ChannelLayout& layout,
    const double* mean, const double* scale, const double* shift) {
  const char* in = static_cast<const char*>(x);
  char* out = static_cast<char*>(y);
  if (dtype == DType::kFloat64) {
    return ChannelMoments(
        dtype, x, layout,
        AffinePass<double>(dtype, in, out, layout, mean, scale, shift));
  }
  return ChannelMoments(
      dtype, x, layout,
      AffinePass<float>(dtype, in, out, layout, mean, scale, shift));
}

}  // namespace normd
