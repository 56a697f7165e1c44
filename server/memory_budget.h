// What the daemon may hold for its jobs, in host memory and (cuda:N) GPU memory. A job reserves
// every byte it may ever use when it is first registered (server/job/job_memory.h counts them); the
// reservation returns when the job is deleted. A Register that does not fit is refused with
// RESOURCE_EXHAUSTED, so no later request can make the daemon allocate past its budget.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace paramd {

// Bytes by where they lie.
struct MemoryBytes {
  int64_t host = 0;
  int64_t device = 0;
};

class MemoryBudget {
 public:
  // `limit.device` 0: the backend keeps nothing in GPU memory.
  explicit MemoryBudget(MemoryBytes limit) : limit_(limit) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Bytes held by one job; given back when destroyed.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept { *this = std::move(other); }
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();
    const MemoryBytes& bytes() const { return bytes_; }

   private:
    friend class MemoryBudget;
    MemoryBudget* budget_ = nullptr;
    MemoryBytes bytes_;
  };

  // Reserves `bytes` for job `job`, or RESOURCE_EXHAUSTED naming the budget, the bytes asked and
  // the bytes left (nothing is reserved then).
  absl::StatusOr<Reservation> Reserve(const std::string& job, MemoryBytes bytes);

  MemoryBytes limit() const { return limit_; }
  MemoryBytes used() const;

 private:
  void Give(const MemoryBytes& bytes);

  const MemoryBytes limit_;
  mutable absl::Mutex mu_;
  MemoryBytes used_ ABSL_GUARDED_BY(mu_);
};

// Host memory this process may still take: MemAvailable of /proc/meminfo, or its cgroup's limit
// less the cgroup's usage where that is lower (cgroup v2 memory.max, or v1 memory.limit_in_bytes).
// UNAVAILABLE where /proc/meminfo cannot be read.
absl::StatusOr<int64_t> HostMemoryAvailable();

// The share of the memory free at start a default budget takes; the rest stays for what no
// formula counts (gRPC's message buffers, thread stacks, the allocator's own pages).
inline constexpr double kDefaultBudgetShare = 0.9;

// The host budget of DaemonConfig.memory_budget_bytes = `configured`: itself, or where it is 0
// kDefaultBudgetShare of HostMemoryAvailable().
absl::StatusOr<int64_t> HostBudget(int64_t configured);

}  // namespace paramd
