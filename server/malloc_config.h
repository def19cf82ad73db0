// glibc malloc's process-wide settings for a server that receives, computes
// and sends multi-MiB tensors: how many arenas its threads share, and how
// much freed memory the heap keeps for the next request. Call once, before
// any thread starts; not thread-safe.
#ifndef NORMD_SERVER_MALLOC_CONFIG_H_
#define NORMD_SERVER_MALLOC_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"

namespace normd {

struct MallocConfig {
  // M_ARENA_MAX for the whole process; 0 keeps glibc's default (8 per
  // core). With one arena a large buffer freed by one thread is reused,
  // warm, by the next; with many, each thread's arena keeps its own freed
  // buffers resident.
  int arenas = 1;
  // Freed memory the heap keeps before it is returned to the kernel
  // (M_TRIM_THRESHOLD); with it, blocks up to kHeapBlockBytes come from the
  // heap rather than from their own mmap (M_MMAP_THRESHOLD). Without it
  // (0, glibc's default) the heap is trimmed as soon as a request's buffers
  // are freed, and the next request's pages fault and are zeroed again.
  int64_t keep_freed_bytes = 64 << 20;
};

// Blocks of up to this size come from the heap when keep_freed_bytes > 0
// (glibc's largest M_MMAP_THRESHOLD on 64-bit).
inline constexpr int64_t kHeapBlockBytes = 32 << 20;

// Applies `config`. INVALID_ARGUMENT naming --malloc_arenas or
// --malloc_keep_freed_bytes when negative; UNIMPLEMENTED when the process's
// malloc refuses a setting (a preloaded allocator). Nothing to do (OK)
// under ASan/TSan, whose allocators are not glibc's.
absl::Status ConfigureMalloc(const MallocConfig& config);

}  // namespace normd

#endif  // NORMD_SERVER_MALLOC_CONFIG_H_
