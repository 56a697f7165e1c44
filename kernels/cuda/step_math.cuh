// Internal to kernels/cuda (device code only): the per-element sequence of the fused step, shared
// by the tile path and the flat path. Each function mirrors one stage of
// kernels/cpu/step_pipeline.h operation by operation, so the bits are the CPU's.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_vec.cuh"
#include "kernels/cuda/step_desc.h"
#include "kernels/fused_step.h"

namespace paramd::kernels::cuda_internal {

// Per-launch scalars of pass 1 (kernel parameter).
struct StepScalarsDev {
  float grad_scale, clip, beta1, beta2, c1, c2, eps, decay, neg_step_size, bc2;
  uint64_t seed;
  uint32_t k;
  int clip_active;
  // A step decided on the device (CudaStepScalars): the clip to read, and the gradient check's flag
  // (0: skipped, the kernels write nothing).
  const float* d_clip;
  const int* d_all_finite;
};

// The scalars a kernel runs with: `s`, with the clip of a step decided on the device read once.
// False when that step is skipped (the kernel then returns before writing anything).
__device__ __forceinline__ bool DecidedScalars(const StepScalarsDev& s, StepScalarsDev* out) {
  if (s.d_all_finite != nullptr && *s.d_all_finite == 0) return false;
  *out = s;
  if (s.d_clip != nullptr) {
    out->clip = *s.d_clip;
    out->clip_active = out->clip != 1.0f;
  }
  return true;
}

// The AdamW update of one element (DESIGN.md §3): g from gs, then m, v, p.
__device__ __forceinline__ void AdamwElement(const StepScalarsDev& s, float g0, float m, float v,
                                             float p_old, float* m_new, float* v_new,
                                             float* p_new) {
  float g = __fmul_rn(g0, s.grad_scale);
  if (s.clip_active) g = __fmul_rn(g, s.clip);
  const float mn = __fmaf_rn(s.beta1, m, __fmul_rn(s.c1, g));
  const float vn = __fmaf_rn(s.beta2, v, __fmul_rn(s.c2, __fmul_rn(g, g)));
  const float d = __fmaf_rn(__fsqrt_rn(vn), s.bc2, s.eps);
  float p = __fmul_rn(p_old, s.decay);
  p = __fmaf_rn(s.neg_step_size, __fdiv_rn(mn, d), p);
  *m_new = mn;
  *v_new = vn;
  *p_new = p;
}

// IEEE-rounded square root and division without a branch per element. The compiler's sqrt.rn /
// div.rn are a fast sequence plus a range check that branches to a slow path per element; those
// branches split the code into one basic block per element, so independent elements cannot
// overlap. Here the fast sequences are written out (the instructions ptxas emits for them:
// MUFU.RSQ / MUFU.RCP, then FMUL.FTZ / FFMA refinements) for operands inside a range where they are
// exact, and the caller checks the range once for all its elements and redoes the lot with
// __fsqrt_rn / __fdiv_rn when any falls outside (zeros, subnormals, extremes: rare in a step).
// tests/gpu/cuda_casts_test.cc compares the square root with __fsqrt_rn on all 2^32 inputs and the
// division with __fdiv_rn on 2^32 pairs.

// sqrt.rn's own fast range: positive normal v with biased exponent >= 26, finite.
__device__ __forceinline__ bool SqrtFastOk(float v) {
  return __float_as_uint(v) - 0x0D000000u <= 0x727FFFFFu;
}
__device__ __forceinline__ float SqrtFast(float v) {
  float r, y, h;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(y) : "f"(v), "f"(r));
  asm("mul.rn.ftz.f32 %0, %1, 0f3F000000;" : "=f"(h) : "f"(r));
  return __fmaf_rn(__fmaf_rn(-y, y, v), h, y);
}

