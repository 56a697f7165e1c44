// A kernel that writes through a pointer no allocation owns: an illegal-address fault, which the
// CUDA context keeps (a sticky error) for the rest of the process. cuda_daemon_test uses it to
// break the daemon's backend for real.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tests/gpu/sticky_fault.h"

namespace paramd::testing {
namespace {

__global__ void WriteThrough(int* d_nowhere) { *d_nowhere = 1; }

}  // namespace

cudaError_t LaunchIllegalAddressFault() {
  WriteThrough<<<1, 1>>>(reinterpret_cast<int*>(std::uintptr_t{0x10}));
  return cudaDeviceSynchronize();
}

}  // namespace paramd::testing
