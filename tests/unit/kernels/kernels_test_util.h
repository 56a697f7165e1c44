// Shared by the kernels unit tests: the tolerance table, seeded random data, and bit comparisons.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/fused_step.h"

namespace paramd::kernels::testing {

// Every tolerance of these tests, in one place. Bit-exact checks have no tolerance at all.
struct Tolerances {
  // DESIGN.md §3: ||p - p64|| / ||p64|| after 1000 steps of the accuracy setup, fp32 policy.
  static constexpr double kFp32PolicyVsFloat64 = 1e-4;
  // The same bar for every state policy (policy_accuracy_test.cc), DESIGN.md §3's table.
  static constexpr double kBf16RemainderVsFloat64 = 1e-4;  // and bit-identical to fp32
  static constexpr double kFp16MasterVsFloat64 = 1.5e-2;
  static constexpr double kFp16MomentsVsFloat64 = 5e-3;
  static constexpr double kBf16MomentsVsFloat64 = 5e-2;
  static constexpr double kFp8MFp16VVsFloat64 = 1e-1;
  static constexpr double kFp8MomentsVsFloat64 = 0.25;
  // Harsh hyper-parameters (lr 1, betas 0.1 / 0.25, 300 steps): every policy stays finite, and
  // its weights within this norm-relative distance of float64 AdamW (measured on the development
  // machine: fp32 6.7e-7, fp16 master 1.5e-3, fp8 both 7.7e-3; the weights take steps of about 1,
  // so the relative error stays small).
  static constexpr double kHarshVsFloat64 = 5e-2;
  // Stochastic rounding is unbiased: the mean of many draws lies within this many standard errors
  // of the value rounded.
  static constexpr double kUnbiasedStandardErrors = 5.0;
  // A served E4M3 value, dequantized, against its master: half a step of 3 mantissa bits
  // (2^-4 relative, plus the FP32 roundings of x * scale and 1 / scale) where the scaled value is
  // normal in E4M3, half its smallest step (2^-10, in scaled units) below that. A sanity bound
  // only: the served bytes are checked bit for bit.
  static constexpr double kE4m3HalfStepRelative = 0.0626;
  static constexpr double kE4m3HalfSubnormalStep = 1.0 / 1024;
};

// The hyper-parameters of DESIGN.md §3's accuracy setup, also used as the default elsewhere.
inline AdamwHyper AccuracySetupHyper() {
  AdamwHyper h;
  h.lr = 1e-3;
  h.beta1 = 0.9;
  h.beta2 = 0.999;
  h.eps = 1e-8;
  h.weight_decay = 0.01;
  return h;
}

inline uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }

// Index of the first element whose bits differ, or -1.
inline int64_t FirstBitMismatch(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (Bits(a[i]) != Bits(b[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

inline int64_t FirstBitMismatch(const uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

inline std::string Describe(const char* what, const float* got, const float* want, int64_t i) {
  if (i < 0) return "";
  std::ostringstream os;
  os << what << "[" << i << "]: got " << got[i] << " (0x" << std::hex << Bits(got[i]) << "), want "
     << std::dec << want[i] << " (0x" << std::hex << Bits(want[i]) << ")";
  return os.str();
}

inline std::string Describe(const char* what, const uint16_t* got, const uint16_t* want,
                            int64_t i) {
  if (i < 0) return "";
  std::ostringstream os;
  os << what << "[" << i << "]: got 0x" << std::hex << got[i] << ", want 0x" << want[i];
  return os.str();
}

// Gradients over a wide dynamic range: mostly "typical" values, plus zeros, signed zeros, tiny and
// subnormal values, and values around 1. Squares stay finite (the daemon skips a step otherwise).
inline float WideRangeValue(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double kind = unit(rng);
  const double sign = unit(rng) < 0.5 ? -1.0 : 1.0;
  if (kind < 0.02) return static_cast<float>(sign * 0.0);
  if (kind < 0.04) return static_cast<float>(sign * std::ldexp(unit(rng), -127));  // subnormal
  if (kind < 0.10) return static_cast<float>(sign * std::pow(10.0, -30.0 + 32.0 * unit(rng)));
  std::normal_distribution<double> normal(0.0, 1e-3);
  return static_cast<float>(normal(rng) * (1.0 + 0.5 * std::normal_distribution<double>()(rng)));
}

inline std::vector<float> RandomFloats(std::mt19937_64& rng, size_t n) {
  std::vector<float> out(n);
  for (float& x : out) x = WideRangeValue(rng);
  return out;
}

inline std::vector<float> NormalFloats(std::mt19937_64& rng, size_t n, double stddev) {
  std::normal_distribution<double> normal(0.0, stddev);
  std::vector<float> out(n);
  for (float& x : out) x = static_cast<float>(normal(rng));
  return out;
}

}  // namespace paramd::kernels::testing
