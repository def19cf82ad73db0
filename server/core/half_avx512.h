// AVX-512 (F, BW and BF16) conversions of 16 lanes between fp32 and the 16-bit
// storage formats, for the hand-written kernels that widen and narrow as they
// load and store (kernels.cc, moments.cc). Internal to the
// core; call only where CpuHasAvx512Bw() (simd.h), the ones named Avx512Bf16
// only where CpuHasAvx512Bf16(), from functions compiled for it. Pure
// functions.
#ifndef NORMD_SERVER_CORE_HALF_AVX512_H_
#define NORMD_SERVER_CORE_HALF_AVX512_H_

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <cstdint>

#include "server/core/half.h"

#define NORMD_HALF_AVX512 1

namespace normd {

// float16 uses the CPU's conversion instructions, bfloat16 integer ops; both
// round to nearest even like the scalar FloatToFloat16 / FloatToBFloat16.

// kCanonicalNaN = false skips the NaN fix-up (two operations per vector):
// only for values known not to be NaN.

// 16 floats to float16 (round to nearest even; NaN: the canonical NaN).
template <bool kCanonicalNaN = true>
[[gnu::target("avx512f")]] inline __m256i Float16x16(__m512 f) {
  if constexpr (kCanonicalNaN) {
    const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    f = _mm512_mask_mov_ps(
        f, nan,
        _mm512_castsi512_ps(_mm512_set1_epi32(kFloatNaNOfCanonicalFloat16)));
  }
  return _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// 16 floats to bfloat16 in the high halves of 32-bit lanes: adds 0x7fff
// plus the lowest kept bit (round to nearest even); NaN lanes become the
// canonical NaN, as FloatToBFloat16.
template <bool kCanonicalNaN = true>
[[gnu::target("avx512f")]] inline __m512i BFloat16Rounded(__m512 f) {
  const __m512i bits = _mm512_castps_si512(f);
  // Lanes whose lowest kept bit is set get 0x8000: three operations.
  const __mmask16 odd =
      _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x10000));
  const __m512i rounded =
      _mm512_mask_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)),
                            odd, bits, _mm512_set1_epi32(0x8000));
  if constexpr (!kCanonicalNaN) return rounded;
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(rounded, nan,
                               _mm512_set1_epi32(kCanonicalBFloat16NaN << 16));
}

// 16 floats to bfloat16.
[[gnu::target("avx512f")]] inline __m256i BFloat16x16(__m512 f) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(BFloat16Rounded(f), 16));
}

// 32 floats (two vectors) to 32 float16 / bfloat16 values, `low` first, as
// Float16x16 / BFloat16x16 of each. bfloat16 packs the two vectors' rounded
// high halves with one word permute instead of two narrowing moves.
template <bool kCanonicalNaN = true>
[[gnu::target("avx512f,avx512bw")]] inline __m512i Float16x32(__m512 low,
                                                              __m512 high) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(Float16x16<kCanonicalNaN>(low)),
      Float16x16<kCanonicalNaN>(high), 1);
}
template <bool kCanonicalNaN = true>
[[gnu::target("avx512f,avx512bw")]] inline __m512i BFloat16x32(__m512 low,
                                                               __m512 high) {
  // Word 2i + 1 of the pair (low: 0..31, high: 32..63) for i = 0..31.
  alignas(64) static constexpr uint16_t kHighWords[32] = {
      1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
      33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  return _mm512_permutex2var_epi16(BFloat16Rounded<kCanonicalNaN>(low),
                                   _mm512_load_si512(kHighWords),
                                   BFloat16Rounded<kCanonicalNaN>(high));
}

// 16 float16 / bfloat16 patterns to floats.
[[gnu::target("avx512f")]] inline __m512 FloatsOfFloat16x16(__m256i h) {
  return _mm512_cvtph_ps(h);
}
// bfloat16: one word permute puts value i in the high half of lane i and
// zeroes the low halves (half the operations of zero-extend and shift).
[[gnu::target("avx512f,avx512bw")]] inline __m512 FloatsOfBFloat16x16(
    __m256i h) {
  // Word 2i + 1 takes word i of h; even words are zeroed by the mask.
  alignas(64) static constexpr uint16_t kHighHalves[32] = {
      0, 0, 0, 1, 0, 2,  0, 3,  0, 4,  0, 5,  0, 6,  0, 7,
      0, 8, 0, 9, 0, 10, 0, 11, 0, 12, 0, 13, 0, 14, 0, 15};
  return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(
      0xAAAAAAAAu, _mm512_load_si512(kHighHalves), _mm512_castsi256_si512(h)));
}

