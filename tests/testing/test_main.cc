// main() of normd's GoogleTest programs: applies NORMD_SIMD_TARGET as normd
// does at start-up (a bad value fails the whole program, naming the
// variable), then runs the tests.
#include <gtest/gtest.h>

#include <cstdio>

#include "server/core/simd/target.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (absl::Status restricted = normd::RestrictSimdTargetFromEnvironment();
      !restricted.ok()) {
    std::fprintf(stderr, "%s\n", std::string(restricted.message()).c_str());
    return 2;
  }
  return RUN_ALL_TESTS();
}
