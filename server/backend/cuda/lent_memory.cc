#include "server/backend/cuda/lent_memory.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cuda_allocation.h"
#include "common/cuda_status.h"
#include "common/in_process_key.h"

namespace paramd {

struct LentMemory::Opened {
  Opened(int device, uint8_t* base, int64_t size) : device(device), base(base), size(size) {}
  ~Opened() {
    const DeviceScope scope(device);
    cudaIpcCloseMemHandle(base);
  }
  const int device;
  uint8_t* const base;
  const int64_t size;
};

namespace {

absl::Status OutsideAllocation(int64_t offset, int64_t bytes, int64_t size) {
  return absl::InvalidArgumentError(absl::StrCat("the lent gradient [", offset, ", +", bytes,
                                                 ") does not lie inside the lent allocation of ",
                                                 size, " bytes"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const void>> LentMemory::Map(const v1::LentMemory& lent,
                                                            int64_t bytes) {
  const DeviceScope scope(device_);
  if (!scope.status().ok()) return scope.status();
  if (IsInProcessKey(lent.in_process_key())) {
    // A trainer in this process (tests): its address is valid here as it is, and it holds the
    // memory itself, so the result owns nothing. Only the process's own key says so: a pid is
    // easily guessed, and another process's address must never be used here.
    const auto* p = reinterpret_cast<const uint8_t*>(lent.address());
    absl::StatusOr<CudaAllocation> allocation = CudaAllocationOf(p);
    if (!allocation.ok()) return allocation.status();
    const int64_t offset = p - allocation->base;
    if (bytes > allocation->size - offset) {
      return OutsideAllocation(offset, bytes, allocation->size);
    }
    return std::shared_ptr<const void>(std::shared_ptr<const void>(), p);
  }
  cudaIpcMemHandle_t handle;
  if (lent.ipc_handle().size() != sizeof(handle)) {
    return absl::InvalidArgumentError(absl::StrCat("a lent gradient's IPC handle has ",
                                                   lent.ipc_handle().size(), " bytes, not ",
                                                   sizeof(handle), " (a cudaIpcMemHandle_t)"));
  }
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Opened>& opened = opened_[lent.ipc_handle()];
  if (opened == nullptr) {
    // Allocations no slot refers to any more go first (their steps have run).
    for (auto it = opened_.begin(); it != opened_.end();) {
      it = it->second != nullptr && it->second.use_count() == 1 ? opened_.erase(it) : std::next(it);
    }
    std::memcpy(&handle, lent.ipc_handle().data(), sizeof(handle));
    void* base = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
        e != cudaSuccess) {
      cudaGetLastError();
      opened_.erase(lent.ipc_handle());
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot open the trainer's lent GPU memory on cuda:", device_,
          " (cudaIpcOpenMemHandle: ", cudaGetErrorString(e),
          "); only a trainer on the daemon's own GPU lends its gradients: push copies instead"));
    }
    absl::StatusOr<CudaAllocation> allocation = CudaAllocationOf(base);
    if (!allocation.ok()) {
      cudaIpcCloseMemHandle(base);
      opened_.erase(lent.ipc_handle());
      return allocation.status();
    }
    opened = std::make_shared<Opened>(device_, static_cast<uint8_t*>(base), allocation->size);
  }
  if (lent.offset() < 0 || bytes > opened->size - lent.offset()) {
    return OutsideAllocation(lent.offset(), bytes, opened->size);
  }
  return std::shared_ptr<const void>(opened, opened->base + lent.offset());
}

absl::StatusOr<const void*> LentMemory::ReadyEvent(const v1::LentMemory& lent) {
  if (IsInProcessKey(lent.in_process_key())) {
    // A trainer in this process (tests): the event itself (CUDA opens no process's own handles).
    return reinterpret_cast<const void*>(lent.ready_event_local());
  }
  if (lent.ready_event().empty()) return static_cast<const void*>(nullptr);
  cudaIpcEventHandle_t handle;
  if (lent.ready_event().size() != sizeof(handle)) {
    return absl::InvalidArgumentError(absl::StrCat("a lent gradient's ready event handle has ",
                                                   lent.ready_event().size(), " bytes, not ",
                                                   sizeof(handle), " (a cudaIpcEventHandle_t)"));
  }
  absl::MutexLock lock(&mu_);
  if (auto it = events_.find(lent.ready_event()); it != events_.end()) return it->second;
  const DeviceScope scope(device_);
  if (!scope.status().ok()) return scope.status();
  std::memcpy(&handle, lent.ready_event().data(), sizeof(handle));
  cudaEvent_t event = nullptr;
  if (cudaError_t e = cudaIpcOpenEventHandle(&event, handle); e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the trainer's ready event on cuda:", device_,
                     " (cudaIpcOpenEventHandle: ", cudaGetErrorString(e),
                     "); only a trainer on the daemon's own node orders its lent "
                     "gradients by an event"));
  }
  events_.emplace(lent.ready_event(), event);
  return static_cast<const void*>(event);
}

LentMemory::~LentMemory() {
  const DeviceScope scope(device_);
  for (auto& [handle, event] : events_) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

size_t LentMemory::open() const {
  absl::MutexLock lock(&mu_);
  return opened_.size();
}

}  // namespace paramd
