#include "server/service/buffer_pool.h"

#include <bit>
#include <cstdlib>
#include <new>

namespace normd {
namespace {

// Every buffer starts one alignment unit after its block; the unit before the
// buffer records the block's capacity (or 0 for a plain malloc'd block).
constexpr size_t kAlign = 64;

size_t& CapacityOf(void* buffer) {
  return *reinterpret_cast<size_t*>(static_cast<char*>(buffer) - kAlign);
}

// Rounds up to a size class: four classes per power of two.
size_t SizeClass(size_t bytes) {
  const size_t power = std::bit_floor(bytes);
  const size_t step = std::max<size_t>(power / 4, kAlign);
  return (bytes + step - 1) / step * step;
}

void* NewBlock(size_t capacity) {
  // aligned_alloc wants a size that is a multiple of the alignment (glibc
  // does not insist; ASan and the C standard do).
  const size_t size = (kAlign + capacity + kAlign - 1) / kAlign * kAlign;
  void* block = std::aligned_alloc(kAlign, size);
  if (block == nullptr) throw std::bad_alloc();
  return block;
}

}  // namespace

BufferPool& BufferPool::Global() {
  // Never destroyed: gRPC may release slices while the process exits.
  static BufferPool* pool = new BufferPool();
  return *pool;
}

void BufferPool::SetMaxRetainedBytes(size_t bytes) {
  MutexLock lock(&mu_);
  max_retained_ = bytes;
  for (auto& [capacity, blocks] : free_) {
    while (retained_ > max_retained_ && !blocks.empty()) {
      std::free(blocks.back());
      blocks.pop_back();
      retained_ -= capacity;
    }
  }
}

void* BufferPool::Acquire(size_t bytes) {
  size_t capacity = 0;
  void* block = nullptr;
  if (bytes >= kMinPooledBytes) {
    capacity = SizeClass(bytes);
    MutexLock lock(&mu_);
    auto it = free_.find(capacity);
    if (it != free_.end() && !it->second.empty()) {
      block = it->second.back();
      it->second.pop_back();
      retained_ -= capacity;
    }
  }
  if (block == nullptr) block = NewBlock(capacity == 0 ? bytes : capacity);
  void* buffer = static_cast<char*>(block) + kAlign;
  CapacityOf(buffer) = capacity;
  return buffer;
}

void BufferPool::Release(void* buffer) {
  if (buffer == nullptr) return;
  const size_t capacity = CapacityOf(buffer);
  void* block = static_cast<char*>(buffer) - kAlign;
  if (capacity == 0) {
    std::free(block);
    return;
  }
  Global().Put(block, capacity);
}

void BufferPool::Put(void* block, size_t capacity) {
  {
    MutexLock lock(&mu_);
    if (retained_ + capacity <= max_retained_) {
      free_[capacity].push_back(block);
      retained_ += capacity;
      return;
    }
  }
  std::free(block);
}

size_t BufferPool::retained_bytes() const {
  MutexLock lock(&mu_);
  return retained_;
}

PooledBuffer AcquirePooled(size_t bytes) {
  return PooledBuffer(BufferPool::Global().Acquire(bytes),
                      &BufferPool::Release);
}

}  // namespace normd
