// Compile-time helpers for the hot loops of the numeric core.
//
// NORMD_MULTIVERSION builds a function for AVX-512, AVX2 with FMA
// (x86-64-v3) and baseline x86-64 and picks one at load time (GCC/Clang
// target_clones), so one binary runs everywhere and uses the widest vectors
// the CPU has. The loops keep explicit lane arrays and the build disables FP
// contraction, so every variant does the same operations in the same order:
// results are bitwise identical whichever variant runs. Fused multiply-adds
// are written as std::fma: an instruction in the first two variants, a libm
// call (exact, so the same bits, only slower) in the baseline one, which
// only CPUs from before 2013 run.
#ifndef NORMD_SERVER_CORE_SIMD_H_
#define NORMD_SERVER_CORE_SIMD_H_

#include <atomic>
#include <cstdlib>

// Not under ThreadSanitizer: the clones' ifunc resolvers run before the
// TSan runtime is initialized, and its instrumentation of them crashes.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define NORMD_MULTIVERSION \
  __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define NORMD_MULTIVERSION
#endif

// For the bodies that multiversioned wrappers call: inlined into each clone,
// so they are compiled for that clone's instruction set.
#if defined(__GNUC__)
#define NORMD_INLINE_INTO_CLONES [[gnu::always_inline]] inline
#else
#define NORMD_INLINE_INTO_CLONES inline
#endif

namespace normd {

// What the CPU offers the hand-written AVX-512 kernels, checked once (thread-
// safe static initialization): AVX-512F for the fp32 ones, F and BW (word
// permutes, masked word stores) for the 16-bit ones. False off x86-64.
inline bool CpuHasAvx512F() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return has;
#else
  return false;
#endif
}
inline bool CpuHasAvx512Bw() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = [] {
    __builtin_cpu_init();
    return CpuHasAvx512F() && __builtin_cpu_supports("avx512bw") != 0;
  }();
  return has;
#else
  return false;
#endif
}

// Whether the 16-bit kernels may round to bfloat16 with the AVX512-BF16
// conversion instruction (same bits as the integer rounding; see
// half_avx512.h): the CPU has it (and F and BW), the environment variable
// NORMD_NO_AVX512_BF16 was not set when first asked, and no test turned it
// off with AllowAvx512Bf16ForTesting(false), which runs the code for
// AVX-512 CPUs without it (Skylake-X to Ice Lake). Thread-safe.
inline std::atomic<bool>& Avx512Bf16AllowedForTesting() {
  static std::atomic<bool> allowed{true};
  return allowed;
}
inline void AllowAvx512Bf16ForTesting(bool allowed) {
  Avx512Bf16AllowedForTesting().store(allowed, std::memory_order_relaxed);
}
inline bool CpuHasAvx512Bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = [] {
    __builtin_cpu_init();
    return CpuHasAvx512Bw() && __builtin_cpu_supports("avx512bf16") != 0 &&
           std::getenv("NORMD_NO_AVX512_BF16") == nullptr;
  }();
  return has && Avx512Bf16AllowedForTesting().load(std::memory_order_relaxed);
#else
  return false;
#endif
}

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_H_
