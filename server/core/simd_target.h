// Which SIMD target Highway's dynamic dispatch runs in the core: the best
// one compiled in that this CPU supports, unless tests pin another.
// Thread-safe.
#ifndef NORMD_SERVER_CORE_SIMD_TARGET_H_
#define NORMD_SERVER_CORE_SIMD_TARGET_H_

namespace normd {

// Highway's name of the target dispatch chooses now, e.g. "AVX3", "AVX2",
// "NEON" or "SCALAR".
const char* DispatchedSimdTarget();

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_TARGET_H_
