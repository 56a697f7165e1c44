// The AVX-512F path: 16 elements per iteration, the same IEEE operations in the same order as
// StepElement, so the same bits. Elements before the first aligned output vector and the last
// partial vector run through the same body with masked loads and stores (BF16 slots are staged
// through a small buffer: AVX-512F has no masked 16-bit load).
//
// The served outputs are write-only: on ranges of kMinStreamElements or more they are written with
// non-temporal (streaming) stores, which skip reading each output line into the cache before
// overwriting it (2 of the 30 bytes per element of the fp32 policy serving bf16).

// GCC 12 reports its own _mm512_undefined_*() placeholders as maybe-uninitialized (a known false
// positive of the AVX-512 intrinsic headers), so that warning is off for them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <cstring>

#include "kernels/cpu/fused_step_paths.h"

#define PARAMD_AVX512 __attribute__((target("avx512f,avx2,fma"), always_inline)) inline

namespace paramd::kernels::cpu_internal {
namespace {

// Below this many elements per call the outputs are stored normally: a small tensor's served copy
// may well be read again from the cache.
constexpr int64_t kMinStreamElements = 4096;

struct Consts {
  __m512 grad_scale, beta1, beta2, c1, c2, eps, decay, neg_step_size, bc2;
};

PARAMD_AVX512 __m512 Bf16ToFp32x16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <bool kMasked>
PARAMD_AVX512 __m512 LoadFp32(const float* p, __mmask16 k) {
  if constexpr (kMasked) return _mm512_maskz_loadu_ps(k, p);
  return _mm512_loadu_ps(p);
}

template <bool kMasked>
PARAMD_AVX512 __m512 LoadBf16(const uint16_t* p, int count) {
  if constexpr (kMasked) {
    alignas(32) uint16_t staged[16] = {};
    std::memcpy(staged, p, sizeof(uint16_t) * count);
    return Bf16ToFp32x16(_mm256_load_si256(reinterpret_cast<const __m256i*>(staged)));
  }
  return Bf16ToFp32x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <bool kMasked>
PARAMD_AVX512 __m512 SlotSum16(const FusedStepArgs& a, int64_t i, __mmask16 k, int count) {
  if (a.slot_type == SlotType::kFp32) {
    __m512 g0 = LoadFp32<kMasked>(static_cast<const float*>(a.slots[0]) + i, k);
    for (int r = 1; r < a.num_slots; ++r) {
      g0 = _mm512_add_ps(g0, LoadFp32<kMasked>(static_cast<const float*>(a.slots[r]) + i, k));
    }
    return g0;
  }
  __m512 g0 = LoadBf16<kMasked>(static_cast<const uint16_t*>(a.slots[0]) + i, count);
  for (int r = 1; r < a.num_slots; ++r) {
    g0 = _mm512_add_ps(g0, LoadBf16<kMasked>(static_cast<const uint16_t*>(a.slots[r]) + i, count));
  }
  return g0;
}

// kStream needs a 64-byte aligned p (and !kMasked).
template <bool kMasked, bool kStream = false>
PARAMD_AVX512 void StoreFp32(float* p, __mmask16 k, __m512 x) {
  if constexpr (kMasked) {
    _mm512_mask_storeu_ps(p, k, x);
  } else if constexpr (kStream) {
    _mm512_stream_ps(p, x);
  } else {
    _mm512_storeu_ps(p, x);
  }
}

// Bf16FromFloat on 16 lanes, stored as 16 codes. kStream needs a 32-byte aligned out.
template <bool kMasked, bool kStream>
PARAMD_AVX512 void StoreBf16(uint16_t* out, __mmask16 k, __m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  __m512i hi = _mm512_srli_epi32(rounded, 16);
  const __mmask16 overflow = _mm512_cmpgt_epi32_mask(
      _mm512_and_si512(hi, _mm512_set1_epi32(0x7FFF)), _mm512_set1_epi32(0x7F7F));
  hi = _mm512_mask_or_epi32(hi, overflow, _mm512_and_si512(hi, _mm512_set1_epi32(0x8000)),
                            _mm512_set1_epi32(0x7F7F));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  hi = _mm512_mask_mov_epi32(hi, nan, _mm512_set1_epi32(kBf16NaN));
  // Every lane holds a value in [0, 0xFFFF], so truncating to 16 bits is exact.
  if constexpr (kMasked) {
    _mm512_mask_cvtepi32_storeu_epi16(out, k, hi);
  } else if constexpr (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(hi));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(hi));
  }
}

// How the served outputs of one vector are stored: streaming needs the alignment checked by the
// caller; a masked vector never streams.
struct OutputStores {
  bool stream_bf16 = false;
  bool stream_fp32 = false;
};

template <bool kMasked>
PARAMD_AVX512 void Step16(const FusedStepArgs& a, const Consts& c, int64_t i, __mmask16 k,
                          int count, OutputStores stores = {}) {
  const __m512 g = _mm512_mul_ps(SlotSum16<kMasked>(a, i, k, count), c.grad_scale);
  const __m512 m =
      _mm512_fmadd_ps(c.beta1, LoadFp32<kMasked>(a.exp_avg + i, k), _mm512_mul_ps(c.c1, g));
  const __m512 v = _mm512_fmadd_ps(c.beta2, LoadFp32<kMasked>(a.exp_avg_sq + i, k),
                                   _mm512_mul_ps(c.c2, _mm512_mul_ps(g, g)));
  const __m512 d = _mm512_fmadd_ps(_mm512_sqrt_ps(v), c.bc2, c.eps);
  __m512 p = _mm512_mul_ps(LoadFp32<kMasked>(a.master + i, k), c.decay);
  p = _mm512_fmadd_ps(c.neg_step_size, _mm512_div_ps(m, d), p);
  StoreFp32<kMasked>(a.exp_avg + i, k, m);
  StoreFp32<kMasked>(a.exp_avg_sq + i, k, v);
  StoreFp32<kMasked>(a.master + i, k, p);
  if (a.out_fp32 != nullptr) {
    if (!kMasked && stores.stream_fp32) {
      StoreFp32<false, true>(a.out_fp32 + i, k, p);
    } else {
      StoreFp32<kMasked>(a.out_fp32 + i, k, p);
    }
  }
  if (a.out_bf16 != nullptr) {
    if (!kMasked && stores.stream_bf16) {
      StoreBf16<false, true>(a.out_bf16 + i, k, p);
    } else {
      StoreBf16<kMasked, false>(a.out_bf16 + i, k, p);
    }
  }
}

bool Aligned(const void* p, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// Elements to step before the outputs can be streamed: up to the first 32-byte boundary of
// out_bf16 (one vector of codes), or else the first 64-byte boundary of out_fp32.
int64_t ElementsBeforeAlignedOutput(const FusedStepArgs& a, int64_t begin) {
  if (a.out_bf16 != nullptr) {
    const uintptr_t misalign = reinterpret_cast<uintptr_t>(a.out_bf16 + begin) % 32;
    return misalign % sizeof(uint16_t) != 0 ? 0 : static_cast<int64_t>((32 - misalign) % 32 / 2);
  }
  const uintptr_t misalign = reinterpret_cast<uintptr_t>(a.out_fp32 + begin) % 64;
  return misalign % sizeof(float) != 0 ? 0 : static_cast<int64_t>((64 - misalign) % 64 / 4);
}

}  // namespace

__attribute__((target("avx512f,avx2,fma"))) void FusedStepAvx512(const FusedStepArgs& a,
                                                                 int64_t begin, int64_t end) {
  const AdamwScalars& s = a.scalars;
  const Consts c{
      _mm512_set1_ps(a.grad_scale), _mm512_set1_ps(s.beta1),      _mm512_set1_ps(s.beta2),
      _mm512_set1_ps(s.c1),         _mm512_set1_ps(s.c2),         _mm512_set1_ps(s.eps),
      _mm512_set1_ps(s.decay),      _mm512_set1_ps(-s.step_size), _mm512_set1_ps(s.bc2)};
  int64_t i = begin;
  OutputStores stores;
  const bool has_output = a.out_bf16 != nullptr || a.out_fp32 != nullptr;
  if (has_output && end - begin >= kMinStreamElements) {
    const int64_t peel = ElementsBeforeAlignedOutput(a, begin);
    if (peel > 0) {
      Step16<true>(a, c, i, static_cast<__mmask16>((1u << peel) - 1), static_cast<int>(peel));
      i += peel;
    }
    stores.stream_bf16 = a.out_bf16 != nullptr && Aligned(a.out_bf16 + i, 32);
    stores.stream_fp32 = a.out_fp32 != nullptr && Aligned(a.out_fp32 + i, 64);
  }
  for (; i + kPrefetchAhead + 16 <= end; i += 16) {
    PrefetchInputs(a, i + kPrefetchAhead);
    Step16<false>(a, c, i, 0xFFFF, 16, stores);
  }
  for (; i + 16 <= end; i += 16) Step16<false>(a, c, i, 0xFFFF, 16, stores);
  // Streaming stores are weakly ordered: fence them before the caller publishes the outputs.
  if (stores.stream_bf16 || stores.stream_fp32) _mm_sfence();
  if (i < end) {
    const int count = static_cast<int>(end - i);
    Step16<true>(a, c, i, static_cast<__mmask16>((1u << count) - 1), count);
  }
}

}  // namespace paramd::kernels::cpu_internal
