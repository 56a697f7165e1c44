// The AVX2 + FMA path: 8 elements per iteration, the same IEEE operations in the same order as
// StepElement, so the same bits. Elements before the first aligned output vector and the last
// (end - begin) % 8 take the scalar form. As in the AVX-512 path, long ranges write the served
// outputs with non-temporal stores.
#include <immintrin.h>

#include "kernels/cpu/fused_step_paths.h"

#define PARAMD_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline

namespace paramd::kernels::cpu_internal {
namespace {

PARAMD_AVX2 __m256 LoadBf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

PARAMD_AVX2 __m256 SlotSum8(const FusedStepArgs& a, int64_t i) {
  if (a.slot_type == SlotType::kFp32) {
    __m256 g0 = _mm256_loadu_ps(static_cast<const float*>(a.slots[0]) + i);
    for (int r = 1; r < a.num_slots; ++r) {
      g0 = _mm256_add_ps(g0, _mm256_loadu_ps(static_cast<const float*>(a.slots[r]) + i));
    }
    return g0;
  }
  __m256 g0 = LoadBf16x8(static_cast<const uint16_t*>(a.slots[0]) + i);
  for (int r = 1; r < a.num_slots; ++r) {
    g0 = _mm256_add_ps(g0, LoadBf16x8(static_cast<const uint16_t*>(a.slots[r]) + i));
  }
  return g0;
}

constexpr int64_t kMinStreamElements = 4096;

// Bf16FromFloat on 8 lanes, stored as 8 codes (streaming needs a 16-byte aligned out).
PARAMD_AVX2 void StoreBf16x8(uint16_t* out, __m256 x, bool stream) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  __m256i hi = _mm256_srli_epi32(rounded, 16);
  const __m256i overflow = _mm256_cmpgt_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(0x7FFF)),
                                              _mm256_set1_epi32(0x7F7F));
  const __m256i saturated =
      _mm256_or_si256(_mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7F7F));
  hi = _mm256_blendv_epi8(hi, saturated, overflow);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)),
                                         _mm256_set1_epi32(0x7F800000));
  hi = _mm256_blendv_epi8(hi, _mm256_set1_epi32(kBf16NaN), nan);
  // Every lane holds a value in [0, 0xFFFF], so the saturating pack is exact.
  const __m128i codes =
      _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
  if (stream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(out), codes);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), codes);
  }
}

bool Aligned(const void* p, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// Elements to step before the outputs can be streamed: up to the first 16-byte boundary of
// out_bf16 (one vector of codes), or else the first 32-byte boundary of out_fp32.
int64_t ElementsBeforeAlignedOutput(const FusedStepArgs& a, int64_t begin) {
  if (a.out_bf16 != nullptr) {
    const uintptr_t misalign = reinterpret_cast<uintptr_t>(a.out_bf16 + begin) % 16;
    return misalign % sizeof(uint16_t) != 0 ? 0 : static_cast<int64_t>((16 - misalign) % 16 / 2);
  }
  const uintptr_t misalign = reinterpret_cast<uintptr_t>(a.out_fp32 + begin) % 32;
  return misalign % sizeof(float) != 0 ? 0 : static_cast<int64_t>((32 - misalign) % 32 / 4);
}

}  // namespace

__attribute__((target("avx2,fma"))) void FusedStepAvx2(const FusedStepArgs& a, int64_t begin,
                                                       int64_t end) {
  const AdamwScalars& s = a.scalars;
  const __m256 grad_scale = _mm256_set1_ps(a.grad_scale);
  const __m256 beta1 = _mm256_set1_ps(s.beta1);
  const __m256 beta2 = _mm256_set1_ps(s.beta2);
  const __m256 c1 = _mm256_set1_ps(s.c1);
  const __m256 c2 = _mm256_set1_ps(s.c2);
  const __m256 eps = _mm256_set1_ps(s.eps);
  const __m256 decay = _mm256_set1_ps(s.decay);
  const __m256 neg_step_size = _mm256_set1_ps(-s.step_size);
  const __m256 bc2 = _mm256_set1_ps(s.bc2);

  int64_t i = begin;
  bool stream_bf16 = false;
  bool stream_fp32 = false;
  const bool has_output = a.out_bf16 != nullptr || a.out_fp32 != nullptr;
  if (has_output && end - begin >= kMinStreamElements) {
    for (const int64_t aligned = i + ElementsBeforeAlignedOutput(a, begin); i < aligned; ++i) {
      StepElement(a, i);
    }
    stream_bf16 = a.out_bf16 != nullptr && Aligned(a.out_bf16 + i, 16);
    stream_fp32 = a.out_fp32 != nullptr && Aligned(a.out_fp32 + i, 32);
  }
  for (; i + 8 <= end; i += 8) {
    if (i + kPrefetchAhead < end) PrefetchInputs(a, i + kPrefetchAhead);
    const __m256 g = _mm256_mul_ps(SlotSum8(a, i), grad_scale);
    const __m256 m = _mm256_fmadd_ps(beta1, _mm256_loadu_ps(a.exp_avg + i), _mm256_mul_ps(c1, g));
    const __m256 v = _mm256_fmadd_ps(beta2, _mm256_loadu_ps(a.exp_avg_sq + i),
                                     _mm256_mul_ps(c2, _mm256_mul_ps(g, g)));
    const __m256 d = _mm256_fmadd_ps(_mm256_sqrt_ps(v), bc2, eps);
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(a.master + i), decay);
    p = _mm256_fmadd_ps(neg_step_size, _mm256_div_ps(m, d), p);
    _mm256_storeu_ps(a.exp_avg + i, m);
    _mm256_storeu_ps(a.exp_avg_sq + i, v);
    _mm256_storeu_ps(a.master + i, p);
    if (a.out_fp32 != nullptr) {
      if (stream_fp32) {
        _mm256_stream_ps(a.out_fp32 + i, p);
      } else {
        _mm256_storeu_ps(a.out_fp32 + i, p);
      }
    }
    if (a.out_bf16 != nullptr) StoreBf16x8(a.out_bf16 + i, p, stream_bf16);
  }
  // Streaming stores are weakly ordered: fence them before the caller publishes the outputs.
  if (stream_bf16 || stream_fp32) _mm_sfence();
  for (; i < end; ++i) StepElement(a, i);
}

}  // namespace paramd::kernels::cpu_internal
