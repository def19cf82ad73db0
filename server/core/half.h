// Conversions between fp32 and the 16-bit formats bfloat16 and float16:
// widening is exact, narrowing rounds to nearest even (as PyTorch), and
// every NaN narrows to one canonical quiet NaN (NaN payloads depend on
// operand order, which compilers may change). Pure functions.
#ifndef NORMD_SERVER_CORE_HALF_H_
#define NORMD_SERVER_CORE_HALF_H_

#include <bit>
#include <cmath>
#include <cstdint>

#include "server/core/tensor.h"

namespace normd {

// bfloat16 -> fp32: the top 16 bits of an fp32 (exact).
inline float BFloat16ToFloat(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// The quiet NaN every NaN narrows to, whatever its sign and payload.
inline constexpr uint16_t kCanonicalBFloat16NaN = 0x7fc0;
inline constexpr uint16_t kCanonicalFloat16NaN = 0x7e00;

// fp32 -> bfloat16, round to nearest even; NaN becomes kCanonicalBFloat16NaN.
inline uint16_t FloatToBFloat16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return kCanonicalBFloat16NaN;
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// float16 -> fp32 (exact; a NaN comes out quiet, as from the CPUs'
// instructions). Branch-free, after Maratyszcza's FP16 library.
inline float Float16ToFloat(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // Normal values: move the exponent into place and rebias by 2^-112.
  const float normalized =
      std::bit_cast<float>((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
  // Subnormals: the mantissa as the low bits of 0.5f's, minus 0.5.
  const float denormalized =
      std::bit_cast<float>((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t magnitude = two_w < (1u << 27)
                                 ? std::bit_cast<uint32_t>(denormalized)
                                 : std::bit_cast<uint32_t>(normalized);
  return std::bit_cast<float>(sign | magnitude);
}

// fp32 -> float16, round to nearest even; overflow gives infinity, NaN
// kCanonicalFloat16NaN. Needs the default rounding mode, no flush-to-zero.
inline uint16_t FloatToFloat16(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007c00u;
  const uint32_t mantissa_bits = bits & 0x00000fffu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  if (shl1_w > 0xff000000u) return kCanonicalFloat16NaN;
  return static_cast<uint16_t>((sign >> 16) | nonsign);
}

// True for the 16-bit dtypes.
constexpr bool IsHalf(DType dtype) {
  return dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

// One element of a 16-bit dtype to fp32, and back (round to nearest even).
inline float HalfToFloat(DType dtype, uint16_t h) {
  return dtype == DType::kBFloat16 ? BFloat16ToFloat(h) : Float16ToFloat(h);
}
inline uint16_t FloatToHalf(DType dtype, float f) {
  return dtype == DType::kBFloat16 ? FloatToBFloat16(f) : FloatToFloat16(f);
}

// fp64 -> 16-bit dtype, correctly rounded: through fp32 rounded to odd.
uint16_t DoubleToHalf(DType dtype, double value);

// n 16-bit values of `dtype` at src widened to fp32 at dst (HalfToFloat's
// bits; simd/convert.cc).
void WidenHalf(DType dtype, const uint16_t* src, float* dst, int64_t n);

// n fp64 values at src rounded to fp32 at dst, as static_cast<float>
// (simd/convert.cc).
void DoublesToFloats(const double* src, float* dst, int64_t n);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_HALF_H_
