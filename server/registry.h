// The daemon's jobs by name, with the limits that bound them.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/job/job.h"
#include "server/memory_budget.h"

namespace paramd {

// Where a new job's gradient slots and served bytes come from (a transport's memory of the job's
// own), given its name and footprint; null: the heap.
using JobBufferSource =
    std::function<std::shared_ptr<BufferAllocator>(const std::string& job, const MemoryBytes&)>;

struct RegistryLimits {
  int max_jobs = 64;
  int max_tensors_per_job = 65536;
  int64_t max_job_bytes = 0;  // 0 = unlimited
  int64_t max_chunk_bytes = 4 << 20;
};

class JobRegistry {
 public:
  // Jobs take their slot and served buffers from `buffers` (none: the heap), and reserve every
  // byte they may hold from `budget` (none: unlimited).
  JobRegistry(Backend* backend, RegistryLimits limits, JobBufferSource buffers = {},
              MemoryBudget* budget = nullptr)
      : backend_(backend), limits_(limits), buffers_(std::move(buffers)), budget_(budget) {}

  // Validates the request, creates the job on its first registration (reserving its footprint,
  // server/job/job_memory.h), registers the rank. A job whose list names several daemons is
  // sharded: the job holds this daemon's part of it (DaemonPart, for `peers.self`), reserves that
  // part's footprint, and takes part in `peers.exchange`'s agreement.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request,
                                                const JobPeers& peers = {});
  // The job, or NOT_FOUND naming it.
  absl::StatusOr<std::shared_ptr<Job>> Find(const std::string& name) const;
  // Removes the job (NOT_FOUND when there is none) and fails it, so calls holding it end; its
  // memory goes with the last reference (a running step's or export's). Returns it.
  absl::StatusOr<std::shared_ptr<Job>> Delete(const std::string& name);
  std::vector<std::shared_ptr<Job>> Jobs() const;
  // Registered ranks over all jobs.
  int trainers() const;

  // Bytes a job of this description holds at most: state, served formats (current and retired
  // version) and gradient slots (collecting and running step).
  static int64_t JobBytes(const v1::RegisterRequest& spec);

 private:
  Backend* const backend_;
  const RegistryLimits limits_;
  const JobBufferSource buffers_;
  MemoryBudget* const budget_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramd
