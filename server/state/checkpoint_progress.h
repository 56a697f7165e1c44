// The checkpoints being written or restored, per job: what JobStatus.checkpoint_progress reports
// and paramctl draws as a progress bar. The writer or reader holds a Tracked for as long as it
// runs and updates the bytes it has done after each chunk; Status reads the job's entry meanwhile.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "paramd/v1/control.pb.h"

namespace paramd {

class CheckpointProgress {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // `now` tells the time (tests give their own); the steady clock by default.
  explicit CheckpointProgress(Clock now = std::chrono::steady_clock::now) : now_(std::move(now)) {}
  CheckpointProgress(const CheckpointProgress&) = delete;
  CheckpointProgress& operator=(const CheckpointProgress&) = delete;

  // One operation under way; its entry goes with it.
  class Tracked {
   public:
    Tracked(Tracked&& other) noexcept;
    Tracked& operator=(Tracked&&) = delete;
    ~Tracked();
    // `bytes_done` bytes are done so far (bytes_done stops at bytes_total).
    void Update(int64_t bytes_done);

   private:
    friend class CheckpointProgress;
    Tracked(CheckpointProgress* owner, uint64_t id) : owner_(owner), id_(id) {}
    CheckpointProgress* owner_;
    uint64_t id_;
  };

  // Starts tracking `operation` on `job`, `bytes_total` bytes in all (negative counts as 0).
  Tracked Begin(const std::string& job, v1::CheckpointOperation operation, int64_t bytes_total);
  // The operation on `job` that began first of those under way, if any.
  std::optional<v1::CheckpointProgress> Of(const std::string& job) const;

 private:
  struct Entry {
    std::string job;
    v1::CheckpointOperation operation;
    int64_t done = 0;
    int64_t total = 0;
    std::chrono::steady_clock::time_point start;
  };

  const Clock now_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);  // in the order they began
};

}  // namespace paramd