// Both operands normal with biased exponents in [64, 190], i.e. magnitudes in [2^-63, 2^64): every
// intermediate of the sequence (1/d, n/d, the remainder) stays far from overflow and underflow.
// Float comparisons of the magnitudes (NaN compares false), which fold into the predicate chain.
__device__ __forceinline__ bool DivFastOk(float n, float d) {
  const float an = fabsf(n), ad = fabsf(d);
  return (an >= 0x1p-63f) & (an < 0x1p64f) & (ad >= 0x1p-63f) & (ad < 0x1p64f);
}
__device__ __forceinline__ float DivFast(float n, float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  const float r1 = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  const float q = __fmaf_rn(n, r1, 0.0f);
  return __fmaf_rn(r1, __fmaf_rn(-d, q, n), q);
}

// AdamwElement with the fast sequences; clears *ok when an operand left their range (the result
// is then to be discarded and recomputed with AdamwElement). The clip factor is applied always:
// it is 1 when clipping is off, and x * 1 == x for every x but NaN, whose inputs leave the range
// anyway — one multiply instead of a predicated load and multiply per element.
__device__ __forceinline__ void AdamwElementFast(const StepScalarsDev& s, float g0, float m,
                                                 float v, float p_old, float* m_new, float* v_new,
                                                 float* p_new, bool* ok) {
  const float g = __fmul_rn(__fmul_rn(g0, s.grad_scale), s.clip);
  const float mn = __fmaf_rn(s.beta1, m, __fmul_rn(s.c1, g));
  const float vn = __fmaf_rn(s.beta2, v, __fmul_rn(s.c2, __fmul_rn(g, g)));
  const float d = __fmaf_rn(SqrtFast(vn), s.bc2, s.eps);
  float p = __fmul_rn(p_old, s.decay);
  p = __fmaf_rn(s.neg_step_size, DivFast(mn, d), p);
  *ok = *ok & SqrtFastOk(vn) & DivFastOk(mn, d);
  *m_new = mn;
  *v_new = vn;
  *p_new = p;
}

// The stored master of one element and the value every served format is computed from (the FP32
// update itself; the FP16 value of an fp16 master). Writes the state codes through the pointers
// given (null: not this type).
struct StoredMaster {
  float served;
  uint32_t hi;   // bf16+remainder: served BF16 half; fp16: the code
  uint32_t low;  // bf16+remainder: remainder bits
};

__device__ __forceinline__ StoredMaster StoreMasterValue(uint8_t master_type, float p) {
  StoredMaster out{p, 0u, 0u};
  if (master_type == static_cast<uint8_t>(MasterType::kBf16Remainder)) {
    const uint32_t bits = __float_as_uint(p);
    const uint32_t lo = bits & 0xFFFFu;
    out.hi = ((bits >> 16) + (lo >> 15)) & 0xFFFFu;
    out.low = lo;
  } else if (master_type == static_cast<uint8_t>(MasterType::kFp16)) {
    out.hi = Fp16(p);
    out.served = DecodeFp16(out.hi);
  }
  return out;
}

// Reconstructs a bf16+remainder master: hi = served - (remainder < 0), bits = hi << 16 | rem.
__device__ __forceinline__ float MergeMaster(uint32_t served, uint32_t remainder) {
  const uint32_t hi = served - (remainder >> 15);
  return __uint_as_float((hi << 16) | (remainder & 0xFFFFu));
}

// The top of a chunk-scaled moment's power-of-two scale: 32768 for FP16, 448 for E4M3.
__device__ __forceinline__ float MomentTop(uint8_t type) {
  return type == static_cast<uint8_t>(MomentType::kFp16) ? 32768.0f : kE4m3Max;
}

// One moment value -> its code with the chunk's scale (1 for bf16), nearest or stochastic.
__device__ __forceinline__ uint32_t EncodeMoment(uint8_t type, float y, float scale,
                                                 bool stochastic, uint32_t r) {
  if (type == static_cast<uint8_t>(MomentType::kBf16)) {
    return stochastic ? EncodeStochastic<Bf16Format>(y, r) : Bf16(y);
  }
  const float x = __fmul_rn(y, scale);
  if (type == static_cast<uint8_t>(MomentType::kFp16)) {
    return stochastic ? EncodeStochastic<Fp16Format>(x, r) : Fp16(x);
  }
  return stochastic ? EncodeStochastic<E4m3Format>(x, r) : E4m3(x);
}

}  // namespace paramd::kernels::cuda_internal
