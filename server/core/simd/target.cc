#include "server/core/simd/target.h"

#include <cstdint>
#include <cstdlib>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/target.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {

// The target this copy of the file was compiled for.
int64_t CompiledTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hwy/targets.h"

namespace normd {
namespace {

HWY_EXPORT(CompiledTarget);

// Each name and the Highway targets it stands for, best first.
struct NamedTarget {
  const char* name;
  int64_t targets;
};
constexpr NamedTarget kNamedTargets[] = {
    {"avx3", HWY_AVX3 | HWY_AVX3_DL},
    {"avx2", HWY_AVX2},
    {"sse4", HWY_SSE4},
    {"sve", HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128},
    {"neon", HWY_NEON},
    {"scalar", HWY_SCALAR | HWY_EMU128},
};

std::vector<std::string> NamesOf(int64_t targets) {
  std::vector<std::string> names;
  for (const NamedTarget& named : kNamedTargets) {
    if ((named.targets & targets) != 0) names.push_back(named.name);
  }
  return names;
}

}  // namespace

const std::vector<std::string>& SimdTargetNames() {
  static const auto* names = new std::vector<std::string>(NamesOf(~0LL));
  return *names;
}

std::vector<std::string> AvailableSimdTargets() {
  return NamesOf(hwy::SupportedTargets() & HWY_TARGETS);
}

absl::Status RestrictSimdTarget(absl::string_view name) {
  const NamedTarget* chosen = nullptr;
  for (const NamedTarget& named : kNamedTargets) {
    if (name == named.name) chosen = &named;
  }
  if (chosen == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        kSimdTargetVariable, "=", name, ": unknown SIMD target; one of ",
        absl::StrJoin(SimdTargetNames(), ", ")));
  }
  if ((chosen->targets & HWY_TARGETS) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kSimdTargetVariable, "=", name,
                     ": not compiled into this build, which has ",
                     absl::StrJoin(NamesOf(HWY_TARGETS), ", ")));
  }
  const int64_t runnable = hwy::SupportedTargets() & chosen->targets;
  if (runnable == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kSimdTargetVariable, "=", name, ": this CPU cannot run it; it runs ",
        absl::StrJoin(AvailableSimdTargets(), ", ")));
  }
  hwy::DisableTargets(HWY_TARGETS & ~runnable);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  return absl::OkStatus();
}

absl::Status RestrictSimdTargetFromEnvironment() {
  const char* value = std::getenv(kSimdTargetVariable);
  if (value == nullptr || *value == '\0') return absl::OkStatus();
  return RestrictSimdTarget(value);
}

std::string ActiveSimdTarget() {
  const std::vector<std::string> names =
      NamesOf(HWY_DYNAMIC_DISPATCH(CompiledTarget)());
  return names.empty() ? "unknown" : names.front();
}

}  // namespace normd
#endif  // HWY_ONCE
