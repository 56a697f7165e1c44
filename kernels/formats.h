// Element formats and scales (DESIGN.md §3), as scalar functions on the bits: the one definition
// every CPU path, the GPU and the tests use. Casts round to nearest even and saturate to the
// largest finite value (infinities too); NaN becomes the positive NaN code; subnormals are kept.
// Hardware converts are not used: they overflow to inf or flush subnormals. Everything here is
// integer arithmetic on the bits except the one FP32 division of the fp8_tensor scale, so the
// vector paths (kernels/cpu/recipes_avx*.cc) can repeat it lane by lane and give the same codes.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#include "kernels/cast.h"
#include "kernels/hd.h"

namespace paramd::kernels {

// 2^e as an FP32, exactly, for e in [-149, 127] (subnormals included).
PARAMD_HD constexpr float Pow2(int e) {
  return e >= -126 ? std::bit_cast<float>(static_cast<uint32_t>(e + 127) << 23)
                   : std::bit_cast<float>(1u << (e + 149));
}

// One IEEE-like binary format of at most 16 bits: sign, kExp exponent bits, kMan mantissa bits,
// largest finite magnitude code kMaxFinite, the one NaN code the casts produce kNaN.
template <int kExp, int kMan, uint32_t kMaxFinite, uint32_t kNaN>
struct MiniFloat {
  static constexpr int kExpBits = kExp;
  static constexpr int kManBits = kMan;
  static constexpr uint32_t kMaxFiniteCode = kMaxFinite;
  static constexpr uint32_t kNaNCode = kNaN;
  static constexpr int kBias = (1 << (kExp - 1)) - 1;
  static constexpr uint32_t kShift = 23 - kMan;  // FP32 mantissa bits dropped from a normal
  // The FP32 exponent field of this format's smallest normal, 2^(1 - kBias).
  static constexpr uint32_t kMinNormalField = 128 - kBias;
  static constexpr uint32_t kSignBit = 1u << (kExp + kMan);

  // FP32 -> code, in integers. With sig the 24-bit significand (leading bit included; FP32
  // subnormals have none and the exponent of field 1), the value is sig * 2^(field - 150). Its
  // count of target steps at its own exponent (at the smallest normal's exponent when it is
  // below it) is sig >> shift, rounded to nearest even on the bits shifted out. A subnormal target
  // code is that count; a normal one adds the exponent above the smallest normal, and a carry out
  // of the mantissa correctly bumps the exponent. Codes past kMaxFinite saturate.
  PARAMD_HD static constexpr uint32_t Encode(float x) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    const uint32_t abs = bits & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) return kNaN;
    const uint32_t field = abs >> 23;
    const uint32_t eff = field != 0 ? field : 1u;
    const uint32_t sig = (abs & 0x7FFFFFu) | (field != 0 ? 0x800000u : 0u);
    // Shifts beyond 25 give the same result as 25 (sig < 2^24 rounds to 0), and stay in range.
    const uint32_t shift =
        std::min(kShift + (eff < kMinNormalField ? kMinNormalField - eff : 0u), 25u);
    uint32_t q = sig >> shift;
    const uint32_t rest = sig & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
    const uint32_t code = (eff > kMinNormalField ? (eff - kMinNormalField) << kMan : 0u) + q;
    return ((bits >> 31) != 0 ? kSignBit : 0u) | std::min(code, kMaxFinite);
  }

  // Code -> FP32 (exact). Codes beyond the largest finite decode to infinity where the format has
  // one (all-ones exponent, zero mantissa: E5M2, FP16), else NaN; the casts never produce them.
  PARAMD_HD static constexpr float Decode(uint32_t code) {
    const uint32_t sign = (code >> (kExp + kMan)) & 1u;
    const uint32_t abs = code & (kSignBit - 1u);
    const uint32_t exp = abs >> kMan;
    const uint32_t mant = abs & ((1u << kMan) - 1u);
    if (abs > kMaxFinite) {
      const bool has_inf = (kMaxFinite >> kMan) < (1u << kExp) - 1u;
      const float inf = std::bit_cast<float>(0x7F800000u | (sign << 31));
      return has_inf && mant == 0 ? inf : std::bit_cast<float>(0x7FC00000u | (sign << 31));
    }
    const float value = exp == 0 ? static_cast<float>(mant) * Pow2(1 - kBias - kMan)
                                 : static_cast<float>((1u << kMan) | mant) *
                                       Pow2(static_cast<int>(exp) - kBias - kMan);
    return sign ? -value : value;
  }

  // Kept for callers of the first version of this header.
  PARAMD_HD static constexpr float Pow2(int e) { return paramd::kernels::Pow2(e); }
};

