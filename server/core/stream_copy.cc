#include "server/core/stream_copy.h"

#include <atomic>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define NORMD_HAVE_X86_STREAMING 1
#endif

namespace normd {
namespace {

std::atomic<int64_t> streaming_output_bytes{kDefaultStreamingOutputBytes};

#if NORMD_HAVE_X86_STREAMING
// Bytes until `p` is 64-byte aligned (at most `limit`).
size_t HeadBytes(const void* p, size_t limit) {
  const size_t misalignment = reinterpret_cast<uintptr_t>(p) & 63;
  const size_t head = misalignment == 0 ? 0 : 64 - misalignment;
  return head < limit ? head : limit;
}

__attribute__((target("avx512f"))) void StreamCopyAvx512(char* dst,
                                                         const char* src,
                                                         size_t bytes) {
  const size_t head = HeadBytes(dst, bytes);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i),
                        _mm512_loadu_si512(src + i));
  }
  std::memcpy(dst + i, src + i, bytes - i);
  _mm_sfence();
}

__attribute__((target("avx2"))) void StreamCopyAvx2(char* dst, const char* src,
                                                    size_t bytes) {
  const size_t head = HeadBytes(dst, bytes);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m256i* s = reinterpret_cast<const __m256i*>(src + i);
    __m256i* d = reinterpret_cast<__m256i*>(dst + i);
    _mm256_stream_si256(d, _mm256_loadu_si256(s));
    _mm256_stream_si256(d + 1, _mm256_loadu_si256(s + 1));
  }
  std::memcpy(dst + i, src + i, bytes - i);
  _mm_sfence();
}

using CopyFn = void (*)(char*, const char*, size_t);

CopyFn SelectCopy() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return StreamCopyAvx512;
  if (__builtin_cpu_supports("avx2")) return StreamCopyAvx2;
  return [](char* dst, const char* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
  };
}
#endif

}  // namespace

int64_t StreamingOutputBytes() {
  return streaming_output_bytes.load(std::memory_order_relaxed);
}

void SetStreamingOutputBytes(int64_t bytes) {
  streaming_output_bytes.store(bytes, std::memory_order_relaxed);
}

void StreamCopy(void* dst, const void* src, size_t bytes) {
#if NORMD_HAVE_X86_STREAMING
  static const CopyFn copy = SelectCopy();
  copy(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace normd
