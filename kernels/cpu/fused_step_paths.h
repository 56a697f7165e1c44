// Internal to kernels/cpu: the code paths behind FusedStepCpu and the one-element form of the step
// that the scalar path runs and the vector paths use for their tails. Not part of the API.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cast.h"
#include "kernels/fused_step.h"

namespace paramd::kernels::cpu_internal {

// Each path runs [begin, end) of an already validated FusedStepArgs.
void FusedStepScalar(const FusedStepArgs& args, int64_t begin, int64_t end);
void FusedStepAvx2(const FusedStepArgs& args, int64_t begin, int64_t end);
void FusedStepAvx512(const FusedStepArgs& args, int64_t begin, int64_t end);

// g0 of element i: the rank-ordered FP32 sum ((s0 + s1) + s2) ... of the slots (DESIGN.md §2).
inline float SlotSum(const FusedStepArgs& a, int64_t i) {
  if (a.slot_type == SlotType::kFp32) {
    float g0 = static_cast<const float*>(a.slots[0])[i];
    for (int r = 1; r < a.num_slots; ++r) g0 = g0 + static_cast<const float*>(a.slots[r])[i];
    return g0;
  }
  float g0 = FloatFromBf16(static_cast<const uint16_t*>(a.slots[0])[i]);
  for (int r = 1; r < a.num_slots; ++r) {
    g0 = g0 + FloatFromBf16(static_cast<const uint16_t*>(a.slots[r])[i]);
  }
  return g0;
}

// The step of one element, operation by operation as DESIGN.md §3 writes it. The vector paths
// perform the same IEEE operations in the same order, so they give the same bits. Inlined into a
// vector path's tail, std::fma becomes that target's FMA instruction.
inline void StepElement(const FusedStepArgs& a, int64_t i) {
  const AdamwScalars& s = a.scalars;
  const float g = SlotSum(a, i) * a.grad_scale;
  const float m = std::fma(s.beta1, a.exp_avg[i], s.c1 * g);
  const float v = std::fma(s.beta2, a.exp_avg_sq[i], s.c2 * (g * g));
  const float d = std::fma(std::sqrt(v), s.bc2, s.eps);
  float p = a.master[i] * s.decay;
  p = std::fma(-s.step_size, m / d, p);
  a.exp_avg[i] = m;
  a.exp_avg_sq[i] = v;
  a.master[i] = p;
  if (a.out_fp32 != nullptr) a.out_fp32[i] = p;
  if (a.out_bf16 != nullptr) a.out_bf16[i] = Bf16FromFloat(p);
}

}  // namespace paramd::kernels::cpu_internal
