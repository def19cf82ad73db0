// Cached fp32, fp64 and fused-fp32 rows through RowAffineWrite
// (server/core/simd/row_affine.h), for the tests that check the row affine's
// formulas value by value. The fused fp32 row is the arithmetic of 16-bit
// outputs before they are narrowed.
#ifndef NORMD_TESTS_TESTING_ROW_AFFINE_CALLS_H_
#define NORMD_TESTS_TESTING_ROW_AFFINE_CALLS_H_

#include <cstdint>

#include "server/core/simd/row_affine.h"

namespace normd {

inline void FloatRowAffine(const float* x, float* y, int64_t n, float hi,
                           float lo, float scale, const float* weight,
                           const float* bias) {
  RowAffineWrite(DType::kFloat32, DType::kFloat32, x, y, n,
                 {hi, lo, scale, weight, bias, /*fused=*/false}, {});
}
inline void DoubleRowAffine(const double* x, double* y, int64_t n, double mean,
                            double scale, const double* weight,
                            const double* bias) {
  RowAffineWrite(DType::kFloat64, DType::kFloat64, x, y, n,
                 {mean, 0.0, scale, weight, bias, /*fused=*/false}, {});
}
inline void HalfRowAffine(const float* x, float* y, int64_t n, float hi,
                          float lo, float scale, const float* weight,
                          const float* bias) {
  RowAffineWrite(DType::kFloat32, DType::kFloat32, x, y, n,
                 {hi, lo, scale, weight, bias, /*fused=*/true}, {});
}

}  // namespace normd

#endif  // NORMD_TESTS_TESTING_ROW_AFFINE_CALLS_H_
