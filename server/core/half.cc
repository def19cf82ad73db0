#include "server/core/half.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace normd {
namespace {

// `value` rounded to fp32 to odd: truncated, the last bit set when inexact.
// Rounding that to a format 2 bits narrower or more rounds `value` itself.
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

}  // namespace normd
