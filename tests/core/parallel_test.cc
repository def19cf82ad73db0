// The compute arena's threads: real threads at any count (on 2 cores too),
// for loops started on the calling thread and for work handed over with
// EnqueueCompute, and loops kept whole under a SerialLoopsScope.
#include "server/core/parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace normd {
namespace {

constexpr int kThreadCounts[] = {1, 2, 3, 8};

// Waits until `count` reaches `want`, or 30 s have passed.
void AwaitCount(const std::atomic<int>& count, int want) {
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (count.load() < want && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// The threads of a loop of `threads` pieces, each waiting until every piece
// has started: there are that many only if that many threads run at once.
std::vector<std::thread::id> ThreadsOfAWaitingLoop(int threads) {
  std::atomic<int> started{0};
  std::mutex mutex;
  std::vector<std::thread::id> ids;
  ParallelFor(tbb::blocked_range<int64_t>(0, threads, 1), int64_t{1} << 30,
              [&](const tbb::blocked_range<int64_t>& r) {
                for (int64_t i = r.begin(); i < r.end(); ++i) {
                  started.fetch_add(1);
                  {
                    std::lock_guard<std::mutex> lock(mutex);
                    ids.push_back(std::this_thread::get_id());
                  }
                  AwaitCount(started, threads);
                }
              });
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

TEST(ParallelTest, ScopedComputeThreadsRunsThatManyThreadsAtOnce) {
  for (int threads : {2, 3, 8, 16}) {
    const ScopedComputeThreads scope(threads);
    EXPECT_EQ(ComputeConcurrency(), threads);
    EXPECT_EQ(ThreadsOfAWaitingLoop(threads).size(),
              static_cast<size_t>(threads))
        << "distinct threads of a loop in an arena of " << threads;
  }
}

// What the server does with a large request: it hands it to the arena,
// where only TBB's workers run it. `threads` requests run at once, and a
// loop inside one request runs on `threads` threads.
TEST(ParallelTest, EnqueuedWorkRunsOnEveryThreadOfTheArena) {
  for (int threads : kThreadCounts) {
    const ScopedComputeThreads scope(threads);
    std::atomic<int> started{0};
    std::atomic<int> finished{0};
    for (int i = 0; i < threads; ++i) {
      EnqueueCompute([&] {
        started.fetch_add(1);
        AwaitCount(started, threads);
        finished.fetch_add(1);
      });
    }
    AwaitCount(finished, threads);
    EXPECT_EQ(started.load(), threads)
        << threads << " enqueued tasks did not run at once";

    std::atomic<size_t> loop_threads{0};
    std::atomic<int> done{0};
    EnqueueCompute([&] {
      loop_threads = ThreadsOfAWaitingLoop(threads).size();
      done = 1;
    });
    AwaitCount(done, 1);
    EXPECT_EQ(loop_threads.load(), static_cast<size_t>(threads))
        << "distinct threads of a loop in an enqueued task, arena of "
        << threads;
  }
}

TEST(ParallelTest, SerialLoopsScopeRunsLoopsWholeOnTheCallingThread) {
  const tbb::blocked_range<int64_t> range(0, 1 << 20, 1024);
  struct Call {
    int64_t begin, end;
    std::thread::id thread;
  };
  auto calls_of = [&] {
    std::vector<Call> calls;
    std::mutex mutex;
    ParallelFor(range, range.size(), [&](const tbb::blocked_range<int64_t>& r) {
      std::lock_guard<std::mutex> lock(mutex);
      calls.push_back({r.begin(), r.end(), std::this_thread::get_id()});
    });
    return calls;
  };
  EXPECT_FALSE(SerialLoopsScope::Active());
  {
    const SerialLoopsScope serial;
    EXPECT_TRUE(SerialLoopsScope::Active());
    {
      const SerialLoopsScope inactive(false);  // Nested: stays serial.
      EXPECT_TRUE(SerialLoopsScope::Active());
    }
    const std::vector<Call> calls = calls_of();
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].begin, 0);
    EXPECT_EQ(calls[0].end, 1 << 20);
    EXPECT_EQ(calls[0].thread, std::this_thread::get_id());
  }
  EXPECT_FALSE(SerialLoopsScope::Active());
  {
    const SerialLoopsScope inactive(false);
    EXPECT_FALSE(SerialLoopsScope::Active());
  }
  // Without a scope the loop is split (into many pieces, whatever the
  // number of threads), covering the range once.
  std::vector<Call> calls = calls_of();
  EXPECT_GT(calls.size(), 1u);
  int64_t covered = 0;
  for (const Call& c : calls) covered += c.end - c.begin;
  EXPECT_EQ(covered, 1 << 20);
}

}  // namespace
}  // namespace normd
