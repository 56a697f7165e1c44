// The daemon's checkpoints (Control.Checkpoint and Control.Restore, and the restore at start):
// a job's state exported into server/state/checkpoint.h's layout under DaemonConfig.checkpoint_dir,
// and read back into the job, registering it from the manifest where it does not exist. Plain C++:
// the Control service and main.cc call it.
#pragma once

#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "paramd/v1/control.pb.h"
#include "server/daemon.h"

namespace paramd {

class Checkpoints {
 public:
  // Uses the daemon's checkpoint_dir and keep_checkpoints.
  explicit Checkpoints(Daemon* daemon) : daemon_(daemon) {}

  // Writes a checkpoint of `job` (the state after every step all ranks committed before the
  // call; later steps wait while it is copied into a buffer of checkpoint_buffer_bytes, which
  // the disk then drains), then removes the job's checkpoints beyond
  // keep_checkpoints, oldest first.
  absl::StatusOr<v1::CheckpointResponse> Write(const std::string& job);
  // Restores `job` from the checkpoint in `path` (under checkpoint_dir/JOB), or from its newest
  // complete one when `path` is empty. Nothing changes unless the whole checkpoint reads back.
  absl::StatusOr<v1::RestoreResponse> Restore(const std::string& job, const std::string& path);
  // At start: every job under checkpoint_dir from its newest checkpoint that reads back whole (an
  // older one where the newest is damaged; each refusal is logged, naming the file). Returns the
  // jobs restored. OK with nothing to do (no checkpoint_dir, or an empty one).
  absl::StatusOr<int> RestoreAll();

 private:
  // checkpoint_dir, or FAILED_PRECONDITION saying how to set it.
  absl::StatusOr<std::string> Root() const;
  // Counted in the metrics (paramd_checkpoints_total, ...), as Write is; their work is in the
  // ...Now functions.
  absl::StatusOr<v1::RestoreResponse> RestoreFrom(const std::string& job, const std::string& dir);
  absl::StatusOr<v1::RestoreResponse> RestoreFromNow(const std::string& job,
                                                     const std::string& dir);
  absl::StatusOr<v1::CheckpointResponse> WriteNow(const std::string& job);
  // The bytes a checkpoint of `job` may run ahead of the disk (checkpoint_buffer_bytes, at most
  // the state's size), the part above the default reserved in `held`; the default where the
  // budget has no room.
  int64_t WriteBuffer(const std::string& job, int64_t state_bytes, MemoryBudget::Reservation* held);

  Daemon* const daemon_;
};

// Checkpoints written by themselves every checkpoint_every_steps steps of a job, on a thread of
// their own (one checkpoint at a time; a job already queued is not queued twice).
class CheckpointSchedule {
 public:
  explicit CheckpointSchedule(Daemon* daemon);
  // The checkpoint being written completes; queued ones are dropped.
  ~CheckpointSchedule();
  CheckpointSchedule(const CheckpointSchedule&) = delete;
  CheckpointSchedule& operator=(const CheckpointSchedule&) = delete;

  // A job ran a step and collects `next_step`: queues a checkpoint when it is a multiple of
  // checkpoint_every_steps.
  void StepRan(const std::string& job, int64_t next_step);

 private:
  void Run();

  Checkpoints checkpoints_;
  const int64_t every_;
  absl::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace paramd
