// Internal to kernels/cuda (host side): the launch of the serve kernel (serve.cu), shared by
// FusedStepCuda's pass 2 and ServeQuantizeCuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/step_desc.h"
#include "kernels/status.h"

namespace paramd::kernels::cuda_internal {

// One launch over `num_tiles` 128 x 128 tiles of the outputs d_descs[0, n) (device arrays).
// With `d_all_finite`, it writes nothing where that flag is 0 (a step decided on the device and
// skipped).
KStatus LaunchServe(const ServeDesc* d_descs, const int64_t* d_starts, int n, int64_t num_tiles,
                    cudaStream_t stream, const int* d_all_finite = nullptr);

}  // namespace paramd::kernels::cuda_internal
