#include "server/core/simd/streaming.h"

#include <atomic>
#include <cstdint>

#include "hwy/cache_control.h"

namespace normd {
namespace {

std::atomic<int64_t> streaming_output_bytes{kDefaultStreamingOutputBytes};

}  // namespace

int64_t StreamingOutputBytes() {
  return streaming_output_bytes.load(std::memory_order_relaxed);
}

void SetStreamingOutputBytes(int64_t bytes) {
  streaming_output_bytes.store(bytes, std::memory_order_relaxed);
}

void StreamFence() { hwy::FlushStream(); }

}  // namespace normd
