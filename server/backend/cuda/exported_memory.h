// The GPU memory a cuda:N backend exports to trainers on its node (DESIGN.md §6), each job's in
// allocations of its own: a trainer opens an allocation's IPC handle once however many buffers it
// holds, and a job's trainers are told of the job's allocations alone
// (ExportedMemoryAbility::Exports), so one job's trainers cannot map another job's gradients or
// weights.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/device_bytes.h"

namespace paramd {

class DeviceArena;

class ExportedMemories {
 public:
  explicit ExportedMemories(int device);
  ~ExportedMemories();
  ExportedMemories(const ExportedMemories&) = delete;
  ExportedMemories& operator=(const ExportedMemories&) = delete;

  // Job `job`'s exported memory, for the job to keep: once it lets the handle go and no buffer of
  // it is held, its allocations are freed. A later job of the same name gets memory of its own.
  std::shared_ptr<ExportedMemory> For(const std::string& job);
  // Adds the IPC handles, addresses and sizes of job `job`'s allocations to `exports`, by
  // Place::region (none for "" or a job that has none).
  void Describe(const std::string& job, DeviceExports* exports) const;

 private:
  struct Arena {
    std::string job;
    bool released = false;  // the job has let its handle go
    std::unique_ptr<DeviceArena> arena;
  };
  // Frees the arenas of jobs that have gone once no buffer of theirs is held.
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int device_;
  mutable absl::Mutex mu_;
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Arena> arenas_ ABSL_GUARDED_BY(mu_);
  // The newest arena of each job name.
  std::map<std::string, uint64_t> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramd
