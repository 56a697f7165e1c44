// The AVX2 path of the serve recipes: 8 lanes per vector, scalar tails (the element functions of
// kernels/formats.h). The lane-wise casts repeat MiniFloat::Encode / Bf16FromFloat with the same
// integer operations after the same single FP32 multiply, as in the AVX-512 path, so the codes
// equal the scalar path's. Every compared quantity is below 2^31, so signed compares serve.
#include <immintrin.h>

#include "kernels/cpu/recipes_paths.h"

#define PARAMD_AVX2 __attribute__((target("avx2")))

namespace paramd::kernels::cpu_internal {
namespace {

PARAMD_AVX2 inline __m256i Set(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }

PARAMD_AVX2 inline __m256i AbsBits8(__m256 x) {
  return _mm256_and_si256(_mm256_castps_si256(x), Set(0x7FFFFFFFu));
}

template <typename F>
PARAMD_AVX2 inline __m256i Encode8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(bits, Set(0x7FFFFFFFu));
  const __m256i one = Set(1);
  const __m256i field = _mm256_srli_epi32(abs, 23);
  const __m256i eff = _mm256_max_epu32(field, one);
  const __m256i sig = _mm256_or_si256(_mm256_and_si256(abs, Set(0x7FFFFFu)),
                                      _mm256_slli_epi32(_mm256_min_epu32(field, one), 23));
  const __m256i normal_eff = _mm256_max_epu32(eff, Set(F::kMinNormalField));
  const __m256i below = _mm256_sub_epi32(normal_eff, eff);
  const __m256i shift = _mm256_min_epu32(_mm256_add_epi32(below, Set(F::kShift)), Set(25));
  __m256i q = _mm256_srlv_epi32(sig, shift);
  const __m256i unit = _mm256_sllv_epi32(one, shift);
  const __m256i rest = _mm256_and_si256(sig, _mm256_sub_epi32(unit, one));
  const __m256i half = _mm256_srli_epi32(unit, 1);
  const __m256i up = _mm256_cmpgt_epi32(_mm256_add_epi32(rest, _mm256_and_si256(q, one)), half);
  q = _mm256_sub_epi32(q, up);  // up is -1 where the count rounds up
  const __m256i exp_part =
      _mm256_slli_epi32(_mm256_sub_epi32(normal_eff, Set(F::kMinNormalField)), F::kManBits);
  __m256i code = _mm256_min_epu32(_mm256_add_epi32(exp_part, q), Set(F::kMaxFiniteCode));
  const __m256i sign =
      _mm256_and_si256(_mm256_srli_epi32(bits, 31 - F::kExpBits - F::kManBits), Set(F::kSignBit));
  code = _mm256_or_si256(code, sign);
  const __m256i nan = _mm256_cmpgt_epi32(abs, Set(0x7F800000u));
  return _mm256_blendv_epi8(code, Set(F::kNaNCode), nan);
}

// E4M3's nearest cast in a short form, the codes of Encode8<E4m3> (kernels/cpu/state_codec.h's
// EncodeE4m3Nearest, which says how; recipes_test checks every FP32 input of the exponents where
// its cases meet): an integer round of the bits at and above 2^-6, an FP32 add of 2^14 below.
PARAMD_AVX2 inline __m256i E4m3Nearest8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(bits, Set(0x7FFFFFFFu));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(abs, 20), Set(1));
  const __m256i normal = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(abs, Set(0x7FFFFu - (120u << 23))), lsb), 20);
  const __m256i subnormal = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(abs), _mm256_set1_ps(0x1p14f))),
      Set(141u << 23));
  __m256i code = _mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(Set(121u << 23), abs));
  code = _mm256_min_epu32(code, Set(E4m3::kMaxFiniteCode));
  code = _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(bits, 24), Set(0x80)));
  return _mm256_blendv_epi8(code, Set(E4m3::kNaNCode), _mm256_cmpgt_epi32(abs, Set(0x7F800000u)));
}

PARAMD_AVX2 inline __m256i Bf16x8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), Set(1));
  const __m256i hi =
      _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, Set(0x7FFF))), 16);
  const __m256i overflow = _mm256_cmpgt_epi32(_mm256_and_si256(hi, Set(0x7FFF)), Set(0x7F7F));
  __m256i code = _mm256_blendv_epi8(
      hi, _mm256_or_si256(_mm256_and_si256(hi, Set(0x8000)), Set(kBf16MaxPos)), overflow);
  const __m256i nan = _mm256_cmpgt_epi32(AbsBits8(x), Set(0x7F800000u));
  return _mm256_blendv_epi8(code, Set(kBf16NaN), nan);
}

