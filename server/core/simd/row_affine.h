// The elementwise affine of one normalized row, on Highway: compiled for
// every SIMD target and dispatched per call, the same bits on every target.
// weight / bias have n entries or are null (= 1 / 0). Thread-safe (pure
// functions; x and y may be the same array).
#ifndef NORMD_SERVER_CORE_SIMD_ROW_AFFINE_H_
#define NORMD_SERVER_CORE_SIMD_ROW_AFFINE_H_

#include <cstdint>

namespace normd {

// fp32 rows: y = ((x - hi) - lo) * scale [* weight] [+ bias], each step
// rounded (no fused operation), the mean split as hi + lo so that x - hi
// is exact near it.
void FloatRowAffine(const float* x, float* y, int64_t n, float hi, float lo,
                    float scale, const float* weight, const float* bias);

// fp64 rows: y = (x - mean) * scale [* weight] [+ bias], each step rounded.
void DoubleRowAffine(const double* x, double* y, int64_t n, double mean,
                     double scale, const double* weight, const double* bias);

// The fp32 results of a 16-bit row before narrowing (one rounding fewer):
// t = fma(x - hi, scale, -(lo * scale)), then fma(t, weight, bias) |
// t * weight | t + bias | t.
void HalfRowAffine(const float* x, float* y, int64_t n, float hi, float lo,
                   float scale, const float* weight, const float* bias);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_ROW_AFFINE_H_
