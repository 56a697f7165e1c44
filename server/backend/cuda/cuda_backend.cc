// The cuda:N backend's device: its streams and events, its health after a failed call, its free
// memory, the GPU memory it exports to the node's trainers and the memory they lend it; and the
// backend's factory (cuda_backend.h tells where the rest lives).
#include "server/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/backend/backends.h"

namespace paramd::cuda {

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  if (step_done_ != nullptr) cudaEventDestroy(step_done_);
  for (cudaEvent_t e : kernel_timing_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

absl::Status CudaBackend::Init() {
  std::string why;
  if (!kernels::CudaDeviceAvailable(&why)) {
    return absl::FailedPreconditionError(
        absl::StrCat("backend cuda:", device_, " is not available: ", why));
  }
  int count = 0;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device_ >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend cuda:", device_, " is not available: this machine has ", count, " GPU(s)"));
  }
  PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  PARAMD_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&step_done_, cudaEventDisableTiming | cudaEventInterprocess));
  cudaIpcEventHandle_t handle;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaIpcGetEventHandle(&handle, step_done_));
  for (cudaEvent_t& e : kernel_timing_) PARAMD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  step_event_.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  cudaDeviceProp prop;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
  uuid_.assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
  exported_ = std::make_unique<ExportedMemories>(device_);
  PARAMD_LOG(INFO) << "backend cuda:" << device_ << ": " << prop.name << ", "
                   << prop.totalGlobalMem / (1 << 30) << " GiB";
  return absl::OkStatus();
}

std::string CudaBackend::name() const { return absl::StrCat("cuda:", device_); }

DeviceExports CudaBackend::Exports(const std::string& job) const {
  DeviceExports exports;
  exports.device = device_;
  exports.uuid = uuid_;
  exported_->Describe(job, &exports);
  exports.step_event = step_event_;
  exports.step_event_local = reinterpret_cast<uint64_t>(step_done_);
  return exports;
}

std::shared_ptr<ExportedMemory> CudaBackend::ExportedMemoryFor(const std::string& job) {
  return exported_->For(job);
}

absl::StatusOr<std::shared_ptr<const void>> CudaBackend::MapLent(const v1::LentMemory& lent,
                                                                 int64_t bytes) {
  return lent_.Map(lent, bytes);
}

absl::StatusOr<const void*> CudaBackend::LentReadyEvent(const v1::LentMemory& lent) {
  return lent_.ReadyEvent(lent);
}

absl::StatusOr<int64_t> CudaBackend::FreeDeviceMemory() {
  const DeviceScope scope(device_);
  PARAMD_RETURN_IF_ERROR(scope.status());
  size_t free = 0, total = 0;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

absl::Status CudaBackend::Health() {
  absl::MutexLock lock(&health_mu_);
  return unusable_;
}

// After a failed call: an error the context keeps (an illegal address, a kernel fault) is
// returned by every later synchronization, and then nothing on this GPU can run in this
// process again. An allocation that failed leaves the context usable.
void CudaBackend::NoticeFailure(const absl::Status& failed) {
  if (cudaDeviceSynchronize() == cudaSuccess) return;
  cudaGetLastError();
  const cudaError_t sticky = cudaDeviceSynchronize();
  if (sticky == cudaSuccess) return;
  absl::MutexLock lock(&health_mu_);
  if (!unusable_.ok()) return;
  unusable_ = absl::InternalError(absl::StrCat(
      "backend cuda:", device_, " is unusable: its CUDA context failed (",
      cudaGetErrorString(sticky), ", after ", failed.message(),
      "), which no call in this process can clear; every job of it failed. Restart the "
      "daemon and restore the jobs from their exports or checkpoints"));
}

}  // namespace paramd::cuda

namespace paramd {

absl::StatusOr<int> CudaDeviceCount() {
  std::string why;
  if (!kernels::CudaDeviceAvailable(&why)) return absl::FailedPreconditionError(why);
  int count = 0;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device,
                                                         const v1::DaemonConfig& config) {
  auto backend = std::make_unique<cuda::CudaBackend>(device, config.step_threads());
  if (absl::Status s = backend->Init(); !s.ok()) return s;
  return backend;
}

}  // namespace paramd
