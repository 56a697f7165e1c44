// What the GPU transports' trainer ends (cuda_ipc, nccl) share: finding the daemon's GPU by UUID,
// telling GPU memory from host memory, and copying the items in GPU memory down for the inline
// path (initial weights, and anything the daemon could not place). CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda_status.h"
#include "transport/transport.h"

namespace paramd {

// The local ordinal of the GPU with this UUID, or -1.
inline absl::StatusOr<int> DeviceWithUuid(const std::string& uuid) {
  int count = 0;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, d));
    if (uuid.size() == sizeof(prop.uuid.bytes) &&
        std::memcmp(uuid.data(), prop.uuid.bytes, uuid.size()) == 0) {
      return d;
    }
  }
  return -1;
}

// Whether `p` is GPU memory (device or managed; of `device` where it is given); host memory,
// registered or not, is not.
inline bool IsGpuMemory(const void* p, int device = -1) {
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const bool gpu =
      attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  return gpu && (device < 0 || attributes.device == device);
}

// Whether the `bytes` bytes at `a` and at `b` (host or GPU memory alike) are equal, both copied
// down on `stream` (of the current device). Only a retried push asks.
inline absl::StatusOr<bool> SameBytes(const void* a, const void* b, size_t bytes,
                                      cudaStream_t stream) {
  std::vector<std::byte> first(bytes), second(bytes);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(first.data(), a, bytes, cudaMemcpyDefault, stream));
  PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(second.data(), b, bytes, cudaMemcpyDefault, stream));
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return first == second;
}

// `items` with those in GPU memory copied down into `storage` on `stream` (of the current device),
// after `before` (which orders the copies after the caller's work writing them), once.
inline absl::Status GpuItemsToHost(std::span<const PushItem> items, cudaStream_t stream,
                                   const std::function<absl::Status()>& before,
                                   std::vector<PushItem>* host,
                                   std::vector<std::vector<std::byte>>* storage) {
  host->assign(items.begin(), items.end());
  storage->reserve(items.size());
  bool waited = false;
  for (PushItem& item : *host) {
    if (item.data.empty() || !IsGpuMemory(item.data.data())) continue;
    if (!waited) {  // the bytes may still be being written on the trainer's stream
      if (absl::Status s = before(); !s.ok()) return s;
      waited = true;
    }
    std::vector<std::byte>& copy = storage->emplace_back(item.data.size());
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(copy.data(), item.data.data(), copy.size(), cudaMemcpyDefault, stream));
    item.data = copy;
  }
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace paramd
