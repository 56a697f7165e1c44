// The served versions of a job's tensors (DESIGN.md §2): each tensor's newest published version,
// the buffers of every version kept (at most kServedVersions, server/job/job_memory.h: the newest,
// and retired ones that a later version reuses once no reader leases them), and the pulls waiting
// for a version. A reader's lease is a reference to the version's ServedTensor, so a version is
// free once the only reference left is this one. It keeps the versions; the Job allocates their
// buffers. No lock of its own: the Job calls it under the job's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/backend/backend.h"

namespace paramd {

class ServedVersions {
 public:
  explicit ServedVersions(size_t tensors);

  // The newest published version of `tensor`, or null before it has one.
  const std::shared_ptr<const ServedTensor>& newest(int tensor) const {
    return tensors_[static_cast<size_t>(tensor)].newest;
  }
  // The version every tensor has published (-1 while one has none).
  int64_t published() const;
  // Bytes of every version kept.
  int64_t bytes() const;

  using Make = std::function<absl::StatusOr<std::shared_ptr<ServedTensor>>()>;
  // Buffers for `tensor`'s next version: a retired version's once no reader holds it, else new
  // ones from `make` while the tensor keeps fewer than kServedVersions; null when every version
  // kept is leased (the caller waits, or refuses).
  absl::StatusOr<std::shared_ptr<ServedTensor>> Fresh(int tensor, const Make& make);
  // True when no reader holds one of the versions `tensor` keeps (a step waiting in Fresh may go
  // on).
  bool AnyFree(int tensor) const;
  // Publishes `served` as `tensor`'s newest version (the one before it retires, and is reused once
  // its readers let go) and hands the wake of every pull waiting for it to `wake`.
  void Publish(int tensor, std::shared_ptr<const ServedTensor> served,
               std::vector<std::function<void()>>* wake);

  // Keeps `wake` until `tensor` reaches `min_version`; 0 (not kept) when it has already, or once
  // StopWaiting was called.
  uint64_t AddWaiter(int tensor, int64_t min_version, std::function<void()> wake);
  // True when the waiter was removed before it fired.
  bool RemoveWaiter(uint64_t id);
  // Removes every waiter, handing its wake to `wake`.
  void TakeAllWaiters(std::vector<std::function<void()>>* wake);
  // Removes every waiter as TakeAllWaiters does, and keeps no new one.
  void StopWaiting(std::vector<std::function<void()>>* wake);

 private:
  struct Waiter {
    int64_t min_version;
    std::function<void()> wake;
  };
  struct Tensor {
    std::shared_ptr<const ServedTensor> newest;
    // Every version's buffers: the newest and the retired ones.
    std::vector<std::shared_ptr<ServedTensor>> versions;
    // The pulls waiting for a newer version, by id: a publish looks at its own tensor's only (a
    // pull of a model's tensors waits on each of them).
    std::map<uint64_t, Waiter> waiters;
  };

  std::vector<Tensor> tensors_;
  std::map<uint64_t, int> waiting_;  // every waiter's id -> its tensor
  uint64_t next_waiter_ = 1;
  bool stop_waiting_ = false;
};

}  // namespace paramd