// bfloat16 without word permutes: 32 values loaded as one vector of 32-bit
// lanes are two fp32 vectors as they stand, `even` (values 0, 2, .., 30:
// each lane's low word shifted up) and `odd` (1, 3, .., 31: the low words
// cleared); results narrow back the same way (the rounded even lanes
// shifted down, merged with the rounded odd lanes' high words), so 32 values
// take two cheap operations each way instead of two or three permutes (port
// 5 only). Every value gets the same operations as in the 16-lane code, in
// another lane: the same bits.
struct BFloat16Pair {
  __m512 even, odd;
};

[[gnu::target("avx512f")]] inline BFloat16Pair WidenBFloat16Pair(__m512i v) {
  return {
      _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
      _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF0000u)))};
}

template <bool kCanonicalNaN>
[[gnu::target("avx512f")]] inline __m512i NarrowBFloat16Pair(__m512 even,
                                                             __m512 odd) {
  const __m512i low =
      _mm512_srli_epi32(BFloat16Rounded<kCanonicalNaN>(even), 16);
  // low | (odd & 0xFFFF0000): ternary-logic table 0xF8 (A | (B & C)).
  return _mm512_ternarylogic_epi32(low, BFloat16Rounded<kCanonicalNaN>(odd),
                                   _mm512_set1_epi32(0xFFFF0000u), 0xF8);
}

// The same two narrowings with the AVX512-BF16 conversion instruction
// (call only where CpuHasAvx512Bf16(), simd.h): one conversion of both
// vectors (and for pairs one word permute) instead of the integer rounding.
// It rounds to nearest even as BFloat16Rounded does, but flushes subnormal
// inputs and results to zero and keeps NaN payloads, so a line holding a
// word with exponent 0 (zero or subnormal) or, with kCanonicalNaN, exponent
// 255 (infinity or NaN) is narrowed again the integer way: the same bits as
// BFloat16x32 / NarrowBFloat16Pair for every input. A normal fp32 value
// never rounds to such a word (bfloat16 has fp32's exponent range) except
// by overflowing to infinity, so those lines are rare.
template <bool kCanonicalNaN>
[[gnu::target("avx512f,avx512bw,avx512bf16")]] inline bool NeedsIntegerRounding(
    __m512i words) {
  if constexpr (kCanonicalNaN) {
    // Adding 1 to the exponent field maps 255 to 0 and 0 to 1: both leave
    // bits 8-14 clear.
    return _mm512_testn_epi16_mask(
               _mm512_add_epi16(words, _mm512_set1_epi16(0x0080)),
               _mm512_set1_epi16(0x7F00)) != 0;
  }
  return _mm512_testn_epi16_mask(words, _mm512_set1_epi16(0x7F80)) != 0;
}

// BFloat16x32 with the instruction.
template <bool kCanonicalNaN = true>
[[gnu::target("avx512f,avx512bw,avx512bf16")]] inline __m512i
BFloat16x32Avx512Bf16(__m512 low, __m512 high) {
  const auto words = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high, low));
  if (__builtin_expect(!NeedsIntegerRounding<kCanonicalNaN>(words), 1)) {
    return words;
  }
  return BFloat16x32<kCanonicalNaN>(low, high);
}

// NarrowBFloat16Pair with the instruction: `even` converted into words
// 0-15 and `odd` into 16-31, then interleaved.
template <bool kCanonicalNaN>
[[gnu::target("avx512f,avx512bw,avx512bf16")]] inline __m512i
NarrowBFloat16PairAvx512Bf16(__m512 even, __m512 odd) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const auto words = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even));
  if (__builtin_expect(!NeedsIntegerRounding<kCanonicalNaN>(words), 1)) {
    return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), words);
  }
  return NarrowBFloat16Pair<kCanonicalNaN>(even, odd);
}

}  // namespace normd

#endif  // __x86_64__ && __GNUC__
#endif  // NORMD_SERVER_CORE_HALF_AVX512_H_