// FP8 E4M3 (no infinities; 0x7F/0xFF are NaN; max 448 = 0x7E), FP8 E5M2 (max 57344 = 0x7B; NaN
// 0x7F as cuda_fp8.h produces), FP16 (max 65504 = 0x7BFF; NaN 0x7FFF).
using E4m3 = MiniFloat<4, 3, 0x7Eu, 0x7Fu>;
using E5m2 = MiniFloat<5, 2, 0x7Bu, 0x7Fu>;
using Fp16 = MiniFloat<5, 10, 0x7BFFu, 0x7FFFu>;

inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kE5m2Max = 57344.0f;
inline constexpr float kFp16Max = 65504.0f;

PARAMD_HD constexpr uint8_t E4m3FromFloat(float x) { return static_cast<uint8_t>(E4m3::Encode(x)); }
PARAMD_HD constexpr uint8_t E5m2FromFloat(float x) { return static_cast<uint8_t>(E5m2::Encode(x)); }
PARAMD_HD constexpr uint16_t Fp16FromFloat(float x) {
  return static_cast<uint16_t>(Fp16::Encode(x));
}
PARAMD_HD constexpr float FloatFromE4m3(uint8_t code) { return E4m3::Decode(code); }
PARAMD_HD constexpr float FloatFromE5m2(uint8_t code) { return E5m2::Decode(code); }
PARAMD_HD constexpr float FloatFromFp16(uint16_t code) { return Fp16::Decode(code); }

// ---- amax ----------------------------------------------------------------------------------

// The magnitude bits of x. As unsigned integers these order like the magnitudes, and every NaN
// lies above +inf, so the integer max over a set is its amax with NaN winning — the same whatever
// the order, unlike a floating-point max (which drops or keeps NaN depending on the operand).
PARAMD_HD constexpr uint32_t AbsBits(float x) { return std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu; }

inline constexpr uint32_t kCanonicalNaNBits = 0x7FC00000u;

// The amax an integer max of AbsBits stands for: that magnitude, or the positive quiet NaN.
PARAMD_HD constexpr float AmaxFromBits(uint32_t max_abs_bits) {
  // uint32_t{...}: a copy, so device code does not need the constant's address.
  return std::bit_cast<float>(max_abs_bits > 0x7F800000u ? uint32_t{kCanonicalNaNBits}
                                                         : max_abs_bits);
}

// The amax of two amaxes (or values): NaN if either is NaN, else the larger magnitude, inf
// included. Commutative and associative, so partial amaxes combine in any order (DESIGN.md §3).
PARAMD_HD constexpr float AmaxCombine(float a, float b) {
  return AmaxFromBits(std::max(AbsBits(a), AbsBits(b)));
}

// ---- scales --------------------------------------------------------------------------------

// Every FP32 scale of DESIGN.md §3 is clamped to [2^-126, 2^126] (mxfp8's E8M0 codes excepted).
inline constexpr float kMinScale = Pow2(-126);
inline constexpr float kMaxScale = Pow2(126);

// The binary exponent of a positive finite float, subnormals included: floor(log2(a)).
PARAMD_HD constexpr int Exponent(float a) {
  const uint32_t bits = std::bit_cast<uint32_t>(a);
  const int field = static_cast<int>(bits >> 23);
  if (field != 0) return field - 127;
  return -127 - std::countl_zero(bits << 9);  // subnormal: -149 + index of the top set bit
}

// a / 2^Exponent(a) as 23 mantissa bits (the leading 1 dropped), subnormals normalized.
PARAMD_HD constexpr uint32_t Significand(float a) {
  const uint32_t bits = std::bit_cast<uint32_t>(a);
  if ((bits >> 23) != 0) return bits & 0x7FFFFFu;
  const int lead = std::countl_zero(bits << 9) + 1;  // shift that brings the top bit to bit 23
  return (bits << lead) & 0x7FFFFFu;
}

// pow2(amax, top): the largest power of two s with s * amax <= top (in exact arithmetic), clamped
// to [2^-126, 2^126]; amax 0, inf or NaN gives 1. The sign of amax is ignored. `top` is a
// positive normal float (448, 32768). With amax = a * 2^ea and top = t * 2^et (a, t in [1, 2)),
// s = 2^(et - ea), halved when a > t.
PARAMD_HD constexpr float Pow2Scale(float amax, float top) {
  const uint32_t bits = AbsBits(amax);
  if (bits == 0 || bits >= 0x7F800000u) return 1.0f;
  const float a = std::bit_cast<float>(bits);
  int e = Exponent(top) - Exponent(a);
  if (Significand(a) > Significand(top)) --e;
  return Pow2(std::clamp(e, -126, 126));
}

