// A small pool of persistent worker threads for data-parallel loops over a tensor's elements. The
// daemon's cpu backend and the CPU benchmark split each tensor into cache-sized blocks with it.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace paramd::kernels {

// A reasonable block for streaming kernels: 64 Ki elements (256 KiB per FP32 array).
inline constexpr int64_t kDefaultGrain = int64_t{64} << 10;

class ThreadPool {
 public:
  // Runs loops on `num_threads` threads in all: the calling thread plus num_threads - 1 workers,
  // started here and kept until destruction. num_threads < 1 is taken as 1 (no workers). With
  // `cpus` (CPU numbers as the kernel numbers them), every thread that runs a loop is placed on
  // that set: the workers when they start, a calling thread at its first loop (the scheduler
  // chooses within the set). The caller checks that this process may run on them
  // (common/config.h's StepCpus); a set the kernel refuses leaves a thread where it was.
  explicit ThreadPool(int num_threads, std::vector<int> cpus = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }
  const std::vector<int>& cpus() const { return cpus_; }

  // Calls fn(begin, end) for consecutive blocks [begin, end) that cover [0, n) exactly once; every
  // block is `grain` long except possibly the last (grain < 1 is taken as 1). Blocks are handed out
  // in increasing order to whichever thread is free; returns when all have run. A loop that fits
  // in one block runs on the calling thread without waking a worker. Calls from several threads
  // are serialized; a call from inside fn runs serially on the calling thread. fn must not throw.
  template <typename Fn>
  void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
    Dispatch(n, grain, fn, /*place_caller=*/true);
  }
  // ParallelFor from a thread that only borrows the pool now and then (a server's request thread):
  // the same loop, but the calling thread is not placed on the pool's CPUs.
  template <typename Fn>
  void ParallelForAsGuest(int64_t n, int64_t grain, Fn&& fn) {
    Dispatch(n, grain, fn, /*place_caller=*/false);
  }

 private:
  using BlockFn = void (*)(void* ctx, int64_t begin, int64_t end);

  template <typename Fn>
  void Dispatch(int64_t n, int64_t grain, Fn& fn, bool place_caller) {
    using F = std::remove_reference_t<Fn>;
    Run(
        n, grain,
        [](void* ctx, int64_t begin, int64_t end) { (*static_cast<F*>(ctx))(begin, end); },
        const_cast<void*>(static_cast<const void*>(&fn)), place_caller);
  }
  void Run(int64_t n, int64_t grain, BlockFn fn, void* ctx, bool place_caller);
  void WorkerLoop(uint32_t seen_generation);
  void RunBlocks();              // takes blocks of the current loop until none is left
  void PlaceThisThread() const;  // on cpus_, where set

  const std::vector<int> cpus_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one loop at a time

  // The current loop; written by Run before `generation_` is bumped (release), read by workers
  // after they observe the new generation (acquire).
  BlockFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  int64_t num_blocks_ = 0;
  std::atomic<int64_t> next_block_{0};

  std::atomic<uint32_t> generation_{0};    // bumped once per loop, and once to stop
  std::atomic<uint32_t> busy_workers_{0};  // workers that have not finished the current loop
  bool stop_ = false;                      // written before the final generation bump
};

}  // namespace paramd::kernels
