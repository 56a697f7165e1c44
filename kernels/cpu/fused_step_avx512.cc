// The AVX-512F path: the step pipeline on 16 lanes (vec_avx512.h). Every header that must stay
// baseline code is included before the target pragma, so only this file's own instantiations are
// compiled for AVX-512.
// GCC 12 reports its own _mm512_undefined_*() placeholders as (maybe-)uninitialized (a known false
// positive of the AVX-512 intrinsic headers), so those warnings are off for them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

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
#pragma GCC target("avx512f,avx2,fma")

#include "kernels/cpu/state_codec.h"
#include "kernels/cpu/step_pipeline.h"
#include "kernels/cpu/vec_avx512.h"

namespace paramd::kernels::cpu_internal {

uint32_t FusedStepAvx512(const FusedStepArgs& args, int64_t begin, int64_t end,
                         uint32_t* chunk_amax_bits) {
  return RunRange<VecAvx512>(args, begin, end, chunk_amax_bits);
}

void EncodeForTestAvx512(CodecFormat format, const float* x, const uint32_t* r, uint32_t* codes,
                         int64_t n) {
  EncodeArray<VecAvx512>(format, x, r, codes, n);
}

void DecodeForTestAvx512(CodecFormat format, const uint32_t* codes, float* out, int64_t n) {
  DecodeArray<VecAvx512>(format, codes, out, n);
}

void PhiloxForTestAvx512(const PhiloxKey& key, RoundingStream stream, uint32_t k,
                         uint32_t tensor_index, uint64_t index, int64_t count, uint32_t* words) {
  DrawArray<VecAvx512>(key, stream, k, tensor_index, index, count, words);
}

}  // namespace paramd::kernels::cpu_internal

#pragma GCC pop_options
