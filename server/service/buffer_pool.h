// A process-wide pool of large, 64-byte aligned, uninitialized buffers for
// tensor payloads (gathered inputs, outputs handed to gRPC as slices).
//
// A 4 MiB buffer fresh from malloc is mmapped memory: every page faults and is
// zeroed by the kernel on first touch, which costs as much as the compute.
// Freed buffers are kept, up to a byte budget, in size classes (25% steps)
// and handed out again. Thread-safe; Release may be called from any thread
// (gRPC frees output slices on its own threads).
#ifndef NORMD_SERVER_SERVICE_BUFFER_POOL_H_
#define NORMD_SERVER_SERVICE_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "server/core/sync.h"

namespace normd {

class BufferPool {
 public:
  // Buffers smaller than this come from malloc directly.
  static constexpr size_t kMinPooledBytes = 256 << 10;
  static constexpr size_t kDefaultRetainedBytes = 64 << 20;

  static BufferPool& Global();

  // Caps the bytes kept for reuse (0: keep none); extra ones are freed.
  void SetMaxRetainedBytes(size_t bytes);

  // A buffer of at least `bytes` (64-byte aligned, contents undefined).
  // Throws std::bad_alloc when memory is exhausted.
  void* Acquire(size_t bytes);
  // Gives a buffer from Acquire back to the global pool. A plain function
  // pointer, so it can be a grpc::Slice destroy callback.
  static void Release(void* buffer);

  size_t retained_bytes() const;

 private:
  void Put(void* block, size_t capacity);

  mutable Mutex mu_;
  size_t max_retained_ ABSL_GUARDED_BY(mu_) = kDefaultRetainedBytes;
  size_t retained_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<size_t, std::vector<void*>> free_ ABSL_GUARDED_BY(mu_);
};

// Owns a buffer from BufferPool::Global().Acquire.
using PooledBuffer = std::unique_ptr<void, void (*)(void*)>;
PooledBuffer AcquirePooled(size_t bytes);

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_BUFFER_POOL_H_
