// Scalar element casts (DESIGN.md §3), written out in integer arithmetic on the bits so that every
// CPU path and the GPU produce the same codes. Hardware converts (AVX-512 BF16, F16C) overflow to
// inf or flush subnormals, so they are not used.
#pragma once

#include <bit>
#include <cstdint>

#include "kernels/hd.h"

namespace paramd::kernels {

// Bit patterns the BF16 cast produces at its edges.
inline constexpr uint16_t kBf16NaN = 0x7FFF;     // every NaN input, whatever its sign or payload
inline constexpr uint16_t kBf16MaxPos = 0x7F7F;  // largest finite; +inf and overflow saturate here
inline constexpr uint16_t kBf16MaxNeg = 0xFF7F;  // -largest finite; -inf and overflow saturate here

// FP32 -> BF16: round to nearest, ties to even; results beyond the largest finite BF16 (infinities
// included) saturate to it with the input's sign; NaN -> 0x7FFF; subnormals are kept (a subnormal
// FP32 rounds to the nearest subnormal BF16, possibly zero).
PARAMD_HD constexpr uint16_t Bf16FromFloat(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return kBf16NaN;
  // Adding 0x7FFF plus the lowest kept bit rounds the discarded 16 bits to nearest even; a carry
  // out of the mantissa correctly bumps the exponent. The sign bit never receives a carry.
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  const uint16_t hi = static_cast<uint16_t>(rounded >> 16);
  if ((hi & 0x7FFFu) >= 0x7F80u) return (hi & 0x8000u) ? kBf16MaxNeg : kBf16MaxPos;
  return hi;
}

// BF16 -> FP32 is exact: the BF16 bits are the top half of the FP32 bits.
PARAMD_HD constexpr float FloatFromBf16(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

}  // namespace paramd::kernels
