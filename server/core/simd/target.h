// Which SIMD target the Highway kernels run: the best one compiled in that
// this CPU has, or the one NORMD_SIMD_TARGET names. Every target computes
// the same bits. Restrict once at start-up, before other threads run
// kernels: Highway's dispatch table is process-wide.
#ifndef NORMD_SERVER_CORE_SIMD_TARGET_H_
#define NORMD_SERVER_CORE_SIMD_TARGET_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace normd {

// The environment variable that picks the target.
inline constexpr char kSimdTargetVariable[] = "NORMD_SIMD_TARGET";

// The targets' names, best first: "avx3" (AVX-512), "avx2", "sse4", "sve",
// "neon", "scalar". x86-64 builds have avx3, avx2, sse4 and scalar; ARM64
// builds sve and neon.
const std::vector<std::string>& SimdTargetNames();

// The targets compiled in that this CPU runs, best first.
std::vector<std::string> AvailableSimdTargets();

// Makes the kernels run `name` from now on. InvalidArgument, naming
// NORMD_SIMD_TARGET and the choices, when the name is unknown, not
// compiled in or not run by this CPU; nothing changes then.
absl::Status RestrictSimdTarget(absl::string_view name);

// RestrictSimdTarget(value of NORMD_SIMD_TARGET) when it is set and not
// empty; OK and no change otherwise.
absl::Status RestrictSimdTargetFromEnvironment();

// The name of the target the kernels run now, e.g. "avx3".
std::string ActiveSimdTarget();

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_TARGET_H_
