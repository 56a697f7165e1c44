// CUDA runtime errors as absl::Status, wrapped once where they happen with the call that failed.
// For the host files that talk to the CUDA runtime (the cuda:N backend, the cuda_ipc transport);
// kernels/ has its own small status (kernels/cuda/cuda_check.h).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace paramd {

inline absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorString(error)));
}

// Makes `device` the calling thread's current one, and the previous one again at the end of the
// scope (a thread's current device is its owner's business: a trainer's, say).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

}  // namespace paramd

// Returns the status of a failed CUDA runtime call from the enclosing function.
#define PARAMD_CUDA_RETURN_IF_ERROR(call)                                           \
  do {                                                                              \
    if (absl::Status _s = ::paramd::CudaStatus((call), #call); !_s.ok()) return _s; \
  } while (0)
