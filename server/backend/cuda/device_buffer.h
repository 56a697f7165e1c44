// One device allocation of the cuda:N backend, freed with its owner.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace paramd::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Free();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { Free(); }
  void Free() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  absl::Status Allocate(size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state of a failed allocation
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of GPU memory (the GPU is full)"));
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace paramd::cuda
