// Internal to kernels/cuda (host side): CUDA errors wrapped once, where they happen, with the call
// and its place, into the status kernels/ returns.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "kernels/status.h"

namespace paramd::kernels::cuda_internal {

inline KStatus CudaError(const char* call, cudaError_t err, const char* file, int line) {
  return KStatus(Code::kInternal, std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
                                      cudaGetErrorString(err) + ") at " + file + ":" +
                                      std::to_string(line));
}

}  // namespace paramd::kernels::cuda_internal

#define PARAMD_CUDA_RETURN_IF_ERROR(call)                                                   \
  do {                                                                                      \
    const cudaError_t paramd_cuda_err_ = (call);                                            \
    if (paramd_cuda_err_ != cudaSuccess) {                                                  \
      return ::paramd::kernels::cuda_internal::CudaError(#call, paramd_cuda_err_, __FILE__, \
                                                         __LINE__);                         \
    }                                                                                       \
  } while (0)
