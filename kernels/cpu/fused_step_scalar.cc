// The portable path: the step pipeline on one lane (vec_scalar.h). It runs where neither vector
// path can, and the vector paths hand it chunks that are not whole vectors.
#include "kernels/cpu/fused_step_paths.h"
#include "kernels/cpu/step_pipeline.h"
#include "kernels/cpu/vec_scalar.h"

namespace paramd::kernels::cpu_internal {

uint32_t FusedStepScalar(const FusedStepArgs& args, int64_t begin, int64_t end,
                         uint32_t* chunk_amax_bits) {
  return RunRange<VecScalar>(args, begin, end, chunk_amax_bits);
}

uint32_t StepChunkScalar(const FusedStepArgs& args, int64_t c, int count) {
  const StepContext<VecScalar> x(args);
  uint32_t amax = 0;
  StepChunk<VecScalar>(x, c, count, &amax);
  return amax;
}

void EncodeForTestScalar(CodecFormat format, const float* x, const uint32_t* r, uint32_t* codes,
                         int64_t n) {
  EncodeArray<VecScalar>(format, x, r, codes, n);
}

void DecodeForTestScalar(CodecFormat format, const uint32_t* codes, float* out, int64_t n) {
  DecodeArray<VecScalar>(format, codes, out, n);
}

void PhiloxForTestScalar(const PhiloxKey& key, RoundingStream stream, uint32_t k,
                         uint32_t tensor_index, uint64_t index, int64_t count, uint32_t* words) {
  DrawArray<VecScalar>(key, stream, k, tensor_index, index, count, words);
}

}  // namespace paramd::kernels::cpu_internal
