#include "server/core/half.h"

#include <cstdint>
#include <limits>

#include "server/core/simd.h"

namespace normd {
namespace {

NORMD_MULTIVERSION void WidenBFloat16(const uint16_t* __restrict src,
                                      float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(src[i]);
}

NORMD_MULTIVERSION void WidenFloat16(const uint16_t* __restrict src,
                                     float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Float16ToFloat(src[i]);
}

NORMD_MULTIVERSION void NarrowBFloat16(const float* __restrict src,
                                       uint16_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16(src[i]);
}

NORMD_MULTIVERSION void NarrowFloat16(const float* __restrict src,
                                      uint16_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToFloat16(src[i]);
}

// `value` rounded to fp32 with round-to-odd: truncated toward zero, and the
// last mantissa bit set when anything was dropped. Rounding that result once
// more to a format at least 2 bits narrower gives the correctly rounded
// value of `value` itself.
float ToFloatRoundToOdd(double value) {
  if (!std::isfinite(value)) return static_cast<float>(value);
  float f = static_cast<float>(value);
  if (static_cast<double>(f) == value) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(value)) {
    f = std::nextafter(f, 0.0f);  // Now truncated toward zero.
  }
  if (std::isinf(f)) {  // |value| beyond FLT_MAX rounds to the largest finite.
    f = std::copysign(std::numeric_limits<float>::max(), f);
  }
  uint32_t bits = std::bit_cast<uint32_t>(f);
  bits |= 1u;
  return std::bit_cast<float>(bits);
}

}  // namespace

uint16_t DoubleToHalf(DType dtype, double value) {
  return FloatToHalf(dtype, ToFloatRoundToOdd(value));
}

void WidenHalf(DType dtype, const uint16_t* src, float* dst, int64_t n) {
  if (dtype == DType::kBFloat16) {
    WidenBFloat16(src, dst, n);
  } else {
    WidenFloat16(src, dst, n);
  }
}

void NarrowToHalf(DType dtype, const float* src, uint16_t* dst, int64_t n) {
  if (dtype == DType::kBFloat16) {
    NarrowBFloat16(src, dst, n);
  } else {
    NarrowFloat16(src, dst, n);
  }
}

}  // namespace normd
