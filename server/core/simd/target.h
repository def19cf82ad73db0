// Which SIMD target the core's Highway kernels run: the best one compiled
// in that this CPU has, or the one NORMD_SIMD_TARGET names. Every target
// computes the same bits (see docs/architecture.md); the choice only changes
// speed. Restrict once at start-up, before the kernels run on other threads:
// Highway's dispatch table is process-wide.
#ifndef NORMD_SERVER_CORE_SIMD_TARGET_H_
#define NORMD_SERVER_CORE_SIMD_TARGET_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace normd {

// The environment variable that picks the target.
inline constexpr char kSimdTargetVariable[] = "NORMD_SIMD_TARGET";

// normd's names of the targets, best first: "avx3" (AVX-512), "avx2",
// "sse4", "sve", "neon", "scalar". x86-64 builds have the first three and
// scalar; ARM64 builds sve and neon (every ARM64 CPU has NEON, so there is
// no scalar fallback there).
const std::vector<std::string>& SimdTargetNames();

// The names of the targets compiled into this build that this CPU runs,
// best first (what the unrestricted dispatch chooses among).
std::vector<std::string> AvailableSimdTargets();

// Makes the kernels run `name` (one of SimdTargetNames()) from now on.
// InvalidArgument, naming NORMD_SIMD_TARGET and the choices, when the name
// is unknown, not compiled in or not supported by this CPU; nothing changes
// then.
absl::Status RestrictSimdTarget(absl::string_view name);

// RestrictSimdTarget(value of NORMD_SIMD_TARGET) when it is set and not
// empty; OK and no change otherwise.
absl::Status RestrictSimdTargetFromEnvironment();

// The name of the target the kernels run now, e.g. "avx3".
std::string ActiveSimdTarget();

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SIMD_TARGET_H_
