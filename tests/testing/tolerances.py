"""The bounds the Python tests hold normd's outputs to, from the error
analysis in tests/testing/reference.h (which the C++ core tests use).

- fp32 normalizations (LayerNorm, RMSNorm, BatchNorm, GroupNorm):
  fp32_output_bound, reference.h's Fp32OutputBound element by element:
  32 u (|y - b| + |w|) + u |y|, u = 2^-24.
- fp32 products by a norm's reciprocal (L2, weight norm): FP32_PRODUCT, the
  scale and the product rounding once each and the norm's own error, at
  most 4 u relative (tests/core/l2_norm_test.cc, weight_norm_test.cc).
- fp64: FP64_BAR, 1e-12 relative to the scale, numerics.md's fp64 bar (an
  fp64 value narrowed to fp32 errs by 6e-8).
- fp32 data's variance: FP32_VARIANCE_BAR, docs/api.md's 1e-7 relative.
"""
import numpy as np

U32 = 2.0 ** -24
U64 = 2.0 ** -53
FP32_PRODUCT = 4 * U32
FP64_BAR = 1e-12
FP32_VARIANCE_BAR = 1e-7


def fp32_output_bound(want, b=0.0, w=1.0):
    """Fp32OutputBound of each element of `want` (with bias b, weight w,
    broadcast against it)."""
    want = np.asarray(want, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    return 32 * U32 * (np.abs(want - b) + np.abs(w)) + U32 * np.abs(want)


def worst_excess(got, want, bound):
    """The largest |got - want| / bound (<= 1 when every element is within
    its bound)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(got - want) / np.asarray(bound)))
