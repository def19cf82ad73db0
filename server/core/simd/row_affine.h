// The elementwise affine of normalized rows, on Highway with the same bits
// on every target: one loop for every type and store policy. Pure
// functions (x and y may be one array when of one type).
#ifndef NORMD_SERVER_CORE_SIMD_ROW_AFFINE_H_
#define NORMD_SERVER_CORE_SIMD_ROW_AFFINE_H_

#include <cstdint>

#include "server/core/tensor.h"

namespace normd {

// One row's affine, the mean split as hi + lo so that x - hi is exact near
// it (fp64: hi the mean, lo 0):
// - rounded (fp32, fp64): y = ((x - hi) - lo) * scale [* weight] [+ bias];
// - fused (16-bit outputs; fp32 when asked, for tests): t = fma(x - hi,
//   scale, -(lo * scale)), then fma(t, weight, bias), t * weight, t + bias
//   or t.
// hi, lo, scale: floats for fp32 computations. weight, bias: n values of
// the computation's type (double for fp64, else float), or null (1 / 0).
struct RowAffine {
  double hi = 0.0;
  double lo = 0.0;
  double scale = 0.0;
  const void* weight = nullptr;
  const void* bias = nullptr;
  bool fused = false;
};

// How a row is written: streaming stores (the caller fences with
// StreamFence) or ordinary ones; `prefetch` (elements of
// prefetch_element_bytes), if not null, read prefetch_ahead_bytes ahead.
struct RowWrite {
  bool stream = false;
  const void* prefetch = nullptr;
  int64_t prefetch_element_bytes = 0;
  int64_t prefetch_ahead_bytes = 0;
};

// `count` rows of n values: y's row k (`out` values) = affine rows[k] of
// x's row k (`in` values), with rows[0]'s weight, bias and formula. in and
// out are one type, or out is 16-bit and in fp32. Row k prefetches
// write.prefetch + k n elements.
void RowsAffineWrite(DType in, DType out, const void* x, void* y, int64_t n,
                     int64_t count, const RowAffine* rows,
                     const RowWrite& write);

// One row.
inline void RowAffineWrite(DType in, DType out, const void* x, void* y,
                           int64_t n, const RowAffine& a,
                           const RowWrite& write) {
  RowsAffineWrite(in, out, x, y, n, 1, &a, write);
}

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_ROW_AFFINE_H_
