#include "server/malloc_config.h"

#include <malloc.h>

#include <limits>

#include "absl/strings/str_cat.h"

namespace normd {

absl::Status ConfigureMalloc(const MallocConfig& config) {
  if (config.arenas < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--malloc_arenas must be >= 0, is ", config.arenas));
  }
  if (config.keep_freed_bytes < 0 ||
      config.keep_freed_bytes > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--malloc_keep_freed_bytes must be in [0, ",
        std::numeric_limits<int>::max(), "], is ", config.keep_freed_bytes));
  }
#ifdef NORMD_SANITIZED_BUILD  // CMakeLists.txt, for GCC's and clang's.
  // The sanitizers bring their own allocator, without glibc's settings.
  return absl::OkStatus();
#endif
  if (config.arenas > 0 && mallopt(M_ARENA_MAX, config.arenas) != 1) {
    return absl::UnimplementedError(
        "--malloc_arenas: this process's malloc ignores M_ARENA_MAX (a "
        "preloaded allocator?); left as it is");
  }
  if (config.keep_freed_bytes > 0 &&
      (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapBlockBytes)) != 1 ||
       mallopt(M_TRIM_THRESHOLD, static_cast<int>(config.keep_freed_bytes)) !=
           1)) {
    return absl::UnimplementedError(
        "--malloc_keep_freed_bytes: this process's malloc ignores "
        "M_MMAP_THRESHOLD / M_TRIM_THRESHOLD (a preloaded allocator?); left "
        "as it is");
  }
  return absl::OkStatus();
}

}  // namespace normd
