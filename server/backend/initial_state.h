// A tensor's state at version 0, the same for every backend: the stored master of the initial
// weights in the tensor's policy, and every served format computed from it (on the CPU: the
// kernels give the same bits as the GPU's, and version 0 is computed once per tensor).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/thread_pool.h"
#include "server/backend/backend.h"

namespace paramd {

struct InitialState {
  AlignedVector<uint8_t> master;     // FP32, FP16 codes, or the served BF16 halves
  AlignedVector<int16_t> remainder;  // bf16+remainder only
  float fp8_tensor_scale = 1.0f;     // fp8_tensor's scale of version 0 (the next step's previous)
  float delayed_scale = 1.0f;        // fp8_delayed's (empty history: 1)
};

// Fills `state` and every format of `out` (sized by the job) from the initial FP32 weights; a row
// range of a split tensor takes its fp8_tensor scale from the whole tensor's amax (`whole_amax`).
absl::Status MakeInitialState(const TensorInfo& info, std::span<const float> initial,
                              kernels::ThreadPool& pool, InitialState* state, ServedTensor* out,
                              const WholeAmax& whole_amax = nullptr);

// Fills every format of `out` but FP32 rowwise from `fp32` (the stored master's values; `out`'s
// own FP32 bytes where it serves FP32), casting fp8_tensor and fp8_delayed with the given scales;
// a bf16+remainder master passes its BF16 halves, which it serves as they are. 128-row panels
// spread over `pool`.
absl::Status ServeFromFp32(const TensorInfo& info, const float* fp32, const uint16_t* bf16_halves,
                           float fp8_tensor_scale, float fp8_delayed_scale,
                           kernels::ThreadPool& pool, ServedTensor* out);

// Where a tensor's FP32 values are written for its other formats: `out`'s FP32 bytes where it
// serves FP32, else an FP32 master (`fp32_master`, null for a 16-bit one), else `working`, sized
// here (RESOURCE_EXHAUSTED where the heap has no room).
absl::StatusOr<float*> Fp32Values(const TensorInfo& info, ServedTensor* out, float* fp32_master,
                                  std::vector<float>* working);

// The fp8_tensor scale a job starts with (as MakeInitialState sets it) for a stored master: from
// the amax of the values it stores.
float InitialFp8TensorScale(const TensorInfo& info, const HostTensorState& state);

// The served bytes of an imported state: every format of `out` from its master (the values it
// stores) with its per-tensor scales, the same bytes the version it was exported at served.
absl::Status ServeImportedMaster(const TensorInfo& info, const HostTensorState& state,
                                 kernels::ThreadPool& pool, ServedTensor* out);

}  // namespace paramd