// A per-tensor scale `top / amax`, as one IEEE FP32 division, clamped to [2^-126, 2^126]; amax 0
// or non-finite keeps `prev_scale` (DESIGN.md §3; fp8_tensor uses top = 448, fp8_delayed
// 448 / 2^margin). The sign of amax is ignored.
PARAMD_HD constexpr float ScaleFromAmax(float amax, float top, float prev_scale) {
  const uint32_t bits = AbsBits(amax);
  if (bits == 0 || bits >= 0x7F800000u) return prev_scale;
  return std::clamp(top / std::bit_cast<float>(bits), float{kMinScale}, float{kMaxScale});
}

// fp8_tensor's scale: 448 / amax by ScaleFromAmax's rule (the previous scale is 1 at first).
PARAMD_HD constexpr float Fp8TensorScale(float amax, float prev_scale) {
  return ScaleFromAmax(amax, kE4m3Max, prev_scale);
}

// The scale_inv stored next to scaled data: 1 / scale, one FP32 division (exact for powers of
// two).
PARAMD_HD constexpr float ScaleInv(float scale) { return 1.0f / scale; }

// MXFP8 block scale as an E8M0 code: e is the smallest integer with amax <= 448 * 2^e, code
// e + 127 clamped to [0, 254]; amax 0 gives 127; amax inf or NaN gives 255. With amax = a * 2^ea
// and 448 = 1.75 * 2^8: e = ea - 8, plus one when a > 1.75.
inline constexpr uint8_t kE8m0NaN = 255;
PARAMD_HD constexpr uint8_t MxScaleCode(float amax) {
  const uint32_t bits = AbsBits(amax);
  if (bits >= 0x7F800000u) return kE8m0NaN;
  if (bits == 0) return 127;
  const float a = std::bit_cast<float>(bits);
  int e = Exponent(a) - 8;
  if (Significand(a) > Significand(kE4m3Max)) ++e;
  return static_cast<uint8_t>(std::clamp(e + 127, 0, 254));
}

// The factor data is multiplied by before the cast for an E8M0 code: 2^(127 - code); 1 for the
// NaN code (data cast as is).
PARAMD_HD constexpr float MxDataScale(uint8_t code) {
  return code == kE8m0NaN ? 1.0f : Pow2(127 - static_cast<int>(code));
}

// The value an E8M0 code stands for, 2^(code - 127); NaN for 255.
PARAMD_HD constexpr float FloatFromE8m0(uint8_t code) {
  return code == kE8m0NaN ? std::bit_cast<float>(kCanonicalNaNBits)
                          : Pow2(static_cast<int>(code) - 127);
}

// ---- bf16+remainder master (TransformerEngine's split, DESIGN.md §3) -------------------------

// An FP32 master held as the BF16 it serves plus the signed low half that makes it exact.
struct Bf16Split {
  uint16_t served;    // BF16 code served to trainers
  int16_t remainder;  // the master's low 16 bits, as a signed integer
};

// hi, lo = the high and low halves of the master's bits; served = hi + 1 (16-bit wraparound) when
// lo >= 0x8000, else hi: round to nearest with ties away from zero, the one exception to
// nearest-even. Outside the cast rules on purpose, and reversible for every bit pattern: masters
// at or above 0x7F7F8000 in magnitude (within 2^-9 of FLT_MAX, relatively) serve +-inf, and a NaN
// whose high half is 0x7FFF or 0xFFFF with lo >= 0x8000 serves -0 or +0 (every other NaN serves a
// NaN code). Initial weights are checked finite and below 2^127 at upload, so a step does not
// reach these edges in practice.
PARAMD_HD constexpr Bf16Split SplitBf16Remainder(float master) {
  const uint32_t bits = std::bit_cast<uint32_t>(master);
  const uint16_t hi = static_cast<uint16_t>(bits >> 16);
  const uint16_t lo = static_cast<uint16_t>(bits);
  return {static_cast<uint16_t>(hi + (lo >= 0x8000u ? 1u : 0u)), std::bit_cast<int16_t>(lo)};
}

// The inverse: hi = served - (remainder < 0) (16-bit wraparound), bits = hi << 16 | remainder.
PARAMD_HD constexpr float MergeBf16Remainder(uint16_t served, int16_t remainder) {
  const uint16_t hi = static_cast<uint16_t>(served - (remainder < 0 ? 1u : 0u));
  return std::bit_cast<float>(static_cast<uint32_t>(hi) << 16 | std::bit_cast<uint16_t>(remainder));
}

}  // namespace paramd::kernels
