// The fused optimizer step: rank slots -> gradient -> AdamW -> new master and moments -> served
// formats, in one pass over memory (DESIGN.md §2-§3). One header for every backend; `cpu/`
// implements it here, `cuda/` on the GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/status.h"

namespace paramd::kernels {

enum class SlotType { kFp32, kBf16 };

// AdamW hyper-parameters as the job holds them (doubles).
struct AdamwHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Per-step scalars, computed once on the host in double and rounded once to FP32 (DESIGN.md §3).
struct AdamwScalars {
  float beta1;
  float beta2;
  float c1;  // 1 - beta1
  float c2;  // 1 - beta2
  float eps;
  float decay;      // 1 - lr * weight_decay
  float step_size;  // lr / (1 - beta1^k)
  float bc2;        // 1 / sqrt(1 - beta2^k)
};

// `k` is the count of applied steps including this one (>= 1). beta^k is std::pow(beta, k) in
// double; every formula is evaluated in double and rounded once to FP32.
AdamwScalars MakeAdamwScalars(const AdamwHyper& hyper, int64_t k);

// One tensor's step over the element range [begin, end). Pointers address the whole tensor.
struct FusedStepArgs {
  const void* const* slots = nullptr;  // num_slots gradient buffers, rank order
  int num_slots = 0;
  SlotType slot_type = SlotType::kFp32;
  float grad_scale = 1.0f;  // rounded once to FP32 on the host
  AdamwScalars scalars{};
  float* master = nullptr;       // fp32 master, updated in place
  float* exp_avg = nullptr;      // fp32, updated in place
  float* exp_avg_sq = nullptr;   // fp32, updated in place
  float* out_fp32 = nullptr;     // optional: served fp32 copy of the new master
  uint16_t* out_bf16 = nullptr;  // optional: served bf16 (round to nearest even, saturating)
};

// Which code path a CPU kernel takes. kAuto picks the widest the CPU supports.
enum class CpuPath { kAuto, kScalar, kAvx2, kAvx512 };

// Runs the step on elements [begin, end) of the tensor, per element exactly the sequence of
// DESIGN.md §2-§3: g0 = ((s0 + s1) + s2) ... over the slots in FP32 (BF16 slots widened first),
// g = g0 * grad_scale, then the AdamW update, then the served copies. Every path gives identical
// bits, equal to paramd::reference's. No alignment is required; outputs must not overlap inputs.
// Disjoint ranges of one tensor may run concurrently on several threads (ThreadPool::ParallelFor
// in kernels/cpu/thread_pool.h). On ranges of 4096 elements or more the vector paths write the
// served outputs with non-temporal stores and fence them before returning. Returns
// kInvalidArgument for a bad range or missing buffers (nothing is written), kUnimplemented for a
// path this CPU cannot run.
KStatus FusedStepCpu(const FusedStepArgs& args, int64_t begin, int64_t end,
                     CpuPath path = CpuPath::kAuto);

// The path kAuto resolves to on this CPU, and whether a path can run here.
CpuPath BestCpuPath();
bool CpuPathSupported(CpuPath path);
const char* CpuPathName(CpuPath path);

}  // namespace paramd::kernels
