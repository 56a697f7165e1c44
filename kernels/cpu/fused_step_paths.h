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

// How far ahead of the current element the vector paths prefetch their input streams: 2 KiB of
// each FP32 stream. The hardware prefetchers alone keep too few lines in flight for these five
// streams while the divider and square-root unit are busy; on the development machine (2 cores,
// AVX-512) this moved the step from 0.93 to 0.99 of the bandwidth of the bare access pattern.
inline constexpr int64_t kPrefetchAhead = 512;

// Prefetches one cache line into all cache levels. An asm statement rather than
// __builtin_prefetch: GCC 12 at -O2 silently dropped every __builtin_prefetch of PrefetchInputs
// (whose per-slot loop contains nothing but prefetches); a volatile asm cannot be dropped.
inline void PrefetchLine(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

// Prefetches the lines element i of every input stream lies in. i must be inside the tensor.
inline void PrefetchInputs(const FusedStepArgs& a, int64_t i) {
  for (int r = 0; r < a.num_slots; ++r) {
    if (a.slot_type == SlotType::kFp32) {
      PrefetchLine(static_cast<const float*>(a.slots[r]) + i);
    } else {
      PrefetchLine(static_cast<const uint16_t*>(a.slots[r]) + i);
    }
  }
  PrefetchLine(a.master + i);
  PrefetchLine(a.exp_avg + i);
  PrefetchLine(a.exp_avg_sq + i);
}

// The step of one element, operation by operation as DESIGN.md §3 writes it. The vector paths
// perform the same IEEE operations in the same order, so they give the same bits. Always inlined:
// inside a vector path's tail std::fma then becomes that target's FMA instruction (elsewhere it is
// libm's fmaf, which is exactly rounded too).
[[gnu::always_inline]] inline void StepElement(const FusedStepArgs& a, int64_t i) {
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
