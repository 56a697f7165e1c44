// Leases on served bytes read in place (DESIGN.md §2): while a lease lasts, the version's buffers
// stay alive and unchanged (the step writes other buffers). A lease ends when its holder releases
// it or its deadline passes; a trainer that dies holding one thus frees it without help. A thread
// of the table's own ends expired leases.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/backend/backend.h"

namespace paramd {

class LeaseTable {
 public:
  using Clock = std::chrono::system_clock;

  // At most `max_leases` held at once.
  explicit LeaseTable(int64_t max_leases = int64_t{1} << 24);
  ~LeaseTable();

  // Holds `served` until `expires` or Release; returns the lease's id (never 0), or
  // RESOURCE_EXHAUSTED when max_leases are held.
  absl::StatusOr<uint64_t> Take(const std::string& job, std::shared_ptr<const ServedTensor> served,
                                Clock::time_point expires);
  // Ends the leases among `ids` that are held, of jobs `may(job)` allows where it is given; returns
  // how many.
  int Release(std::span<const uint64_t> ids,
              const std::function<bool(const std::string&)>& may = nullptr);
  // Ends every lease on a job's bytes (the job was deleted); returns how many.
  int ReleaseJob(const std::string& job);
  // Leases held over all jobs.
  int64_t held() const;
  // Leases held on a job's bytes.
  int64_t Held(const std::string& job) const;
  // Leases that ended by expiry so far.
  int64_t expired() const;

 private:
  struct Lease {
    std::string job;
    std::shared_ptr<const ServedTensor> served;
    Clock::time_point expires;
  };
  void Reap();

  const int64_t max_leases_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t expired_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace paramd
