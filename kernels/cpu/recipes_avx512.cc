// The AVX-512 path of the serve recipes: 16 lanes per vector, masked tails. Each cast is
// MiniFloat::Encode / Bf16FromFloat of kernels/formats.h written lane-wise with the same integer
// operations (the round-up test `rest > half || (rest == half && q odd)` as the equivalent
// `rest + (q & 1) > half`), after the same single FP32 multiply, so the codes equal the scalar
// path's.
// GCC 12 reports the _mm512_undefined_*() placeholders inside its own intrinsic headers as
// (maybe-)uninitialized, a known false positive, so those warnings are off for the header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "kernels/cpu/recipes_paths.h"

#define PARAMD_AVX512 __attribute__((target("avx512f")))

namespace paramd::kernels::cpu_internal {
namespace {

PARAMD_AVX512 inline __m512i Set(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }

PARAMD_AVX512 inline __mmask16 TailMask(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);  // n in [0, 16]
}

PARAMD_AVX512 inline __m512i AbsBits16(__m512 x) {
  return _mm512_and_si512(_mm512_castps_si512(x), Set(0x7FFFFFFFu));
}

// E4M3's nearest cast in a short form, the codes of Encode16<E4m3> (kernels/cpu/state_codec.h's
// EncodeE4m3Nearest, which says how; recipes_test checks every FP32 input of the exponents where
// its cases meet): an integer round of the bits at and above 2^-6, an FP32 add of 2^14 below.
PARAMD_AVX512 inline __m512i E4m3Nearest16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i abs = AbsBits16(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(abs, 20), Set(1));
  const __m512i normal = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(abs, Set(0x7FFFFu - (120u << 23))), lsb), 20);
  const __m512i subnormal = _mm512_sub_epi32(
      _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(abs), _mm512_set1_ps(0x1p14f))),
      Set(141u << 23));
  __m512i code =
      _mm512_mask_mov_epi32(normal, _mm512_cmplt_epu32_mask(abs, Set(121u << 23)), subnormal);
  code = _mm512_min_epu32(code, Set(E4m3::kMaxFiniteCode));
  // code | (bits >> 24 & 0x80)
  code = _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(bits, 24), Set(0x80), 0xF8);
  return _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(abs, Set(0x7F800000u)),
                               Set(E4m3::kNaNCode));
}

// MiniFloat F's Encode on 16 lanes, the codes in the low bits of each 32-bit lane.
template <typename F>
PARAMD_AVX512 inline __m512i Encode16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i abs = AbsBits16(x);
  const __m512i one = Set(1);
  const __m512i field = _mm512_srli_epi32(abs, 23);
  const __m512i eff = _mm512_max_epu32(field, one);
  const __m512i sig = _mm512_or_si512(_mm512_and_si512(abs, Set(0x7FFFFFu)),
                                      _mm512_slli_epi32(_mm512_min_epu32(field, one), 23));
  const __m512i normal_eff = _mm512_max_epu32(eff, Set(F::kMinNormalField));
  const __m512i below = _mm512_sub_epi32(normal_eff, eff);  // max(kMinNormalField - eff, 0)
  const __m512i shift = _mm512_min_epu32(_mm512_add_epi32(below, Set(F::kShift)), Set(25));
  __m512i q = _mm512_srlv_epi32(sig, shift);
  const __m512i unit = _mm512_sllv_epi32(one, shift);
  const __m512i rest = _mm512_and_si512(sig, _mm512_sub_epi32(unit, one));
  const __m512i half = _mm512_srli_epi32(unit, 1);
  const __mmask16 up =
      _mm512_cmpgt_epu32_mask(_mm512_add_epi32(rest, _mm512_and_si512(q, one)), half);
  q = _mm512_mask_add_epi32(q, up, q, one);
  const __m512i exp_part =
      _mm512_slli_epi32(_mm512_sub_epi32(normal_eff, Set(F::kMinNormalField)), F::kManBits);
  __m512i code = _mm512_min_epu32(_mm512_add_epi32(exp_part, q), Set(F::kMaxFiniteCode));
  const __m512i sign =
      _mm512_and_si512(_mm512_srli_epi32(bits, 31 - F::kExpBits - F::kManBits), Set(F::kSignBit));
  code = _mm512_or_si512(code, sign);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, Set(0x7F800000u));
  return _mm512_mask_mov_epi32(code, nan, Set(F::kNaNCode));
}

// Bf16FromFloat on 16 lanes.
PARAMD_AVX512 inline __m512i Bf16x16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), Set(1));
  const __m512i hi =
      _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, Set(0x7FFF))), 16);
  const __mmask16 overflow =
      _mm512_cmpge_epu32_mask(_mm512_and_si512(hi, Set(0x7FFF)), Set(0x7F80));
  __m512i code = _mm512_mask_mov_epi32(
      hi, overflow, _mm512_or_si512(_mm512_and_si512(hi, Set(0x8000)), Set(kBf16MaxPos)));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(AbsBits16(x), Set(0x7F800000u));
  return _mm512_mask_mov_epi32(code, nan, Set(kBf16NaN));
}

