// Internal to kernels/cpu: 8 FP32 / 32-bit lanes of AVX2 + FMA for the step pipeline
// (step_pipeline.h); the contract of each member is in vec_avx512.h. Include only from a
// translation unit compiled for AVX2, FMA and F16C (under `#pragma GCC target`), after every header
// that must stay baseline code. Predicates are full-lane masks (all ones = true).
#pragma once

#include <cstdint>

#include "kernels/philox.h"

namespace paramd::kernels::cpu_internal {

struct VecAvx2 {
  static constexpr int kLanes = 8;
  static void Fence() { _mm_sfence(); }
  static constexpr bool kCanStream = true;
  using F = __m256;
  using I = __m256i;
  using M = __m256i;

  static F LoadF(const float* p) { return _mm256_loadu_ps(p); }
  static void StoreF(float* p, F x) { _mm256_storeu_ps(p, x); }
  static void StreamF(float* p, F x) { _mm256_stream_ps(p, x); }
  static F SetF(float x) { return _mm256_set1_ps(x); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static I AsI(F x) { return _mm256_castps_si256(x); }
  static F AsF(I x) { return _mm256_castsi256_ps(x); }
  static F CvtI32ToF(I x) { return _mm256_cvtepi32_ps(x); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  // Truncating conversions of values that fit (see VecAvx512). AVX2 converts only to signed: values
  // from 2^31 on are converted less 2^31, which is then added back.
  static I TruncToI32(F x) { return _mm256_cvttps_epi32(x); }
  static I TruncToU32(F x) {
    const __m256 top = _mm256_set1_ps(0x1p31f);
    const __m256 high = _mm256_cmp_ps(x, top, _CMP_GE_OQ);
    const __m256i low = _mm256_cvttps_epi32(_mm256_sub_ps(x, _mm256_and_ps(high, top)));
    return _mm256_add_epi32(low, _mm256_slli_epi32(_mm256_castps_si256(high), 31));
  }

  // F16C's conversions (see VecAvx512).
  static constexpr bool kHasF16c = true;
  static I CvtToF16(F x) {
    return _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static F CvtFromF16(I code) { return _mm256_cvtph_ps(Pack16(code)); }
  static F LoadF16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F LoadE4m3AsF16(const uint8_t* p) {
    const __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(
        _mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(static_cast<int16_t>(0xBFFF))));
  }

  static I SetI(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  static I LoadU32(const uint32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static void StoreU32(uint32_t* p, I x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x); }
  static I LoadU16(const uint16_t* p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // Lanes hold values below 2^16, so the saturating packs are exact.
  static __m128i Pack16(I x) {
    return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  }
  static void StoreU16(uint16_t* p, I x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), Pack16(x));
  }
  static void StreamU16(uint16_t* p, I x) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), Pack16(x));
  }
  static I LoadU8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static __m128i Pack8(I x) {
    const __m128i w = Pack16(x);
    return _mm_packus_epi16(w, w);
  }
  static void StoreU8(uint8_t* p, I x) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), Pack8(x));
  }
  static void StreamU8(uint8_t* p, I x) {
    _mm_stream_si64(reinterpret_cast<long long*>(p), _mm_cvtsi128_si64(Pack8(x)));
  }

  static I And(I a, I b) { return _mm256_and_si256(a, b); }
  static I Or(I a, I b) { return _mm256_or_si256(a, b); }
  static I Xor(I a, I b) { return _mm256_xor_si256(a, b); }
  static I AddI(I a, I b) { return _mm256_add_epi32(a, b); }
  static I SubI(I a, I b) { return _mm256_sub_epi32(a, b); }
  template <int kBits>
  static I Shl(I a) {
    return _mm256_slli_epi32(a, kBits);
  }
  template <int kBits>
  static I Shr(I a) {
    return _mm256_srli_epi32(a, kBits);
  }
  static I Shlv(I a, I n) { return _mm256_sllv_epi32(a, n); }
  static I Shrv(I a, I n) { return _mm256_srlv_epi32(a, n); }
  static I MaxU(I a, I b) { return _mm256_max_epu32(a, b); }
  static I MinU(I a, I b) { return _mm256_min_epu32(a, b); }
  static M GtU(I a, I b) {
    const I flip = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    return _mm256_cmpgt_epi32(_mm256_xor_si256(a, flip), _mm256_xor_si256(b, flip));
  }
  static M GtS(I a, I b) { return _mm256_cmpgt_epi32(a, b); }
  static M Eq(I a, I b) { return _mm256_cmpeq_epi32(a, b); }
  static I Select(M m, I a, I b) { return _mm256_blendv_epi8(b, a, m); }
  static I AddOneIf(M m, I a) { return _mm256_sub_epi32(a, m); }
  static uint32_t ReduceMaxU(I a) {
    __m128i x = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    x = _mm_max_epu32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_max_epu32(x, _mm_shuffle_epi32(x, 0xB1));
    return static_cast<uint32_t>(_mm_cvtsi128_si32(x));
  }

  // 64-bit-lane helpers of PhiloxBlocks, as VecAvx512's.
  static __m256i Set64(uint32_t x) { return _mm256_set1_epi64x(x); }
  static __m256i Hi32(__m256i p) { return _mm256_srli_epi64(p, 32); }
  static __m256i Xor3(__m256i a, __m256i b, __m256i c) {
    return _mm256_xor_si256(_mm256_xor_si256(a, b), c);
  }

  // As VecAvx512::PhiloxBlocks, four counters per register, two registers per round of the loop.
  static constexpr int kPhiloxBlocks = 8;
  static void PhiloxBlocks(const PhiloxKey& key, uint32_t word1, uint32_t k, uint32_t tensor_index,
                           uint32_t block, int count, uint32_t* out) {
    uint32_t k0[kPhiloxRounds], k1[kPhiloxRounds];
    k0[0] = key[0];
    k1[0] = key[1];
    for (int r = 1; r < kPhiloxRounds; ++r) {
      k0[r] = k0[r - 1] + kPhiloxW0;
      k1[r] = k1[r - 1] + kPhiloxW1;
    }
    const uint64_t r1_p1 = uint64_t{kPhiloxM1} * k;
    const uint32_t r1_x0 = static_cast<uint32_t>(r1_p1 >> 32) ^ word1 ^ k0[0];
    const uint32_t r1_x1 = static_cast<uint32_t>(r1_p1);
    const uint64_t r2_p0 = uint64_t{kPhiloxM0} * r1_x0;
    const uint32_t r2_x3 = static_cast<uint32_t>(r2_p0);

    const __m256i m0 = _mm256_set1_epi64x(kPhiloxM0);
    const __m256i m1 = _mm256_set1_epi64x(kPhiloxM1);
    const __m256i r1_x2_xor = Set64(tensor_index ^ k1[0]);
    const __m256i r2_x0_xor = Set64(r1_x1 ^ k0[1]);
    const __m256i r2_x2_xor = Set64(static_cast<uint32_t>(r2_p0 >> 32) ^ k1[1]);
    const __m256i r3_x2_xor = Set64(r2_x3 ^ k1[2]);
    const __m256i lanes = _mm256_set_epi64x(3, 2, 1, 0);

    for (int j = 0; j < count; j += 8) {
      const __m256i base = Set64(block + static_cast<uint32_t>(j));
      __m256i x0[2], x1[2], x2[2], x3[2], p0[2], p1[2];
#pragma GCC unroll 4
      for (int h = 0; h < 2; ++h) {
        const __m256i c0 = _mm256_add_epi64(base, _mm256_add_epi64(lanes, Set64(4u * h)));
        p0[h] = _mm256_mul_epu32(c0, m0);
        x2[h] = _mm256_xor_si256(Hi32(p0[h]), r1_x2_xor);
        x3[h] = p0[h];
        p1[h] = _mm256_mul_epu32(x2[h], m1);
        x0[h] = _mm256_xor_si256(Hi32(p1[h]), r2_x0_xor);
        x1[h] = p1[h];
        x2[h] = _mm256_xor_si256(x3[h], r2_x2_xor);
        p0[h] = _mm256_mul_epu32(x0[h], m0);
        p1[h] = _mm256_mul_epu32(x2[h], m1);
        x0[h] = Xor3(Hi32(p1[h]), x1[h], Set64(k0[2]));
        x1[h] = p1[h];
        x2[h] = _mm256_xor_si256(Hi32(p0[h]), r3_x2_xor);
        x3[h] = p0[h];
      }
#pragma GCC unroll 8
      for (int r = 3; r < kPhiloxRounds; ++r) {
        const __m256i key0 = Set64(k0[r]);
        const __m256i key1 = Set64(k1[r]);
#pragma GCC unroll 4
        for (int h = 0; h < 2; ++h) {
          p0[h] = _mm256_mul_epu32(x0[h], m0);
          p1[h] = _mm256_mul_epu32(x2[h], m1);
          x0[h] = Xor3(Hi32(p1[h]), x1[h], key0);
          x1[h] = p1[h];
          x2[h] = Xor3(Hi32(p0[h]), x3[h], key1);
          x3[h] = p0[h];
        }
      }
// Words (0, 1) and (2, 3) of each block paired in its 64-bit lane, then the pairs of blocks
// 0, 1 and of blocks 2, 3 gathered.
#pragma GCC unroll 4
      for (int h = 0; h < 2; ++h) {
        const __m256i w01 = _mm256_blend_epi32(x0[h], _mm256_slli_epi64(x1[h], 32), 0xAA);
        const __m256i w23 = _mm256_blend_epi32(x2[h], _mm256_slli_epi64(x3[h], 32), 0xAA);
        const __m256i even = _mm256_unpacklo_epi64(w01, w23);  // blocks 0 and 2
        const __m256i odd = _mm256_unpackhi_epi64(w01, w23);   // blocks 1 and 3
        StoreU32(out + 4 * j + 16 * h, _mm256_permute2x128_si256(even, odd, 0x20));
        StoreU32(out + 4 * j + 16 * h + 8, _mm256_permute2x128_si256(even, odd, 0x31));
      }
    }
  }
};

}  // namespace paramd::kernels::cpu_internal
