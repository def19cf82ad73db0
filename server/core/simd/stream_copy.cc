// StreamCopy on Highway: one implementation compiled for every SIMD target
// (foreach_target.h) and chosen at run time by HWY_DYNAMIC_DISPATCH.
#include "server/core/simd/stream_copy.h"

#include <atomic>
#include <cstdint>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/stream_copy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Copies `bytes` from `src` to `dst`: the bytes before dst's first 64-byte
// line boundary and after its last one with memcpy, the whole lines between
// with streaming stores of at most 64 bytes each (so that every store is
// aligned to its own size, whatever the target's vector length), then a
// fence.
void StreamCopyBytes(char* HWY_RESTRICT dst, const char* HWY_RESTRICT src,
                     size_t bytes) {
  const hn::CappedTag<uint8_t, 64> d;
  const size_t lanes = hn::Lanes(d);
  const size_t misalignment = reinterpret_cast<uintptr_t>(dst) & 63;
  size_t head = misalignment == 0 ? 0 : 64 - misalignment;
  if (head > bytes) head = bytes;
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    for (size_t j = 0; j < 64; j += lanes) {
      hn::Stream(hn::LoadU(d, reinterpret_cast<const uint8_t*>(src + i + j)), d,
                 reinterpret_cast<uint8_t*>(dst + i + j));
    }
  }
  std::memcpy(dst + i, src + i, bytes - i);
  hwy::FlushStream();
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {
namespace {

std::atomic<int64_t> streaming_output_bytes{kDefaultStreamingOutputBytes};

HWY_EXPORT(StreamCopyBytes);

}  // namespace

int64_t StreamingOutputBytes() {
  return streaming_output_bytes.load(std::memory_order_relaxed);
}

void SetStreamingOutputBytes(int64_t bytes) {
  streaming_output_bytes.store(bytes, std::memory_order_relaxed);
}

void StreamFence() { hwy::FlushStream(); }

void StreamCopy(void* dst, const void* src, size_t bytes) {
  HWY_DYNAMIC_DISPATCH(StreamCopyBytes)
  (static_cast<char*>(dst), static_cast<const char*>(src), bytes);
}

}  // namespace normd
#endif  // HWY_ONCE
