// The shm trainer end's copies between the trainer's GPU and the daemon's segments (DMA). With
// ClientOptions::cuda_device, each segment is page-locked for CUDA once, when it is mapped
// (cudaHostRegister), so the GPU's copy engines read and write it where it lies: a gradient in GPU
// memory goes device-to-host straight into its slot, on a stream of this end's that waits for the
// trainer's stream (ClientOptions::cuda_stream), and the served bytes a view leases can be copied
// host-to-device straight into a parameter. A segment of a daemon that restarted loses its
// registration when it is retired (its mapping stays while a view may point into it), and every
// registration ends with the transport: no page-locked memory outlives what it was for.
//
// Built with CUDA alone (gpu_copies_cuda.cc); elsewhere Make says why not and shm copies host
// memory only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace paramd {

class GpuCopies {
 public:
  // Page-locked memory: made pageable again when destroyed.
  class Registration {
   public:
    virtual ~Registration() = default;
  };

  // The copies of GPU `device` (the trainer's), ordered after the work queued on `stream` (a
  // cudaStream_t; 0: the legacy default stream). FAILED_PRECONDITION where this build or process
  // has no such GPU.
  static absl::StatusOr<std::unique_ptr<GpuCopies>> Make(int device, uintptr_t stream);
  // Bytes of this process's memory page-locked by registrations now (all transports together).
  static int64_t PageLockedBytes();

  virtual ~GpuCopies() = default;

  // Page-locks [data, data + bytes) until the registration goes.
  virtual absl::StatusOr<std::unique_ptr<Registration>> Register(void* data, size_t bytes) = 0;
  // Whether `p` is the trainer's GPU's memory (else host memory, copied by the caller).
  virtual bool IsGpuMemory(const void* p) const = 0;
  // Orders the copies queued from now on after the work queued on the trainer's stream so far
  // (backward writing the gradients), or where `ready_event` (a cudaEvent_t) is not 0 after the
  // work it was recorded after alone: a gradient's copy need not wait for the rest of backward.
  // Nothing here waits for the device.
  virtual absl::Status AfterCallersWork(uintptr_t ready_event) = 0;
  // Queues a copy of `bytes` bytes from GPU memory at `from` into page-locked host memory at `to`.
  virtual absl::Status QueueToHost(void* to, const void* from, size_t bytes) = 0;
  // Waits for every copy queued (whatever happened, so the caller may reuse its buffers).
  virtual absl::Status Wait() = 0;
  // Whether the host bytes at `host` equal the GPU bytes at `gpu` (only a retried push asks).
  virtual absl::StatusOr<bool> Holds(const void* host, const void* gpu, size_t bytes) = 0;
  // `items` with those in GPU memory copied down into `storage` (the inline path reads the host).
  virtual absl::Status ToHost(std::span<const PushItem> items, std::vector<PushItem>* host,
                              std::vector<std::vector<std::byte>>* storage) = 0;
};

}  // namespace paramd
