// The elementwise normalization kernels: each output depends only on its
// input and per-row or per-channel constants, so it is the same at any
// thread count. Parallel (oneTBB); safe from many threads on distinct
// outputs.
#ifndef NORMD_SERVER_CORE_KERNELS_H_
#define NORMD_SERVER_CORE_KERNELS_H_

#include <cstdint>
#include <vector>

#include "server/core/layout.h"
#include "server/core/moments.h"
#include "server/core/tensor.h"

namespace normd {

// How a row kernel turns a row's moments into a center and a scale.
enum class LayerNormStyle {
  kPyTorch,          // x - mean, times 1 / sqrt(biased_var + eps)
  kBertUnbiasedStd,  // x - mean, times 1 / (sqrt(unbiased_var) + eps)
  kRms,  // RMSNorm: x (no centering), times 1 / sqrt(mean(x^2) + eps)
  kL2,   // L2_NORM: x (no centering), times 1 / max(||x||_2, eps)
};

// Where a kernel reads its input: contiguous memory, or (fp32 and fp64)
// a ScatteredBytes copied into a per-thread buffer piece by piece. A value.
struct InputSource {
  const char* data = nullptr;                 // Contiguous input, or null.
  const ScatteredBytes* scattered = nullptr;  // Used when data is null.

  // Bytes [begin, begin + n): in place, or copied into `staging`.
  const char* Read(int64_t begin, int64_t n, char* staging) const {
    if (data != nullptr) return data + begin;
    scattered->CopyOut(begin, n, staging);
    return staging;
  }
};

// LayerNorm (or RMSNorm, by `style`) of x into y, elements of `dtype` (x
// == y allowed for contiguous x): per row of rows.row_size values,
// y = (x - center(row)) * scale(row) * weight[j] + bias[j], weight and bias
// row_size values or null (1 / 0). 16-bit rows are computed in fp32 from
// fp64 statistics and rounded once. Scattered input needs rows shorter
// than kLongLayerNormRow (see Engine::ReadsScatteredInPlace).
void LayerNormKernel(DType dtype, const InputSource& x, void* y,
                     const RowLayout& rows, double eps, LayerNormStyle style,
                     const double* weight, const double* bias);
template <typename T>
void LayerNormKernel(const T* x, T* y, const RowLayout& rows, double eps,
                     LayerNormStyle style, const double* weight,
                     const double* bias) {
  LayerNormKernel(FloatingDType<T>(), {reinterpret_cast<const char*>(x)}, y,
                  rows, eps, style, weight, bias);
}

// Rows at least this long, when too few to give every thread several, are
// reduced and written one at a time, each by every thread.
inline constexpr int64_t kLongLayerNormRow = 32768;

// How ChannelAffineKernel walks its tensor. The output is the same.
enum class Traversal {
  kParallel,  // Cache-sized pieces in parallel.
  // The pieces from the last to the first on the calling thread: for a
  // caller that has just read x forwards (say for its statistics) and runs
  // one such call per task, so that the end of x, still in this core's
  // cache, is read again first.
  kBackwardsOnThisThread,
};

// y = (x - mean[c]) * scale[c] + shift[c] for every element of channel c of
// a tensor of `dtype` laid out as `layout` (x == y allowed for contiguous
// x). fp32 and 16-bit: fma(x - hi, scale, shift - (mean - hi) * scale) in
// fp32, hi the mean rounded to float (simd/channel_affine.h).
// `output_elements`, when larger, is the whole output this call writes part
// of: it decides whether stores bypass the cache.
void ChannelAffineKernel(DType dtype, const InputSource& x, void* y,
                         const ChannelLayout& layout, const double* mean,
                         const double* scale, const double* shift,
                         int64_t output_elements = 0,
                         Traversal traversal = Traversal::kParallel);

template <typename T>
void ChannelAffineKernel(const T* x, T* y, const ChannelLayout& layout,
                         const double* mean, const double* scale,
                         const double* shift) {
  ChannelAffineKernel(FloatingDType<T>(), {reinterpret_cast<const char*>(x)}, y,
                      layout, mean, scale, shift);
}

// ChannelAffineKernel of contiguous x that also returns ChannelMoments(x,
// layout, mean) (the means as shift hints: where long blocks and
// channels-last tiles take them, x - mean is taken once for both), the same
// bits as each, in one
// read of x: every block of the moments is normalized while it is still in
// cache. x == y allowed.
std::vector<Moments> ChannelAffineWithMoments(
    DType dtype, const void* x, void* y, const ChannelLayout& layout,
    const double* mean, const double* scale, const double* shift);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_KERNELS_H_
