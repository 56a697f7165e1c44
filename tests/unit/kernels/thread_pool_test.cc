// ThreadPool::ParallelFor: every index exactly once, in blocks of `grain`, on any thread count,
// across many back-to-back loops and from nested calls.
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
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

// The CPUs this thread may run on.
std::set<int> ThisThreadsCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::set<int> cpus;
  if (pthread_getaffinity_np(pthread_self(), sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.insert(cpu);
  }
  return cpus;
}

// With CPUs given, every thread that runs a block runs on them: the workers and the caller.
TEST(ThreadPoolTest, PlacedThreadsRunOnTheGivenCpusAlone) {
  const std::set<int> allowed = ThisThreadsCpus();
  ASSERT_FALSE(allowed.empty());
  const int cpu = *allowed.rbegin();  // one this process may run on
  std::mutex mu;
  std::map<std::thread::id, std::set<int>> seen;
  std::set<int> caller_after;
  // A thread of its own calls the loop, so that this test's thread keeps its placement.
  std::thread caller([&] {
    ThreadPool pool(3, {cpu});
    EXPECT_EQ(pool.cpus(), std::vector<int>{cpu});
    pool.ParallelFor(64, 1, [&](int64_t, int64_t) {
      const std::set<int> cpus = ThisThreadsCpus();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // every thread takes blocks
      std::lock_guard<std::mutex> lock(mu);
      seen[std::this_thread::get_id()] = cpus;
    });
    caller_after = ThisThreadsCpus();
  });
  caller.join();
  EXPECT_GE(seen.size(), 2u) << "the workers took no block";
  for (const auto& [thread, cpus] : seen) EXPECT_EQ(cpus, std::set<int>{cpu});
  EXPECT_EQ(caller_after, std::set<int>{cpu});
  EXPECT_EQ(ThisThreadsCpus(), allowed) << "this test's own thread was placed";
}

// Without CPUs, a pool leaves its threads where the scheduler puts them.
TEST(ThreadPoolTest, UnplacedThreadsKeepTheProcesssCpus) {
  const std::set<int> allowed = ThisThreadsCpus();
  std::mutex mu;
  std::vector<std::set<int>> seen;
  ThreadPool pool(3);
  EXPECT_TRUE(pool.cpus().empty());
  pool.ParallelFor(32, 1, [&](int64_t, int64_t) {
    const std::set<int> cpus = ThisThreadsCpus();
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(cpus);
  });
  for (const std::set<int>& cpus : seen) EXPECT_EQ(cpus, allowed);
}

}  // namespace
}  // namespace paramd::kernels
