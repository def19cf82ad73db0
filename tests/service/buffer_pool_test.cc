// --buffer_pool_bytes (BufferPool::SetMaxRetainedBytes): freed buffers are
// kept for reuse up to the budget and handed out again (the same memory,
// 64-byte aligned, big enough); 0 keeps none; lowering the budget frees what
// is past it; buffers below kMinPooledBytes are never kept.
#include "server/service/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace normd {
namespace {

constexpr size_t kMiB = 1 << 20;

TEST(BufferPoolTest, KeepsFreedBuffersWithinTheBudgetAndReusesThem) {
  BufferPool& pool = BufferPool::Global();
  pool.SetMaxRetainedBytes(0);
  pool.SetMaxRetainedBytes(16 * kMiB);
  void* first = pool.Acquire(4 * kMiB);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
  BufferPool::Release(first);
  const size_t kept = pool.retained_bytes();
  EXPECT_GE(kept, 4 * kMiB);
  EXPECT_LE(kept, 16 * kMiB);
  // The same size class again: the kept buffer, and nothing kept now.
  void* again = pool.Acquire(4 * kMiB);
  EXPECT_EQ(again, first);
  EXPECT_EQ(pool.retained_bytes(), 0u);
  BufferPool::Release(again);
  // Lowering the budget frees what is past it.
  pool.SetMaxRetainedBytes(kMiB);
  EXPECT_EQ(pool.retained_bytes(), 0u);
  pool.SetMaxRetainedBytes(BufferPool::kDefaultRetainedBytes);
}

TEST(BufferPoolTest, ABudgetOfZeroKeepsNone) {
  BufferPool& pool = BufferPool::Global();
  pool.SetMaxRetainedBytes(0);
  for (size_t bytes : {size_t{1} << 18, 4 * kMiB, 16 * kMiB}) {
    void* buffer = pool.Acquire(bytes);
    ASSERT_NE(buffer, nullptr);
    BufferPool::Release(buffer);
    EXPECT_EQ(pool.retained_bytes(), 0u) << bytes;
  }
  pool.SetMaxRetainedBytes(BufferPool::kDefaultRetainedBytes);
}

TEST(BufferPoolTest, SmallBuffersAreNeverKept) {
  BufferPool& pool = BufferPool::Global();
  pool.SetMaxRetainedBytes(0);
  pool.SetMaxRetainedBytes(16 * kMiB);
  void* small = pool.Acquire(BufferPool::kMinPooledBytes / 2);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  BufferPool::Release(small);
  EXPECT_EQ(pool.retained_bytes(), 0u);
  pool.SetMaxRetainedBytes(BufferPool::kDefaultRetainedBytes);
}

}  // namespace
}  // namespace normd
