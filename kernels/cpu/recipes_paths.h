// Internal to kernels/cpu: the few loops the serve recipes are made of, as one small table of
// functions per code path (scalar, AVX2, AVX-512). recipes_cpu.cc builds every recipe and
// direction from them once; a vector path only re-implements these loops, with the same integer
// arithmetic on the bits and the same single FP32 multiply per element, so every path gives the
// same bits. Not part of the API.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/formats.h"

namespace paramd::kernels::cpu_internal {

struct ServeKernels {
  // max over i < n of AbsBits(x[i]); 0 for n == 0.
  uint32_t (*max_abs_bits)(const float* x, int64_t n);
  // acc[j] = max(acc[j], AbsBits(x[r * stride + j])) for r < nrows, j < n.
  void (*column_max_abs_bits)(const float* x, int64_t stride, int64_t nrows, int64_t n,
                              uint32_t* acc);
  // out[i] = E4m3FromFloat(x[i] * scale).
  void (*e4m3_scaled)(const float* x, int64_t n, float scale, uint8_t* out);
  // out[i] = E4m3FromFloat(x[i] * scales[i]).
  void (*e4m3_scaled_each)(const float* x, int64_t n, const float* scales, uint8_t* out);
  // mxfp8 rowwise of one row of n values: codes[b] for each 32-element block b (the last one
  // possibly partial), data out[i].
  void (*mx_row)(const float* x, int64_t n, uint8_t* out, uint8_t* codes);
  // out[i] = Bf16FromFloat(x[i]) / Fp16FromFloat(x[i]).
  void (*bf16)(const float* x, int64_t n, uint16_t* out);
  void (*fp16)(const float* x, int64_t n, uint16_t* out);
};

const ServeKernels& ScalarServeKernels();
const ServeKernels& Avx2ServeKernels();
const ServeKernels& Avx512ServeKernels();

// One mxfp8 block of n <= 32 values, scalar: the vector paths use it for partial blocks.
inline uint8_t MxBlockScalar(const float* x, int64_t n, uint8_t* out) {
  uint32_t bits = 0;
  for (int64_t i = 0; i < n; ++i) bits = std::max(bits, AbsBits(x[i]));
  const uint8_t code = MxScaleCode(AmaxFromBits(bits));
  const float scale = MxDataScale(code);
  for (int64_t i = 0; i < n; ++i) out[i] = E4m3FromFloat(x[i] * scale);
  return code;
}

}  // namespace paramd::kernels::cpu_internal
