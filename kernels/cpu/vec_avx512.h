// Internal to kernels/cpu: 16 FP32 / 32-bit lanes of AVX-512F, the widest instantiation of the step
// pipeline (step_pipeline.h). Include only from a translation unit compiled for AVX-512F (under
// `#pragma GCC target`), after every header that must stay baseline code.
//
// Contract of every vec_*.h (VecScalar, VecAvx2, VecAvx512): F holds FP32 lanes, I 32-bit lanes, M
// one predicate per lane. Loads and stores are unaligned except Stream*, whose address must be
// aligned to the bytes they write (kLanes * element size; the callers check). Integer compares
// are unsigned (GtU) or signed (GtS); Shlv/Shrv shift each lane by its own count, and a count of 32
// or more (as an unsigned number) gives 0. LoadU16/LoadU8 zero-extend; StoreU16/StoreU8 keep the
// low bits of lanes that already fit. FP operations are the IEEE ones, so every instantiation
// gives the same bits.
#pragma once

#include <cstdint>

#include "kernels/philox.h"

namespace paramd::kernels::cpu_internal {

struct VecAvx512 {
  static constexpr int kLanes = 16;
  static void Fence() { _mm_sfence(); }
  static constexpr bool kCanStream = true;
  using F = __m512;
  using I = __m512i;
  using M = __mmask16;

