// paramd::reference — the independent scalar model of DESIGN.md §2-§3 that tests and the example
// trainer compare the kernels against: the FP32 AdamW sequence written out plainly, its own BF16
// cast, the rank-ordered slot sum, and a float64 AdamW for accuracy bars.
//
// Independence is the point: this library must NOT link or include kernels/ (nor kernels/ this
// library), so a mistake in one cannot hide in both. It is compiled with paramd_numerics
// (-ffp-contract=off): the only fused multiply-adds are the explicit std::fma calls.
#pragma once

#include <cstddef>
#include <cstdint>

namespace paramd::reference {

// AdamW hyper-parameters, as the job holds them (doubles).
struct Hyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// FP32 -> BF16 code: round to nearest, ties to even; overflow and infinities saturate to the
// largest finite value of the same sign (0x7F7F / 0xFF7F); any NaN -> 0x7FFF; subnormals kept.
uint16_t Bf16FromFloat(float x);
// BF16 code -> FP32 (exact).
float FloatFromBf16(uint16_t code);

// g0 of element i: the FP32 sum of the slots in rank order, ((s0 + s1) + s2) + ...; BF16 slots are
// converted to FP32 first. num_slots >= 1. The gradient the step takes is then g0 * grad_scale
// (one FP32 multiply, grad_scale already rounded to FP32).
float SumSlotsFp32(const float* const* slots, int num_slots, size_t i);
float SumSlotsBf16(const uint16_t* const* slots, int num_slots, size_t i);

// One AdamW step of the fp32 policy on n elements, in place. `gs` is the scaled gradient
// (g0 * grad_scale); k is the count of applied steps including this one (>= 1). Per-step scalars
// are computed in double and rounded once to FP32; per element:
//   m = fma(beta1, m, c1 * g); v = fma(beta2, v, c2 * (g * g)); d = fma(sqrt(v), bc2, eps);
//   p = p * decay; p = fma(-step_size, m / d, p).
void AdamwStepFp32(const Hyper& hyper, int64_t k, const float* gs, float* p, float* m, float* v,
                   size_t n);

// The same AdamW in float64 throughout (decoupled weight decay, bias-corrected moments):
//   p = p * (1 - lr * wd); m = beta1 * m + (1 - beta1) * g; v = beta2 * v + (1 - beta2) * g^2;
//   p = p - lr / (1 - beta1^k) * m / (sqrt(v) / sqrt(1 - beta2^k) + eps).
void AdamwStepF64(const Hyper& hyper, int64_t k, const double* g, double* p, double* m, double* v,
                  size_t n);

}  // namespace paramd::reference
