#include "server/core/kernels.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>

#include "server/core/moments.h"

namespace normd {
namespace {

// Elements per parallel work item of the elementwise passes.
constexpr int64_t kApplyChunk = 16384;
// Rows at least this long are reduced and written in parallel one at a time;
// shorter rows are processed whole, many rows per work item.
constexpr int64_t kLongRow = 4 * kMomentsBlock;

// y[j] = (x[j] - mean) * scale * weight[j] + bias[j] for j in [0, n), with
// weight / bias optional.
template <typename T>
void AffineRow(const T* x, T* y, int64_t n, double mean, double scale,
               const double* weight, const double* bias) {
  if (weight != nullptr && bias != nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      y[j] = static_cast<T>(
          (static_cast<double>(x[j]) - mean) * scale * weight[j] + bias[j]);
    }
  } else if (weight != nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      y[j] = static_cast<T>((static_cast<double>(x[j]) - mean) * scale *
                            weight[j]);
    }
  } else if (bias != nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      y[j] =
          static_cast<T>((static_cast<double>(x[j]) - mean) * scale + bias[j]);
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      y[j] = static_cast<T>((static_cast<double>(x[j]) - mean) * scale);
    }
  }
}

double RowScale(const Moments& moments, double eps, LayerNormStyle style) {
  if (style == LayerNormStyle::kBertUnbiasedStd) {
    return 1.0 / (std::sqrt(moments.UnbiasedVariance()) + eps);
  }
  return 1.0 / std::sqrt(moments.BiasedVariance() + eps);
}

}  // namespace

template <typename T>
void LayerNormKernel(const T* x, T* y, const RowLayout& rows, double eps,
                     LayerNormStyle style, const double* weight,
                     const double* bias) {
  const int64_t n = rows.row_size;
  if (rows.rows == 0 || n == 0) return;
  if (n >= kLongRow) {
    for (int64_t r = 0; r < rows.rows; ++r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      const Moments moments = ContiguousMoments(xr, n);
      const double scale = RowScale(moments, eps, style);
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kApplyChunk),
                        [&](const tbb::blocked_range<int64_t>& range) {
                          const int64_t j = range.begin();
                          AffineRow(xr + j, yr + j, range.end() - j,
                                    moments.mean, scale,
                                    weight == nullptr ? nullptr : weight + j,
                                    bias == nullptr ? nullptr : bias + j);
                        });
    }
    return;
  }
  const int64_t rows_per_item = std::max<int64_t>(1, kApplyChunk / n);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows.rows, rows_per_item),
                    [&](const tbb::blocked_range<int64_t>& range) {
                      for (int64_t r = range.begin(); r < range.end(); ++r) {
                        const Moments moments = ContiguousMoments(x + r * n, n);
                        AffineRow(x + r * n, y + r * n, n, moments.mean,
                                  RowScale(moments, eps, style), weight, bias);
                      }
                    });
}

template <typename T>
void ChannelAffineKernel(const T* x, T* y, const ChannelLayout& layout,
                         const double* mean, const double* scale,
                         const double* shift) {
  const int64_t total = layout.NumElements();
  const int64_t channels = layout.channels;
  const int64_t inner = layout.inner;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, total, kApplyChunk),
      [&](const tbb::blocked_range<int64_t>& range) {
        int64_t pos = range.begin();
        const int64_t end = range.end();
        if (inner == 1) {
          // Channels-last: walk runs of consecutive channels.
          while (pos < end) {
            const int64_t c = pos % channels;
            const int64_t run = std::min(channels - c, end - pos);
            const T* xs = x + pos;
            T* ys = y + pos;
            for (int64_t k = 0; k < run; ++k) {
              ys[k] = static_cast<T>(
                  (static_cast<double>(xs[k]) - mean[c + k]) * scale[c + k] +
                  shift[c + k]);
            }
            pos += run;
          }
          return;
        }
        // Walk runs of one channel's contiguous values.
        while (pos < end) {
          const int64_t c = (pos / inner) % channels;
          const int64_t run = std::min(inner - pos % inner, end - pos);
          const T* xs = x + pos;
          T* ys = y + pos;
          const double m = mean[c];
          const double s = scale[c];
          const double b = shift[c];
          for (int64_t k = 0; k < run; ++k) {
            ys[k] = static_cast<T>((static_cast<double>(xs[k]) - m) * s + b);
          }
          pos += run;
        }
      });
}

template void LayerNormKernel<float>(const float*, float*, const RowLayout&,
                                     double, LayerNormStyle, const double*,
                                     const double*);
template void LayerNormKernel<double>(const double*, double*, const RowLayout&,
                                      double, LayerNormStyle, const double*,
                                      const double*);
template void ChannelAffineKernel<float>(const float*, float*,
                                         const ChannelLayout&, const double*,
                                         const double*, const double*);
template void ChannelAffineKernel<double>(const double*, double*,
                                          const ChannelLayout&, const double*,
                                          const double*, const double*);

}  // namespace normd
