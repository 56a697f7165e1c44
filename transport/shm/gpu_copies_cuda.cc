// GpuCopies on CUDA: page-locking by cudaHostRegister, copies on a non-blocking stream of the
// trainer's GPU that waits for the trainer's stream through an event.
#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "transport/gpu_items.h"
#include "transport/shm/gpu_copies.h"

namespace paramd {
namespace {

std::atomic<int64_t> page_locked_bytes{0};

class CudaRegistration final : public GpuCopies::Registration {
 public:
  CudaRegistration(void* data, size_t bytes) : data_(data), bytes_(bytes) {
    page_locked_bytes += static_cast<int64_t>(bytes_);
  }
  ~CudaRegistration() override {
    // Makes the pages pageable again (CUDA waits for copies still reading them).
    cudaHostUnregister(data_);
    cudaGetLastError();
    page_locked_bytes -= static_cast<int64_t>(bytes_);
  }

 private:
  void* const data_;
  const size_t bytes_;
};

class CudaGpuCopies final : public GpuCopies {
 public:
  CudaGpuCopies(int device, cudaStream_t callers, cudaStream_t stream, cudaEvent_t callers_work,
                cudaEvent_t copied)
      : device_(device),
        callers_(callers),
        stream_(stream),
        callers_work_(callers_work),
        copied_(copied) {}
  ~CudaGpuCopies() override {
    const DeviceScope scope(device_);
    cudaEventDestroy(copied_);
    cudaEventDestroy(callers_work_);
    cudaStreamDestroy(stream_);
  }

  absl::StatusOr<std::unique_ptr<Registration>> Register(void* data, size_t bytes) override {
    if (bytes == 0) return std::make_unique<Registration>();
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    // Portable: page-locked for every context of this process, whichever device copies.
    PARAMD_CUDA_RETURN_IF_ERROR(cudaHostRegister(data, bytes, cudaHostRegisterPortable));
    return std::make_unique<CudaRegistration>(data, bytes);
  }

  bool IsGpuMemory(const void* p) const override { return paramd::IsGpuMemory(p); }

  absl::Status AfterCallersWork(uintptr_t ready_event) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    if (ready_event != 0) {
      return CudaStatus(cudaStreamWaitEvent(stream_, reinterpret_cast<cudaEvent_t>(ready_event), 0),
                        "cudaStreamWaitEvent(the gradients' ready event)");
    }
    std::lock_guard<std::mutex> lock(mu_);
    PARAMD_CUDA_RETURN_IF_ERROR(cudaEventRecord(callers_work_, callers_));
    return CudaStatus(cudaStreamWaitEvent(stream_, callers_work_, 0),
                      "cudaStreamWaitEvent(the trainer's stream)");
  }

  absl::Status QueueToHost(void* to, const void* from, size_t bytes) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    return CudaStatus(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, stream_),
                      "cudaMemcpyAsync(slot)");
  }

  // Sleeps until the copies are done rather than spin (a blocking-sync event): the push thread
  // waits through most of backward, on the cores the daemon's step threads share with it.
  absl::Status Wait() override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    std::lock_guard<std::mutex> lock(copied_mu_);
    PARAMD_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_, stream_));
    return CudaStatus(cudaEventSynchronize(copied_), "cudaEventSynchronize(the copies)");
  }

  absl::StatusOr<bool> Holds(const void* host, const void* gpu, size_t bytes) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    return SameBytes(host, gpu, bytes, stream_);
  }

  absl::Status ToHost(std::span<const PushItem> items, std::vector<PushItem>* host,
                      std::vector<std::vector<std::byte>>* storage) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    return GpuItemsToHost(
        items, stream_, [this] { return AfterCallersWork(0); }, host, storage);
  }

 private:
  const int device_;
  const cudaStream_t callers_;  // the trainer's stream (not ours)
  const cudaStream_t stream_;
  const cudaEvent_t callers_work_;
  const cudaEvent_t copied_;  // blocking-sync: Wait sleeps on it
  std::mutex mu_;             // the event, recorded and waited for by one push at a time
  std::mutex copied_mu_;      // copied_, recorded and waited for by one Wait at a time
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuCopies>> GpuCopies::Make(int device, uintptr_t stream) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || device >= count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cuda_device ", device, " is not visible to this process (",
                     e == cudaSuccess ? absl::StrCat(count, " GPUs") : cudaGetErrorString(e), ")"));
  }
  const DeviceScope scope(device);
  if (!scope.status().ok()) return scope.status();
  cudaStream_t copies = nullptr;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking));
  cudaEvent_t event = nullptr;
  if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming); e != cudaSuccess) {
    cudaStreamDestroy(copies);
    return CudaStatus(e, "cudaEventCreateWithFlags");
  }
  cudaEvent_t copied = nullptr;
  if (cudaError_t e =
          cudaEventCreateWithFlags(&copied, cudaEventDisableTiming | cudaEventBlockingSync);
      e != cudaSuccess) {
    cudaEventDestroy(event);
    cudaStreamDestroy(copies);
    return CudaStatus(e, "cudaEventCreateWithFlags(blocking)");
  }
  return std::make_unique<CudaGpuCopies>(device, reinterpret_cast<cudaStream_t>(stream), copies,
                                         event, copied);
}

int64_t GpuCopies::PageLockedBytes() { return page_locked_bytes.load(); }

}  // namespace paramd