  static F LoadF(const float* p) { return _mm512_loadu_ps(p); }
  static void StoreF(float* p, F x) { _mm512_storeu_ps(p, x); }
  static void StreamF(float* p, F x) { _mm512_stream_ps(p, x); }
  static F SetF(float x) { return _mm512_set1_ps(x); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static I AsI(F x) { return _mm512_castps_si512(x); }
  static F AsF(I x) { return _mm512_castsi512_ps(x); }
  static F CvtI32ToF(I x) { return _mm512_cvtepi32_ps(x); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  // Truncating conversions of values that fit: [0, 2^31) and [0, 2^32).
  static I TruncToI32(F x) { return _mm512_cvttps_epi32(x); }
  static I TruncToU32(F x) { return _mm512_cvttps_epu32(x); }

  // Hardware FP16 conversions: exact, nearest even, but overflow gives infinity and NaN keeps its
  // payload (state_codec.h fixes both up). CvtToF16 gives the codes zero-extended in 32-bit
  // lanes; CvtFromF16 takes them so; LoadF16 reads kLanes codes.
  static constexpr bool kHasF16c = true;
  static I CvtToF16(F x) {
    return _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static F CvtFromF16(I code) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(code)); }
  static F LoadF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // kLanes E4M3 codes at p as FP16 (state_codec.h's LoadE4m3): each code sign-extended to 16
  // bits, its exponent and mantissa moved up under FP16's, the copy of the sign below it cleared.
  static F LoadE4m3AsF16(const uint8_t* p) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtph_ps(
        _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<int16_t>(0xBFFF))));
  }

  static I SetI(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static I LoadU32(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static void StoreU32(uint32_t* p, I x) { _mm512_storeu_si512(p, x); }
  static I LoadU16(const uint16_t* p) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void StoreU16(uint16_t* p, I x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(x));
  }
  static void StreamU16(uint16_t* p, I x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(x));
  }
  static I LoadU8(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void StoreU8(uint8_t* p, I x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(x));
  }
  static void StreamU8(uint8_t* p, I x) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(x));
  }

  static I And(I a, I b) { return _mm512_and_si512(a, b); }
  static I Or(I a, I b) { return _mm512_or_si512(a, b); }
  static I Xor(I a, I b) { return _mm512_xor_si512(a, b); }
  static I AddI(I a, I b) { return _mm512_add_epi32(a, b); }
  static I SubI(I a, I b) { return _mm512_sub_epi32(a, b); }
  template <int kBits>
  static I Shl(I a) {
    return _mm512_slli_epi32(a, kBits);
  }
  template <int kBits>
  static I Shr(I a) {
    return _mm512_srli_epi32(a, kBits);
  }
  static I Shlv(I a, I n) { return _mm512_sllv_epi32(a, n); }
  static I Shrv(I a, I n) { return _mm512_srlv_epi32(a, n); }
  static I MaxU(I a, I b) { return _mm512_max_epu32(a, b); }
  static I MinU(I a, I b) { return _mm512_min_epu32(a, b); }
  static M GtU(I a, I b) { return _mm512_cmpgt_epu32_mask(a, b); }
  static M GtS(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }
  static M Eq(I a, I b) { return _mm512_cmpeq_epi32_mask(a, b); }
  static I Select(M m, I a, I b) { return _mm512_mask_blend_epi32(m, b, a); }
  static I AddOneIf(M m, I a) { return _mm512_mask_add_epi32(a, m, a, _mm512_set1_epi32(1)); }
  static uint32_t ReduceMaxU(I a) { return _mm512_reduce_max_epu32(a); }

  // 64-bit-lane helpers of PhiloxBlocks: a 32-bit value in every lane, the high halves moved down,
  // and a three-way xor.
  static __m512i Set64(uint32_t x) { return _mm512_set1_epi64(x); }
  static __m512i Hi32(__m512i p) { return _mm512_srli_epi64(p, 32); }
  static __m512i Xor3(__m512i a, __m512i b, __m512i c) {
    return _mm512_ternarylogic_epi64(a, b, c, 0x96);
  }

  // The four words of Philox4x32-10 at the counters (block + j, word1, k, tensor_index), j <
  // count, into out[4j .. 4j + 3] (kernels/philox.h's block layout): count is a multiple of
  // kPhiloxBlocks and block + count - 1 must stay below 2^32 (a range that wraps is drawn with
  // the scalar form). Eight counters per register, one per 64-bit lane (the word in the low half,
  // whatever above it): _mm512_mul_epu32 then yields full 64-bit products. Counter words 1-3 are
  // the same for every block, so round 1 needs only the multiply of word 0 and round 2 only that
  // of word 2: 18 multiplies per 8 blocks, 32 words.
  static constexpr int kPhiloxBlocks = 16;
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

    const __m512i m0 = _mm512_set1_epi64(kPhiloxM0);
    const __m512i m1 = _mm512_set1_epi64(kPhiloxM1);
    const __m512i r1_x2_xor = Set64(tensor_index ^ k1[0]);
    const __m512i r2_x0_xor = Set64(r1_x1 ^ k0[1]);
    const __m512i r2_x2_xor = Set64(static_cast<uint32_t>(r2_p0 >> 32) ^ k1[1]);
    const __m512i r3_x2_xor = Set64(r2_x3 ^ k1[2]);
    for (int j = 0; j < count; j += kPhiloxBlocks) {
      PhiloxSets<2>(block + static_cast<uint32_t>(j), k0, k1, m0, m1, r1_x2_xor, r2_x0_xor,
                    r2_x2_xor, r3_x2_xor, out + 4 * j);
    }
  }

  // kSets registers of 8 counters each, from block `block` on: kSets x 32 words out. Two sets keep
  // the multiplier busy: it is the bottleneck, and more sets only spill registers (measured when
  // each counter gave two words: 4 sets 30 % slower).
  template <int kSets>
  static void PhiloxSets(uint32_t block, const uint32_t* k0, const uint32_t* k1, __m512i m0,
                         __m512i m1, __m512i r1_x2_xor, __m512i r2_x0_xor, __m512i r2_x2_xor,
                         __m512i r3_x2_xor, uint32_t* out) {
    const __m512i lanes = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i base = Set64(block);
    __m512i x0[kSets], x1[kSets], x2[kSets], x3[kSets], p0[kSets], p1[kSets];
#pragma GCC unroll 4
    for (int h = 0; h < kSets; ++h) {
      // Round 1: x0 = the block number, x1..x3 constant.
      const __m512i c0 = _mm512_add_epi64(base, _mm512_add_epi64(lanes, Set64(8u * h)));
      p0[h] = _mm512_mul_epu32(c0, m0);
      x2[h] = _mm512_xor_si512(Hi32(p0[h]), r1_x2_xor);
      x3[h] = p0[h];
      // Round 2: x0 and x1 constant.
      p1[h] = _mm512_mul_epu32(x2[h], m1);
      x0[h] = _mm512_xor_si512(Hi32(p1[h]), r2_x0_xor);
      x1[h] = p1[h];
      x2[h] = _mm512_xor_si512(x3[h], r2_x2_xor);
      // Round 3: x3 constant.
      p0[h] = _mm512_mul_epu32(x0[h], m0);
      p1[h] = _mm512_mul_epu32(x2[h], m1);
      x0[h] = Xor3(Hi32(p1[h]), x1[h], Set64(k0[2]));
      x1[h] = p1[h];
      x2[h] = _mm512_xor_si512(Hi32(p0[h]), r3_x2_xor);
      x3[h] = p0[h];
    }
#pragma GCC unroll 8
    for (int r = 3; r < kPhiloxRounds; ++r) {
      const __m512i key0 = Set64(k0[r]);
      const __m512i key1 = Set64(k1[r]);
#pragma GCC unroll 4
      for (int h = 0; h < kSets; ++h) {
        p0[h] = _mm512_mul_epu32(x0[h], m0);
        p1[h] = _mm512_mul_epu32(x2[h], m1);
        x0[h] = Xor3(Hi32(p1[h]), x1[h], key0);
        x1[h] = p1[h];
        x2[h] = Xor3(Hi32(p0[h]), x3[h], key1);
        x3[h] = p0[h];
      }
    }
    // Words (0, 1) and (2, 3) of each block paired in its 64-bit lane, then the pairs interleaved
    // block by block: blocks 0-3 of the register, then blocks 4-7.
    const __m512i first = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
    const __m512i second = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
#pragma GCC unroll 4
    for (int h = 0; h < kSets; ++h) {
      const __m512i w01 = _mm512_mask_blend_epi32(0xAAAA, x0[h], _mm512_slli_epi64(x1[h], 32));
      const __m512i w23 = _mm512_mask_blend_epi32(0xAAAA, x2[h], _mm512_slli_epi64(x3[h], 32));
      _mm512_storeu_si512(out + 32 * h, _mm512_permutex2var_epi64(w01, first, w23));
      _mm512_storeu_si512(out + 32 * h + 16, _mm512_permutex2var_epi64(w01, second, w23));
    }
  }
};

}  // namespace paramd::kernels::cpu_internal
