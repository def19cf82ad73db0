// Elementwise normalization kernels of the numeric core. Each output element
// depends only on its input and per-row / per-channel constants, so the
// output is identical for any number of threads. Parallel with oneTBB; safe to
// call from many threads at once on distinct outputs.
#ifndef NORMD_SERVER_CORE_KERNELS_H_
#define NORMD_SERVER_CORE_KERNELS_H_

#include <cstdint>

#include "server/core/layout.h"

namespace normd {

// How LayerNorm turns a row's moments into a scale.
enum class LayerNormStyle {
  kPyTorch,          // 1 / sqrt(biased_var + eps)
  kBertUnbiasedStd,  // 1 / (sqrt(unbiased_var) + eps)
};

// LayerNorm of x into y (x == y allowed): per row of `rows.row_size` values,
// y = (x - mean) * scale(row) * weight[j] + bias[j]. weight/bias have
// row_size entries or are null (= 1 / 0). The moments are exact (see
// moments.h).
template <typename T>
void LayerNormKernel(const T* x, T* y, const RowLayout& rows, double eps,
                     LayerNormStyle style, const double* weight,
                     const double* bias);

// y = (x - mean[c]) * scale[c] + shift[c] for every element of channel c of a
// tensor laid out as `layout` (x == y allowed).
template <typename T>
void ChannelAffineKernel(const T* x, T* y, const ChannelLayout& layout,
                         const double* mean, const double* scale,
                         const double* shift);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_KERNELS_H_
