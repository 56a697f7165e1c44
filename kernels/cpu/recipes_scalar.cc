// The portable scalar path of the serve recipes: the element functions of kernels/formats.h in
// plain loops. The vector paths must match it bit for bit.
#include "kernels/cpu/recipes_paths.h"

namespace paramd::kernels::cpu_internal {
namespace {

uint32_t MaxAbsBits(const float* x, int64_t n) {
  uint32_t bits = 0;
  for (int64_t i = 0; i < n; ++i) bits = std::max(bits, AbsBits(x[i]));
  return bits;
}

void ColumnMaxAbsBits(const float* x, int64_t stride, int64_t nrows, int64_t n, uint32_t* acc) {
  for (int64_t r = 0; r < nrows; ++r) {
    for (int64_t j = 0; j < n; ++j) acc[j] = std::max(acc[j], AbsBits(x[r * stride + j]));
  }
}

void E4m3Scaled(const float* x, int64_t n, float scale, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = E4m3FromFloat(x[i] * scale);
}

void E4m3ScaledEach(const float* x, int64_t n, const float* scales, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = E4m3FromFloat(x[i] * scales[i]);
}

void MxRow(const float* x, int64_t n, uint8_t* out, uint8_t* codes) {
  for (int64_t c0 = 0; c0 < n; c0 += 32) {
    *codes++ = MxBlockScalar(x + c0, std::min<int64_t>(32, n - c0), out + c0);
  }
}

void Bf16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16FromFloat(x[i]);
}

void Fp16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Fp16FromFloat(x[i]);
}

}  // namespace

const ServeKernels& ScalarServeKernels() {
  static constexpr ServeKernels kKernels = {
      MaxAbsBits, ColumnMaxAbsBits, E4m3Scaled, E4m3ScaledEach, MxRow, Bf16, Fp16};
  return kKernels;
}

}  // namespace paramd::kernels::cpu_internal
