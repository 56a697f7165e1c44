// ThreadPool::ParallelFor: every index exactly once, in blocks of `grain`, on any thread count,
// across many back-to-back loops and from nested calls.
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace paramd::kernels {
namespace {

// Runs one loop and checks coverage and block shapes.
void ExpectEachIndexOnce(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int> bad_blocks{0};
  const int64_t effective_grain = grain < 1 ? 1 : grain;
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    const bool aligned = begin % effective_grain == 0;
    const bool sized = end - begin == effective_grain || (end == n && end > begin);
    if (!aligned || !sized || end > n) bad_blocks.fetch_add(1);
    for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
  });
  EXPECT_EQ(bad_blocks.load(), 0) << "n=" << n << " grain=" << grain;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
        << "index " << i << " n=" << n << " grain=" << grain;
  }
}

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : std::vector<int64_t>{0, 1, 2, 63, 64, 65, 1000, 100003}) {
      for (int64_t grain :
           {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{64}, int64_t{4096}, kDefaultGrain}) {
        ExpectEachIndexOnce(pool, n, grain);
      }
    }
  }
}

TEST(ThreadPoolTest, SurvivesManyBackToBackLoops) {
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  for (int round = 0; round < 2000; ++round) {
    pool.ParallelFor(64, 4, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
  }
  EXPECT_EQ(total.load(), 2000 * 64);
}

TEST(ThreadPoolTest, UsesSeveralThreadsForManyBlocks) {
  ThreadPool pool(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  // Blocks that take a moment give the worker time to wake and take some.
  pool.ParallelFor(256, 1, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 2u);
}

TEST(ThreadPoolTest, RunsANestedLoopInline) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(100 * 10);
  pool.ParallelFor(100, 1, [&](int64_t outer, int64_t) {
    pool.ParallelFor(10, 1, [&](int64_t inner, int64_t) { hits[outer * 10 + inner].fetch_add(1); });
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, SerializesLoopsFromSeveralCallers) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 200; ++round) {
        pool.ParallelFor(1000, 10, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 3 * 200 * 1000);
}

}  // namespace
}  // namespace paramd::kernels
