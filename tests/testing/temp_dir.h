// Fresh temporary directories for tests, removed when the test program ends.
// Test-only; call from the test thread.
#ifndef NORMD_TESTS_TESTING_TEMP_DIR_H_
#define NORMD_TESTS_TESTING_TEMP_DIR_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace normd::testing {

// Removes the directories FreshTempDir made, at the end of the program.
class TempDirCleanup : public ::testing::Environment {
 public:
  static std::vector<std::string>& dirs() {
    static auto* dirs = new std::vector<std::string>;
    return *dirs;
  }
  void TearDown() override {
    for (const std::string& dir : dirs()) std::filesystem::remove_all(dir);
  }
};

// An empty directory "<tmp>/<prefix>_<pid>_<name>" (TEST_TMPDIR or the
// system's temp dir).
inline std::string FreshTempDir(const std::string& prefix,
                                const std::string& name) {
  static const bool registered = [] {
    ::testing::AddGlobalTestEnvironment(new TempDirCleanup);
    return true;
  }();
  (void)registered;
  const char* base = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir =
      std::filesystem::path(
          base != nullptr ? base : std::filesystem::temp_directory_path()) /
      (prefix + "_" + std::to_string(getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  TempDirCleanup::dirs().push_back(dir.string());
  return dir.string();
}

}  // namespace normd::testing

#endif  // NORMD_TESTS_TESTING_TEMP_DIR_H_
