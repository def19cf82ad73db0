// Runs a test body once per SIMD target that is both compiled into normd's
// core (Highway's HWY_TARGETS) and run by this CPU, with Highway's dispatch
// pinned to that target; only the one NORMD_SIMD_TARGET names when it is
// set (test_main.cc applies it). Test-only; not thread-safe (it changes the
// process-wide dispatch).
#ifndef NORMD_TESTS_TESTING_SIMD_TARGETS_H_
#define NORMD_TESTS_TESTING_SIMD_TARGETS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "hwy/targets.h"
#include "server/core/simd/target.h"

namespace normd::testing {

// Pins Highway's dispatch to the targets in `mask` (0: the CPU's own
// choice again) and makes the next dispatched call see it.
inline void PinSimdTargets(int64_t mask) {
  hwy::SetSupportedTargetsForTest(mask);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

// The targets ForEachSimdTarget visits, best first. Unpins dispatch.
inline std::vector<int64_t> SimdTargets() {
  PinSimdTargets(0);
  return hwy::SupportedAndGeneratedTargets();
}

// Calls body(normd's name of the target) with dispatch pinned to each
// target in turn, then restores the CPU's own choice. Fails the test if
// pinning did not change what runs.
template <typename Body>
void ForEachSimdTarget(const Body& body) {
  std::vector<std::string> visited;
  for (int64_t target : SimdTargets()) {
    PinSimdTargets(target);
    const std::string name = ActiveSimdTarget();
    SCOPED_TRACE("SIMD target " + name);
    for (const std::string& seen : visited) {
      EXPECT_NE(seen, name) << "dispatch did not switch";
    }
    visited.push_back(name);
    body(name);
  }
  PinSimdTargets(0);
}

}  // namespace normd::testing

#endif  // NORMD_TESTS_TESTING_SIMD_TARGETS_H_
