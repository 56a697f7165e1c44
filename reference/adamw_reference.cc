#include "reference/adamw_reference.h"

#include <cmath>
#include <cstring>

namespace paramd::reference {
namespace {

uint32_t BitsOf(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

float FloatOf(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

}  // namespace

uint16_t Bf16FromFloat(float x) {
  if (std::isnan(x)) return 0x7FFF;
  const uint32_t bits = BitsOf(x);
  const uint32_t sign = bits & 0x80000000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  // Split the magnitude into the kept top half and the discarded low half, then round the kept
  // half up when the discarded half is above the midpoint, or at it with an odd kept half.
  uint32_t kept = magnitude >> 16;
  const uint32_t dropped = magnitude & 0xFFFFu;
  if (dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u) != 0)) kept += 1;
  if (kept >= 0x7F80u) kept = 0x7F7Fu;  // rounded past the largest finite, or was inf
  return static_cast<uint16_t>((sign >> 16) | kept);
}

float FloatFromBf16(uint16_t code) { return FloatOf(static_cast<uint32_t>(code) << 16); }

float SumSlotsFp32(const float* const* slots, int num_slots, size_t i) {
  float sum = slots[0][i];
  for (int r = 1; r < num_slots; ++r) sum += slots[r][i];
  return sum;
}

float SumSlotsBf16(const uint16_t* const* slots, int num_slots, size_t i) {
  float sum = FloatFromBf16(slots[0][i]);
  for (int r = 1; r < num_slots; ++r) sum += FloatFromBf16(slots[r][i]);
  return sum;
}

void AdamwStepFp32(const Hyper& hyper, int64_t k, const float* gs, float* p, float* m, float* v,
                   size_t n) {
  const double bias1 = 1.0 - std::pow(hyper.beta1, static_cast<double>(k));
  const double bias2 = 1.0 - std::pow(hyper.beta2, static_cast<double>(k));
  const float beta1 = static_cast<float>(hyper.beta1);
  const float beta2 = static_cast<float>(hyper.beta2);
  const float one_minus_beta1 = static_cast<float>(1.0 - hyper.beta1);
  const float one_minus_beta2 = static_cast<float>(1.0 - hyper.beta2);
  const float eps = static_cast<float>(hyper.eps);
  const float decay = static_cast<float>(1.0 - hyper.lr * hyper.weight_decay);
  const float step_size = static_cast<float>(hyper.lr / bias1);
  const float bc2 = static_cast<float>(1.0 / std::sqrt(bias2));
  for (size_t i = 0; i < n; ++i) {
    const float g = gs[i];
    const float g_times_c1 = one_minus_beta1 * g;
    m[i] = std::fma(beta1, m[i], g_times_c1);
    const float g_squared = g * g;
    const float g_squared_times_c2 = one_minus_beta2 * g_squared;
    v[i] = std::fma(beta2, v[i], g_squared_times_c2);
    const float root = std::sqrt(v[i]);
    const float denom = std::fma(root, bc2, eps);
    const float ratio = m[i] / denom;
    const float decayed = p[i] * decay;
    p[i] = std::fma(-step_size, ratio, decayed);
  }
}

void AdamwStepF64(const Hyper& hyper, int64_t k, const double* g, double* p, double* m, double* v,
                  size_t n) {
  const double bias1 = 1.0 - std::pow(hyper.beta1, static_cast<double>(k));
  const double bias2 = 1.0 - std::pow(hyper.beta2, static_cast<double>(k));
  for (size_t i = 0; i < n; ++i) {
    p[i] *= 1.0 - hyper.lr * hyper.weight_decay;
    m[i] = hyper.beta1 * m[i] + (1.0 - hyper.beta1) * g[i];
    v[i] = hyper.beta2 * v[i] + (1.0 - hyper.beta2) * g[i] * g[i];
    const double denom = std::sqrt(v[i]) / std::sqrt(bias2) + hyper.eps;
    p[i] -= hyper.lr / bias1 * m[i] / denom;
  }
}

}  // namespace paramd::reference