PARAMD_AVX512 inline void Store8(uint8_t* out, __m512i codes, __mmask16 m) {
  _mm512_mask_cvtepi32_storeu_epi8(out, m, codes);
}

PARAMD_AVX512 inline void Store16(uint16_t* out, __m512i codes, __mmask16 m) {
  _mm512_mask_cvtepi32_storeu_epi16(out, m, codes);
}

PARAMD_AVX512 uint32_t MaxAbsBits(const float* x, int64_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_max_epu32(a0, AbsBits16(_mm512_loadu_ps(x + i)));
    a1 = _mm512_max_epu32(a1, AbsBits16(_mm512_loadu_ps(x + i + 16)));
    a2 = _mm512_max_epu32(a2, AbsBits16(_mm512_loadu_ps(x + i + 32)));
    a3 = _mm512_max_epu32(a3, AbsBits16(_mm512_loadu_ps(x + i + 48)));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = TailMask(std::min<int64_t>(16, n - i));
    a0 = _mm512_max_epu32(a0, AbsBits16(_mm512_maskz_loadu_ps(m, x + i)));
  }
  return _mm512_reduce_max_epu32(
      _mm512_max_epu32(_mm512_max_epu32(a0, a1), _mm512_max_epu32(a2, a3)));
}

PARAMD_AVX512 void ColumnMaxAbsBits(const float* x, int64_t stride, int64_t nrows, int64_t n,
                                    uint32_t* acc) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = TailMask(std::min<int64_t>(16, n - j));
    __m512i a = _mm512_maskz_loadu_epi32(m, acc + j);
    for (int64_t r = 0; r < nrows; ++r) {
      a = _mm512_max_epu32(a, AbsBits16(_mm512_maskz_loadu_ps(m, x + r * stride + j)));
    }
    _mm512_mask_storeu_epi32(acc + j, m, a);
  }
}

PARAMD_AVX512 void E4m3Scaled(const float* x, int64_t n, float scale, uint8_t* out) {
  const __m512 s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm512_cvtepi32_epi8(E4m3Nearest16(_mm512_mul_ps(_mm512_loadu_ps(x + i), s))));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    Store8(out + i, E4m3Nearest16(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s)), m);
  }
}

PARAMD_AVX512 void E4m3ScaledEach(const float* x, int64_t n, const float* scales, uint8_t* out) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(std::min<int64_t>(16, n - i));
    const __m512 v =
        _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, scales + i));
    Store8(out + i, E4m3Nearest16(v), m);
  }
}

// One block of n <= 32 values (the lanes past n read as zero, which leaves the amax as is).
PARAMD_AVX512 inline uint8_t MxBlock(const float* x, int64_t n, uint8_t* out) {
  const __mmask16 m0 = TailMask(std::min<int64_t>(16, n));
  const __mmask16 m1 = TailMask(std::max<int64_t>(0, n - 16));
  const __m512 v0 = _mm512_maskz_loadu_ps(m0, x);
  const __m512 v1 = _mm512_maskz_loadu_ps(m1, x + 16);
  const uint32_t bits = _mm512_reduce_max_epu32(_mm512_max_epu32(AbsBits16(v0), AbsBits16(v1)));
  const uint8_t code = MxScaleCode(AmaxFromBits(bits));
  const __m512 s = _mm512_set1_ps(MxDataScale(code));
  Store8(out, E4m3Nearest16(_mm512_mul_ps(v0, s)), m0);
  Store8(out + 16, E4m3Nearest16(_mm512_mul_ps(v1, s)), m1);
  return code;
}

PARAMD_AVX512 void MxRow(const float* x, int64_t n, uint8_t* out, uint8_t* codes) {
  for (int64_t c0 = 0; c0 < n; c0 += 32) {
    *codes++ = MxBlock(x + c0, std::min<int64_t>(32, n - c0), out + c0);
  }
}

PARAMD_AVX512 void Bf16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtepi32_epi16(Bf16x16(_mm512_loadu_ps(x + i))));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    Store16(out + i, Bf16x16(_mm512_maskz_loadu_ps(m, x + i)), m);
  }
}

PARAMD_AVX512 void Fp16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtepi32_epi16(Encode16<kernels::Fp16>(_mm512_loadu_ps(x + i))));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    Store16(out + i, Encode16<kernels::Fp16>(_mm512_maskz_loadu_ps(m, x + i)), m);
  }
}

}  // namespace

const ServeKernels& Avx512ServeKernels() {
  static constexpr ServeKernels kKernels = {
      MaxAbsBits, ColumnMaxAbsBits, E4m3Scaled, E4m3ScaledEach, MxRow, Bf16, Fp16};
  return kKernels;
}

}  // namespace paramd::kernels::cpu_internal
