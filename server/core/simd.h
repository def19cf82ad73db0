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
#include <string>

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

// What the CPU offers the hand-written AVX-512 kernels, detected once
// (thread-safe static initialization): AVX-512F for the fp32 ones, F and BW
// (word permutes, masked word stores) for the 16-bit ones, and BF16 (the
// bfloat16 rounding instruction) beside them. Each implies the one before.
// All false off x86-64.
struct CpuAvx512Features {
  bool f = false;
  bool bw = false;
  bool bf16 = false;
};
inline const CpuAvx512Features& DetectedAvx512Features() {
  static const CpuAvx512Features features = [] {
    CpuAvx512Features detected;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    detected.f = __builtin_cpu_supports("avx512f") != 0;
    detected.bw = detected.f && __builtin_cpu_supports("avx512bw") != 0;
    detected.bf16 = detected.bw && __builtin_cpu_supports("avx512bf16") != 0;
#endif
    return detected;
  }();
  return features;
}
namespace simd_internal {
// False once RestrictSimdTarget (simd/target.h) picked a target other than
// AVX3: the hand-written AVX-512 kernels stand aside as well.
inline std::atomic<bool>& HandWrittenAvx512Allowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}
}  // namespace simd_internal
inline bool CpuHasAvx512F() {
  return DetectedAvx512Features().f &&
         simd_internal::HandWrittenAvx512Allowed().load(
             std::memory_order_relaxed);
}
inline bool CpuHasAvx512Bw() {
  return DetectedAvx512Features().bw && CpuHasAvx512F();
}

// Whether the CPU has AVX512-BF16 (and F and BW), and whether the
// environment variable NORMD_NO_AVX512_BF16 was set (read once).
inline bool CpuSupportsAvx512Bf16() { return DetectedAvx512Features().bf16; }
inline bool Avx512Bf16TurnedOff() {
  static const bool off = std::getenv("NORMD_NO_AVX512_BF16") != nullptr;
  return off;
}

namespace simd_internal {
inline std::atomic<bool>& Avx512Bf16Allowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}
}  // namespace simd_internal

// Tests: AllowAvx512Bf16ForTesting(false) runs the code of AVX-512 CPUs
// without AVX512-BF16 (Skylake-X to Ice Lake) until it is allowed again.
inline void AllowAvx512Bf16ForTesting(bool allowed) {
  simd_internal::Avx512Bf16Allowed().store(allowed, std::memory_order_relaxed);
}

// Whether the 16-bit kernels may round to bfloat16 with the AVX512-BF16
// conversion instruction (same bits as the integer rounding; see
// half_avx512.h): the CPU has it, NORMD_NO_AVX512_BF16 is not set and no
// test turned it off. Thread-safe.
inline bool CpuHasAvx512Bf16() {
  return CpuSupportsAvx512Bf16() && CpuHasAvx512F() && !Avx512Bf16TurnedOff() &&
         simd_internal::Avx512Bf16Allowed().load(std::memory_order_relaxed);
}

// What the hand-written kernels use on this CPU, for the start-up log:
// "AVX-512 (F, BW, BF16)", "AVX-512 (F, BW)" (and why BF16 is not used when
// the CPU has it), "AVX-512F", or "compiled loops (no AVX-512)": their AVX2
// or baseline clones.
inline std::string KernelInstructionSet() {
  if (DetectedAvx512Features().f && !CpuHasAvx512F()) {
    return "compiled loops (AVX-512 off: NORMD_SIMD_TARGET)";
  }
  if (!CpuHasAvx512F()) return "compiled loops (no AVX-512)";
  if (!CpuHasAvx512Bw()) return "AVX-512F";
  if (CpuHasAvx512Bf16()) return "AVX-512 (F, BW, BF16)";
  if (CpuSupportsAvx512Bf16() && Avx512Bf16TurnedOff()) {
    return "AVX-512 (F, BW; BF16 off: NORMD_NO_AVX512_BF16)";
  }
  return "AVX-512 (F, BW)";
}

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_H_
