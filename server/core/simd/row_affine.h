// The elementwise affine of one normalized row, on Highway: compiled for
// every SIMD target and dispatched per call, the same bits on every target.
// One loop for every input and output type and store policy. Thread-safe
// (pure functions; x and y may be the same array when of one type).
#ifndef NORMD_SERVER_CORE_SIMD_ROW_AFFINE_H_
#define NORMD_SERVER_CORE_SIMD_ROW_AFFINE_H_

#include <cstdint>

#include "server/core/tensor.h"

namespace normd {

// The constants of one row's affine, and its formula:
// - rounded (fp32, fp64): y = ((x - hi) - lo) * scale [* weight] [+ bias],
//   each step rounded; the mean split as hi + lo so that x - hi is exact
//   near it (fp64: hi the mean, lo 0);
// - fused (16-bit outputs always, fp32 on request): t = fma(x - hi, scale,
//   -(lo * scale)), then fma(t, weight, bias) | t * weight | t + bias | t.
// hi, lo and scale are floats for fp32 computations (exactly). weight and
// bias: n values of the computation's type (double for fp64, else float),
// or null (= 1 / 0).
struct RowAffine {
  double hi = 0.0;
  double lo = 0.0;
  double scale = 0.0;
  const void* weight = nullptr;
  const void* bias = nullptr;
  bool fused = false;
};

// How a row is written: streaming stores (`stream`; the caller fences with
// StreamFence, streaming.h) or ordinary ones; `prefetch` (elements of
// prefetch_element_bytes) read prefetch_ahead_bytes ahead of each line
// written, if not null.
struct RowWrite {
  bool stream = false;
  const void* prefetch = nullptr;
  int64_t prefetch_element_bytes = 0;
  int64_t prefetch_ahead_bytes = 0;
};

// `count` rows of n values, row k: y[k n..(k + 1) n) (`out` values) = the
// affine rows[k] of x[k n..(k + 1) n) (`in` values), in one call (rows of
// a few dozen values cost their calls more than their values); every row
// takes rows[0]'s weight, bias and formula. in and out are both fp32 or
// both fp64, or out is 16-bit and in fp32 or out's type. 16-bit inputs are
// widened exactly, outputs narrowed to nearest even. Row k prefetches
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
