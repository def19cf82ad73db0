#include "server/core/half.h"

#include <cstdint>
#include <limits>

#include "server/core/half_avx512.h"
#include "server/core/simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define NORMD_F16C_KERNELS 1
#endif

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined_* placeholders (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace normd {
namespace {

#ifdef NORMD_F16C_KERNELS
// Widening 16 at a time, prefetching the input kWidenPrefetchAhead ahead.
template <__m512 (*kConvert)(__m256i), float (*kScalar)(uint16_t)>
[[gnu::target("avx512f,avx512bw")]] void WidenAvx512(const uint16_t* src,
                                                     float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    if (i % 32 == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(src + i + kWidenPrefetchAhead),
                   _MM_HINT_T1);
    }
    _mm512_storeu_ps(dst + i, kConvert(_mm256_loadu_si256(
                                  reinterpret_cast<const __m256i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = kScalar(src[i]);
}

// Narrowing 16 at a time.
template <__m256i (*kConvert)(__m512), uint16_t (*kScalar)(float)>
[[gnu::target("avx512f")]] void NarrowAvx512(const float* src, uint16_t* dst,
                                             int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        kConvert(_mm512_loadu_ps(src + i)));
  }
  for (; i < n; ++i) dst[i] = kScalar(src[i]);
}

// Narrowing straight to memory with streaming stores: whole 64-byte lines
// of dst (32 elements) from two conversions; the unaligned head and the
// tail with ordinary stores. Fenced at the end.
template <__m256i (*kConvert)(__m512), uint16_t (*kScalar)(float)>
[[gnu::target("avx512f")]] void NarrowStreamingAvx512(const float* src,
                                                      uint16_t* dst,
                                                      int64_t n) {
  int64_t i = 0;
  while (i < n && reinterpret_cast<uintptr_t>(dst + i) % 64 != 0) {
    dst[i] = kScalar(src[i]);
    ++i;
  }
  for (; i + 32 <= n; i += 32) {
    const __m256i lo = kConvert(_mm512_loadu_ps(src + i));
    const __m256i hi = kConvert(_mm512_loadu_ps(src + i + 16));
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i),
                        _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
  }
  for (; i < n; ++i) dst[i] = kScalar(src[i]);
  _mm_sfence();
}

[[gnu::target("avx2,f16c")]] void WidenFloat16F16c(const uint16_t* src,
                                                   float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = Float16ToFloat(src[i]);
}

[[gnu::target("avx2,f16c")]] void NarrowFloat16F16c(const float* src,
                                                    uint16_t* dst, int64_t n) {
  int64_t i = 0;
  const __m256 canonical_nan =
      _mm256_castsi256_ps(_mm256_set1_epi32(kFloatNaNOfCanonicalFloat16));
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_loadu_ps(src + i);
    f = _mm256_blendv_ps(f, canonical_nan, _mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    const __m128i h =
        _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = FloatToFloat16(src[i]);
}

// 2: AVX-512F and BW, 1: F16C, 0: neither (portable loops). bfloat16 uses
// the AVX-512 forms or the portable loops.
int Float16Level() {
  static const int level = [] {
    __builtin_cpu_init();
    if (CpuHasAvx512Bw()) return 2;
    // F16C by CPUID (leaf 1, ECX bit 29): not every compiler's
    // __builtin_cpu_supports knows it (clang 14 does not).
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c =
        __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
    if (f16c && __builtin_cpu_supports("avx2")) return 1;
    return 0;
  }();
  return level;
}
#endif  // NORMD_F16C_KERNELS

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

namespace {

#ifdef NORMD_F16C_KERNELS
// A conversion's implementations; For() picks the widest this CPU runs.
template <typename Fn>
struct Conversion {
  Fn bf16_portable, bf16_avx512, f16_portable, f16_f16c, f16_avx512;
  Fn For(DType dtype) const {
    const int level = Float16Level();
    if (dtype == DType::kBFloat16) {
      return level == 2 ? bf16_avx512 : bf16_portable;
    }
    return level == 2 ? f16_avx512 : level == 1 ? f16_f16c : f16_portable;
  }
};
#endif

}  // namespace

void WidenHalf(DType dtype, const uint16_t* src, float* dst, int64_t n) {
#ifdef NORMD_F16C_KERNELS
  static constexpr Conversion<void (*)(const uint16_t*, float*, int64_t)>
      kWiden{WidenBFloat16, WidenAvx512<FloatsOfBFloat16x16, BFloat16ToFloat>,
             WidenFloat16, WidenFloat16F16c,
             WidenAvx512<FloatsOfFloat16x16, Float16ToFloat>};
  kWiden.For(dtype)(src, dst, n);
#else
  (dtype == DType::kBFloat16 ? WidenBFloat16 : WidenFloat16)(src, dst, n);
#endif
}

void NarrowToHalf(DType dtype, const float* src, uint16_t* dst, int64_t n) {
#ifdef NORMD_F16C_KERNELS
  static constexpr Conversion<void (*)(const float*, uint16_t*, int64_t)>
      kNarrow{NarrowBFloat16, NarrowAvx512<BFloat16x16, FloatToBFloat16>,
              NarrowFloat16, NarrowFloat16F16c,
              NarrowAvx512<Float16x16<>, FloatToFloat16>};
  kNarrow.For(dtype)(src, dst, n);
#else
  (dtype == DType::kBFloat16 ? NarrowBFloat16 : NarrowFloat16)(src, dst, n);
#endif
}

void NarrowToHalfStreaming(DType dtype, const float* src, uint16_t* dst,
                           int64_t n) {
#ifdef NORMD_F16C_KERNELS
  if (Float16Level() == 2) {
    if (dtype == DType::kBFloat16) {
      return NarrowStreamingAvx512<BFloat16x16, FloatToBFloat16>(src, dst, n);
    }
    return NarrowStreamingAvx512<Float16x16<>, FloatToFloat16>(src, dst, n);
  }
#endif
  NarrowToHalf(dtype, src, dst, n);
}

}  // namespace normd
