// See sticky_fault.cu.
#pragma once

#include <cuda_runtime_api.h>

namespace paramd::testing {

// Launches the faulting kernel on the legacy stream and waits: returns the fault's error.
cudaError_t LaunchIllegalAddressFault();

}  // namespace paramd::testing
