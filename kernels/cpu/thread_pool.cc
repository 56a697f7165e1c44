#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace paramd::kernels {
namespace {

// Spins this many polls before sleeping on the atomic: back-to-back loops (one per tensor of a
// step) then dispatch without a system call.
constexpr int kSpinPolls = 4000;

// The pool whose loop this thread is running, so a nested ParallelFor runs inline instead of
// deadlocking on run_mutex_.
thread_local const ThreadPool* tls_running_pool = nullptr;

template <typename T>
void SpinThenWait(const std::atomic<T>& a, T old) {
  for (int i = 0; i < kSpinPolls; ++i) {
    if (a.load(std::memory_order_acquire) != old) return;
  }
  while (a.load(std::memory_order_acquire) == old) a.wait(old, std::memory_order_acquire);
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const int workers = std::max(num_threads, 1) - 1;
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(run_mutex_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Run(int64_t n, int64_t grain, BlockFn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t num_blocks = (n - 1) / grain + 1;
  if (num_blocks == 1 || workers_.empty() || tls_running_pool == this) {
    for (int64_t b = 0; b < n; b += grain) fn(ctx, b, std::min(n, b + grain));
    return;
  }
  std::lock_guard<std::mutex> lock(run_mutex_);
  const ThreadPool* const outer = tls_running_pool;
  tls_running_pool = this;
  fn_ = fn;
  ctx_ = ctx;
  n_ = n;
  grain_ = grain;
  num_blocks_ = num_blocks;
  next_block_.store(0, std::memory_order_relaxed);
  busy_workers_.store(static_cast<uint32_t>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  RunBlocks();
  // Workers may still be inside fn for their last block; the loop is done when all report.
  for (uint32_t busy = busy_workers_.load(std::memory_order_acquire); busy != 0;
       busy = busy_workers_.load(std::memory_order_acquire)) {
    SpinThenWait(busy_workers_, busy);
  }
  tls_running_pool = outer;
}

void ThreadPool::RunBlocks() {
  for (;;) {
    const int64_t b = next_block_.fetch_add(1, std::memory_order_relaxed);
    if (b >= num_blocks_) return;
    const int64_t begin = b * grain_;
    fn_(ctx_, begin, std::min(n_, begin + grain_));
  }
}

void ThreadPool::WorkerLoop() {
  tls_running_pool = this;
  uint32_t seen = generation_.load(std::memory_order_acquire);
  for (;;) {
    SpinThenWait(generation_, seen);
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    RunBlocks();
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_workers_.notify_one();
  }
}

}  // namespace paramd::kernels
