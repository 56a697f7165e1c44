// GPU memory trainers lend the cuda:N backend (cuda_ipc's lent gradients, InPlaceMark.lent): a
// gradient the step reads where backward left it, in the trainer's own allocation, instead of a
// copy in the daemon's slots. Each allocation is opened once by its IPC handle and stays open
// while a gradient slot refers to it (the slot sets of steps in flight hold their gradients);
// those no slot refers to any more are closed when another allocation is opened, so a trainer that
// frees and allocates memory does not pin its old allocations for long.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "paramd/v1/data.pb.h"

namespace paramd {

class LentMemory {
 public:
  // Maps on `device` (a cuda:N backend's).
  explicit LentMemory(int device) : device_(device) {}

  // The `bytes` at `lent`'s offset of the allocation it names, mapped on the device: readable
  // there while the result lives. INVALID_ARGUMENT where they do not lie inside that allocation;
  // FAILED_PRECONDITION where the handle cannot be opened here (another GPU's or node's memory).
  absl::StatusOr<std::shared_ptr<const void>> Map(const v1::LentMemory& lent, int64_t bytes);

  // The event `lent` names for its gradient's reads to wait for (LentMemory.ready_event), opened
  // once per handle and kept while this lives (a trainer records the same event for every push);
  // null where it names none. INVALID_ARGUMENT for a malformed handle, FAILED_PRECONDITION where
  // it cannot be opened here.
  absl::StatusOr<const void*> ReadyEvent(const v1::LentMemory& lent);

  // Allocations open now (a test counts them).
  size_t open() const;

  ~LentMemory();

 private:
  struct Opened;  // one allocation opened by IPC handle, closed when destroyed

  const int device_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Opened>> opened_ ABSL_GUARDED_BY(mu_);  // by IPC handle
  // cudaEvent_t by IPC event handle.
  std::map<std::string, void*> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramd
