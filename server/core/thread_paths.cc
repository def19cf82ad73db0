#include "server/core/thread_paths.h"

#include <array>
#include <atomic>

namespace normd {
namespace {

std::array<std::atomic<int64_t>, static_cast<size_t>(ThreadPath::kCount)>
    counts{};

}  // namespace

void CountThreadPath(ThreadPath path) {
  counts[static_cast<size_t>(path)].fetch_add(1, std::memory_order_relaxed);
}

int64_t ThreadPathCount(ThreadPath path) {
  return counts[static_cast<size_t>(path)].load(std::memory_order_relaxed);
}

}  // namespace normd
