// Internal to kernels/cpu: the one-lane "vector" the portable path instantiates the step pipeline
// (step_pipeline.h) with. Every operation is the plain scalar one; variable shifts by 32 or more
// give 0, as the AVX2/AVX-512 instructions do. See vec_avx512.h for the contract of each member.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/philox.h"

namespace paramd::kernels::cpu_internal {

struct VecScalar {
  static constexpr int kLanes = 1;
  static void Fence() {}
  static constexpr bool kCanStream = false;
  using F = float;
  using I = uint32_t;
  using M = bool;

  static F LoadF(const float* p) { return *p; }
  static void StoreF(float* p, F x) { *p = x; }
  static void StreamF(float* p, F x) { *p = x; }
  static F SetF(float x) { return x; }
  static F Add(F a, F b) { return a + b; }
  static F Mul(F a, F b) { return a * b; }
  static F Div(F a, F b) { return a / b; }
  static F Sqrt(F a) { return std::sqrt(a); }
  static F Fma(F a, F b, F c) { return std::fma(a, b, c); }
  static I AsI(F x) { return std::bit_cast<uint32_t>(x); }
  static F AsF(I x) { return std::bit_cast<float>(x); }
  static F CvtI32ToF(I x) { return static_cast<float>(static_cast<int32_t>(x)); }
  static F Sub(F a, F b) { return a - b; }
  // Truncating conversions: values that do not fit (NaN included) give what x86's give, 2^31
  // and 2^32 - 1, where a C++ conversion would be undefined (callers compute lanes they discard).
  static I TruncToI32(F x) {
    return x > -0x1p31f && x < 0x1p31f ? static_cast<uint32_t>(static_cast<int32_t>(x))
                                       : 0x80000000u;
  }
  static I TruncToU32(F x) {
    return x > -1.0f && x < 0x1p32f ? static_cast<uint32_t>(x) : 0xFFFFFFFFu;
  }

  // No hardware FP16 conversions: state_codec.h casts in integer operations.
  static constexpr bool kHasF16c = false;

  static I SetI(uint32_t x) { return x; }
  static I LoadU32(const uint32_t* p) { return *p; }
  static void StoreU32(uint32_t* p, I x) { *p = x; }
  static I LoadU16(const uint16_t* p) { return *p; }
  static void StoreU16(uint16_t* p, I x) { *p = static_cast<uint16_t>(x); }
  static void StreamU16(uint16_t* p, I x) { *p = static_cast<uint16_t>(x); }
  static I LoadU8(const uint8_t* p) { return *p; }
  static void StoreU8(uint8_t* p, I x) { *p = static_cast<uint8_t>(x); }
  static void StreamU8(uint8_t* p, I x) { *p = static_cast<uint8_t>(x); }

  static I And(I a, I b) { return a & b; }
  static I Or(I a, I b) { return a | b; }
  static I Xor(I a, I b) { return a ^ b; }
  static I AddI(I a, I b) { return a + b; }
  static I SubI(I a, I b) { return a - b; }
  template <int kBits>
  static I Shl(I a) {
    return a << kBits;
  }
  template <int kBits>
  static I Shr(I a) {
    return a >> kBits;
  }
  static I Shlv(I a, I n) { return n > 31 ? 0 : a << n; }
  static I Shrv(I a, I n) { return n > 31 ? 0 : a >> n; }
  static I MaxU(I a, I b) { return a > b ? a : b; }
  static I MinU(I a, I b) { return a < b ? a : b; }
  static M GtU(I a, I b) { return a > b; }
  static M GtS(I a, I b) { return static_cast<int32_t>(a) > static_cast<int32_t>(b); }
  static M Eq(I a, I b) { return a == b; }
  static I Select(M m, I a, I b) { return m ? a : b; }
  static I AddOneIf(M m, I a) { return m ? a + 1 : a; }
  static uint32_t ReduceMaxU(I a) { return a; }

  // As VecAvx512::PhiloxBlocks, one block at a time.
  static constexpr int kPhiloxBlocks = 1;
  static void PhiloxBlocks(const PhiloxKey& key, uint32_t word1, uint32_t k, uint32_t tensor_index,
                           uint32_t block, int count, uint32_t* out) {
    for (int j = 0; j < count; ++j) {
      const PhiloxCounter r =
          Philox4x32_10({block + static_cast<uint32_t>(j), word1, k, tensor_index}, key);
      for (int w = 0; w < 4; ++w) out[4 * j + w] = r[w];
    }
  }
};

}  // namespace paramd::kernels::cpu_internal
