// Runs a test body once per SIMD target that is both compiled into normd's
// core (Highway's HWY_TARGETS) and supported by this CPU, with Highway's
// dispatch pinned to that target. Test-only; not thread-safe (it changes
// the process-wide dispatch).
#ifndef NORMD_TESTS_TESTING_SIMD_TARGETS_H_
#define NORMD_TESTS_TESTING_SIMD_TARGETS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "hwy/targets.h"

namespace normd::testing {

// The targets ForEachSimdTarget visits, best first.
inline std::vector<int64_t> SimdTargets() {
  hwy::SetSupportedTargetsForTest(0);
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  return targets;
}

// Calls body(target name) with dispatch pinned to each target in turn, then
// restores the CPU's own choice.
template <typename Body>
void ForEachSimdTarget(const Body& body) {
  for (int64_t target : SimdTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    SCOPED_TRACE(std::string("SIMD target ") + hwy::TargetName(target));
    body(std::string(hwy::TargetName(target)));
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace normd::testing

#endif  // NORMD_TESTS_TESTING_SIMD_TARGETS_H_
