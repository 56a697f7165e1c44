// The CUDA allocation a device pointer lies in: its base, size and the driver's id for it (which
// a later allocation at the same address does not share). For lent gradients (cuda_ipc): the
// trainer names an allocation by its IPC handle, and the daemon checks that a lent range lies
// inside the allocation it opened. The driver's query is reached through the runtime's entry
// point, so nothing links libcuda (a machine without a GPU still loads the binaries).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace paramd {

struct CudaAllocation {
  uint8_t* base = nullptr;
  int64_t size = 0;
  uint64_t id = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID
  int device = -1;  // its device's ordinal
};

// The allocation holding `p` in the calling thread's current context; an error for memory CUDA
// did not allocate on a device (host memory, a stale pointer).
inline absl::StatusOr<CudaAllocation> CudaAllocationOf(const void* p) {
  using GetAttributes = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);
  static const GetAttributes get_attributes = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<GetAttributes>(fn);
  }();
  if (get_attributes == nullptr) {
    return absl::UnavailableError("the CUDA driver has no cuPointerGetAttributes");
  }
  CUpointer_attribute attributes[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
      CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID,
      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  unsigned int memory_type = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  unsigned long long id = 0;  // NOLINT(runtime/int): the driver's type
  int device = -1;
  void* values[] = {&memory_type, &start, &size, &id, &device};
  const CUresult result = get_attributes(5, attributes, values, reinterpret_cast<CUdeviceptr>(p));
  if (result != CUDA_SUCCESS || memory_type != CU_MEMORYTYPE_DEVICE || start == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("address 0x", absl::Hex(reinterpret_cast<uintptr_t>(p)),
                     " is not in a CUDA device allocation of this process (driver result ",
                     static_cast<int>(result), ")"));
  }
  return CudaAllocation{reinterpret_cast<uint8_t*>(start), static_cast<int64_t>(size),
                        static_cast<uint64_t>(id), device};
}

}  // namespace paramd
