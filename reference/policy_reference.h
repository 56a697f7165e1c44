// paramd::reference — the independent scalar model of DESIGN.md §3's state policies: every master
// type (fp32, bf16+remainder, fp16) and moment type (fp32, bf16, fp16 and fp8 with per-chunk
// power-of-two scales), nearest and stochastic rounding with its own Philox 4x32-10, and the served
// copies. The kernels (kernels/fused_step.h) must equal it bit for bit.
//
// Where the kernels work on the bits, this model works on values: a cast finds the format's grid
// step at the value's exponent with frexp/ldexp in double, rounds the exact quotient, and rebuilds
// the code from the rounded value; scales are found by searching the powers of two. Like
// adamw_reference.h it must NOT link or include kernels/.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "reference/adamw_reference.h"

namespace paramd::reference {

enum class MasterRef { kFp32, kBf16Remainder, kFp16 };
enum class MomentRef { kFp32, kBf16, kFp16, kFp8 };

struct PolicyRef {
  MasterRef master = MasterRef::kFp32;
  MomentRef exp_avg = MomentRef::kFp32;
  MomentRef exp_avg_sq = MomentRef::kFp32;
  bool exp_avg_stochastic = false;
  bool exp_avg_sq_stochastic = false;
};

// Stochastic rounding's key and counter parts (DESIGN.md §3).
struct RngRef {
  uint64_t seed = 0;
  uint32_t k = 0;
  uint32_t tensor_index = 0;
};

// Philox4x32-10 of a counter under a key, written from the algorithm's definition.
std::array<uint32_t, 4> PhiloxRef(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// The random word of element i of a tensor in a moment's stream (README.md "Numerics"): word i % 4
// of Philox at counter (i / 4 low 32 bits, i / 4 >> 32 plus 2^31 for exp_avg_sq, k,
// tensor_index), key seed (low 32 bits first).
enum class StreamRef { kExpAvg, kExpAvgSq };
uint32_t RandomWordRef(const RngRef& rng, StreamRef stream, uint64_t i);

// A binary format: mantissa bits, smallest normal exponent, largest finite magnitude code, NaN
// code, total bits, and whether the all-ones exponent is infinity (else those codes are NaN).
struct MiniFormatRef {
  int man_bits;
  int min_exp;
  uint32_t max_code;
  uint32_t nan_code;
  int bits;
  bool has_inf;
};
inline constexpr MiniFormatRef kE4m3Ref{3, -6, 0x7E, 0x7F, 8, false};
inline constexpr MiniFormatRef kFp16Ref{10, -14, 0x7BFF, 0x7FFF, 16, true};
inline constexpr MiniFormatRef kBf16Ref{7, -126, 0x7F7F, 0x7FFF, 16, true};

// FP32 -> code. random == nullptr: nearest, ties to the even code. Else stochastic: with lo <= |x|
// < hi adjacent magnitudes of the format, |x| goes to hi iff *random < floor(2^32 (|x| - lo) / (hi
// - lo)). Magnitudes at or past the largest finite one (infinities too) give it, with the sign;
// NaN gives the positive NaN code.
uint32_t RoundToCodeRef(const MiniFormatRef& format, float x, const uint32_t* random);
// Code -> FP32 (exact); NaN codes give the quiet NaN of their sign.
float CodeValueRef(const MiniFormatRef& format, uint32_t code);

// The largest 2^k, k in [-126, 126], with 2^k * amax <= top; 1 when amax is 0, inf or NaN.
float Pow2ScaleSearchRef(float amax, float top);

// The stored state of one tensor, laid out as the kernels lay it out: only the vectors of the
// policy's types are used; scale_inv has one entry per 128-element chunk.
struct MomentStateRef {
  std::vector<float> fp32;
  std::vector<uint16_t> u16;  // bf16 or fp16 codes
  std::vector<uint8_t> u8;    // e4m3 codes
  std::vector<float> scale_inv;
};
struct PolicyStateRef {
  std::vector<float> master_fp32;
  std::vector<uint16_t> master_u16;  // served-bf16 halves, or fp16 codes
  std::vector<int16_t> master_remainder;
  MomentStateRef exp_avg;
  MomentStateRef exp_avg_sq;
};

// Initial state: the master from FP32 weights (split, or cast to FP16 to nearest), zero moments,
// scales 1.
PolicyStateRef MakePolicyStateRef(const PolicyRef& policy, const std::vector<float>& initial);

// The stored master of element i as FP32 (reconstructed for bf16+remainder, decoded for fp16).
float MasterValueRef(const PolicyRef& policy, const PolicyStateRef& state, size_t i);

// The moment value of element i, q * (1 / s).
float MomentValueRef(MomentRef type, const MomentStateRef& state, size_t i);

// g = gs * clip, skipped when clip == 1, where gs = g0 * grad_scale.
float ClippedGradRef(float g0, float grad_scale, float clip);

// One step of n elements. g: the gradient per element (ClippedGradRef). Per chunk of 128: each
// element dequantized and updated as AdamwStepFp32 writes it, the master stored in its type, then
// each quantized moment re-quantized with the chunk's new scale (stochastic rounding draws
// RandomWordRef of the moment's stream).
void PolicyStepRef(const PolicyRef& policy, const Hyper& hyper, int64_t k, const RngRef& rng,
                   const float* g, size_t n, PolicyStateRef* state);

// The served copies of element i, from the stored master value.
struct MasterServedRef {
  float fp32;
  uint16_t bf16;  // bf16+remainder: the stored served half
  uint16_t fp16;
};
MasterServedRef ServeMasterRef(const PolicyRef& policy, const PolicyStateRef& state, size_t i);

}  // namespace paramd::reference