// 8 codes below 2^16 (2^8) in 32-bit lanes -> 8 16-bit (8-bit) stores; the packs are exact.
PARAMD_AVX2 inline __m128i Pack16(__m256i codes) {
  return _mm_packus_epi32(_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1));
}

PARAMD_AVX2 inline void Store8(uint8_t* out, __m256i codes) {
  const __m128i w = Pack16(codes);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(w, w));
}

PARAMD_AVX2 inline uint32_t HorizontalMax(__m256i a) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

PARAMD_AVX2 uint32_t MaxAbsBits(const float* x, int64_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_max_epu32(a0, AbsBits8(_mm256_loadu_ps(x + i)));
    a1 = _mm256_max_epu32(a1, AbsBits8(_mm256_loadu_ps(x + i + 8)));
    a2 = _mm256_max_epu32(a2, AbsBits8(_mm256_loadu_ps(x + i + 16)));
    a3 = _mm256_max_epu32(a3, AbsBits8(_mm256_loadu_ps(x + i + 24)));
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_max_epu32(a0, AbsBits8(_mm256_loadu_ps(x + i)));
  uint32_t bits =
      HorizontalMax(_mm256_max_epu32(_mm256_max_epu32(a0, a1), _mm256_max_epu32(a2, a3)));
  for (; i < n; ++i) bits = std::max(bits, AbsBits(x[i]));
  return bits;
}

PARAMD_AVX2 void ColumnMaxAbsBits(const float* x, int64_t stride, int64_t nrows, int64_t n,
                                  uint32_t* acc) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + j));
    for (int64_t r = 0; r < nrows; ++r) {
      a = _mm256_max_epu32(a, AbsBits8(_mm256_loadu_ps(x + r * stride + j)));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + j), a);
  }
  for (; j < n; ++j) {
    for (int64_t r = 0; r < nrows; ++r) acc[j] = std::max(acc[j], AbsBits(x[r * stride + j]));
  }
}

PARAMD_AVX2 void E4m3Scaled(const float* x, int64_t n, float scale, uint8_t* out) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Store8(out + i, E4m3Nearest8(_mm256_mul_ps(_mm256_loadu_ps(x + i), s)));
  }
  for (; i < n; ++i) out[i] = E4m3FromFloat(x[i] * scale);
}

PARAMD_AVX2 void E4m3ScaledEach(const float* x, int64_t n, const float* scales, uint8_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Store8(out + i,
           E4m3Nearest8(_mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(scales + i))));
  }
  for (; i < n; ++i) out[i] = E4m3FromFloat(x[i] * scales[i]);
}

PARAMD_AVX2 void MxRow(const float* x, int64_t n, uint8_t* out, uint8_t* codes) {
  int64_t c0 = 0;
  for (; c0 + 32 <= n; c0 += 32) {
    __m256 v[4];
    __m256i a = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + c0 + 8 * k);
      a = _mm256_max_epu32(a, AbsBits8(v[k]));
    }
    const uint8_t code = MxScaleCode(AmaxFromBits(HorizontalMax(a)));
    const __m256 s = _mm256_set1_ps(MxDataScale(code));
    for (int k = 0; k < 4; ++k) Store8(out + c0 + 8 * k, E4m3Nearest8(_mm256_mul_ps(v[k], s)));
    *codes++ = code;
  }
  if (c0 < n) *codes = MxBlockScalar(x + c0, n - c0, out + c0);
}

PARAMD_AVX2 void Bf16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), Pack16(Bf16x8(_mm256_loadu_ps(x + i))));
  }
  for (; i < n; ++i) out[i] = Bf16FromFloat(x[i]);
}

PARAMD_AVX2 void Fp16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     Pack16(Encode8<kernels::Fp16>(_mm256_loadu_ps(x + i))));
  }
  for (; i < n; ++i) out[i] = Fp16FromFloat(x[i]);
}

}  // namespace

const ServeKernels& Avx2ServeKernels() {
  static constexpr ServeKernels kKernels = {
      MaxAbsBits, ColumnMaxAbsBits, E4m3Scaled, E4m3ScaledEach, MxRow, Bf16, Fp16};
  return kKernels;
}

}  // namespace paramd::kernels::cpu_internal
