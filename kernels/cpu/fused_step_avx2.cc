// The AVX2 + FMA + F16C path: the step pipeline on 8 lanes (vec_avx2.h). Every header that must
// stay baseline code is included before the target pragma, so only this file's own instantiations
// are compiled for AVX2.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/fused_step_paths.h"
#include "kernels/formats.h"
#include "kernels/fused_step.h"
#include "kernels/philox.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "kernels/cpu/state_codec.h"
#include "kernels/cpu/step_pipeline.h"
#include "kernels/cpu/vec_avx2.h"

namespace paramd::kernels::cpu_internal {

uint32_t FusedStepAvx2(const FusedStepArgs& args, int64_t begin, int64_t end,
                       uint32_t* chunk_amax_bits) {
  return RunRange<VecAvx2>(args, begin, end, chunk_amax_bits);
}

void EncodeForTestAvx2(CodecFormat format, const float* x, const uint32_t* r, uint32_t* codes,
                       int64_t n) {
  EncodeArray<VecAvx2>(format, x, r, codes, n);
}

void DecodeForTestAvx2(CodecFormat format, const uint32_t* codes, float* out, int64_t n) {
  DecodeArray<VecAvx2>(format, codes, out, n);
}

void PhiloxForTestAvx2(const PhiloxKey& key, RoundingStream stream, uint32_t k,
                       uint32_t tensor_index, uint64_t index, int64_t count, uint32_t* words) {
  DrawArray<VecAvx2>(key, stream, k, tensor_index, index, count, words);
}

}  // namespace paramd::kernels::cpu_internal

#pragma GCC pop_options
