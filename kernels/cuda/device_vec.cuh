// Internal to kernels/cuda (device code only): the one-lane "vector" that instantiates the CPU's
// cast templates (kernels/cpu/state_codec.h) on the GPU, so stochastic rounding and the decodes
// are the very code the CPU paths run; and the element casts the kernels call.
//
// Nearest-even casts. With PARAMD_CUDA_HW_CASTS (the default), E4M3, FP16 and BF16 codes come
// from the hardware's saturating converts (cvt.rn.satfinite.{e4m3x2,f16,bf16}.f32): round to
// nearest even, saturate to the largest finite value (infinities too), keep subnormals, NaN ->
// the positive NaN code (0x7F, 0x7FFF) — DESIGN.md §3's rules, which the converts WITHOUT
// .satfinite break (they overflow to inf). tests/gpu/cuda_casts_test.cc checks them against
// kernels/formats.h on every one of the 2^32 FP32 bit patterns on the GPU. Without the macro the
// kernels call kernels/formats.h's integer casts (the same codes, more instructions).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cast.h"
#include "kernels/cpu/state_codec.h"
#include "kernels/formats.h"
#include "kernels/philox.h"

#ifndef PARAMD_CUDA_HW_CASTS
#define PARAMD_CUDA_HW_CASTS 1
#endif

namespace paramd::kernels::cuda_internal {

// The operations state_codec.h's templates use, on one lane, with explicit IEEE rounding (the
// build also passes --fmad=false -ftz=false -prec-div=true -prec-sqrt=true). Variable shifts by
// 32 or more give 0, as on the CPU.
struct VecCuda {
  static constexpr int kLanes = 1;
  using F = float;
  using I = uint32_t;
  using M = bool;

  static __device__ __forceinline__ F SetF(float x) { return x; }
  static __device__ __forceinline__ F Add(F a, F b) { return __fadd_rn(a, b); }
  static __device__ __forceinline__ F Mul(F a, F b) { return __fmul_rn(a, b); }
  static __device__ __forceinline__ F Div(F a, F b) { return __fdiv_rn(a, b); }
  static __device__ __forceinline__ F Sqrt(F a) { return __fsqrt_rn(a); }
  static __device__ __forceinline__ F Fma(F a, F b, F c) { return __fmaf_rn(a, b, c); }
  static __device__ __forceinline__ I AsI(F x) { return __float_as_uint(x); }
  static __device__ __forceinline__ F AsF(I x) { return __uint_as_float(x); }
  static __device__ __forceinline__ F CvtI32ToF(I x) { return __int2float_rn(static_cast<int>(x)); }
  static __device__ __forceinline__ I SetI(uint32_t x) { return x; }
  static __device__ __forceinline__ I And(I a, I b) { return a & b; }
  static __device__ __forceinline__ I Or(I a, I b) { return a | b; }
  static __device__ __forceinline__ I Xor(I a, I b) { return a ^ b; }
  static __device__ __forceinline__ I AddI(I a, I b) { return a + b; }
  static __device__ __forceinline__ I SubI(I a, I b) { return a - b; }
  template <int kBits>
  static __device__ __forceinline__ I Shl(I a) {
    return a << kBits;
  }
  template <int kBits>
  static __device__ __forceinline__ I Shr(I a) {
    return a >> kBits;
  }
  static __device__ __forceinline__ I Shlv(I a, I n) { return n > 31 ? 0u : a << n; }
  static __device__ __forceinline__ I Shrv(I a, I n) { return n > 31 ? 0u : a >> n; }
  static __device__ __forceinline__ I MaxU(I a, I b) { return a > b ? a : b; }
  static __device__ __forceinline__ I MinU(I a, I b) { return a < b ? a : b; }
  static __device__ __forceinline__ M GtU(I a, I b) { return a > b; }
  static __device__ __forceinline__ M GtS(I a, I b) {
    return static_cast<int32_t>(a) > static_cast<int32_t>(b);
  }
  static __device__ __forceinline__ M Eq(I a, I b) { return a == b; }
  static __device__ __forceinline__ I Select(M m, I a, I b) { return m ? a : b; }
  static __device__ __forceinline__ I AddOneIf(M m, I a) { return m ? a + 1u : a; }
};

using cpu_internal::Bf16Format;
using cpu_internal::E4m3Format;
using cpu_internal::Fp16Format;

// ---- nearest-even casts ----------------------------------------------------------------------

__device__ __forceinline__ uint32_t SwE4m3(float x) { return E4m3FromFloat(x); }
__device__ __forceinline__ uint32_t SwFp16(float x) { return Fp16FromFloat(x); }
__device__ __forceinline__ uint32_t SwBf16(float x) { return Bf16FromFloat(x); }

// Two E4M3 codes, a in the low byte, b in the high byte.
__device__ __forceinline__ uint32_t HwE4m3x2(float a, float b) {
  uint16_t out;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(b), "f"(a));
  return out;
}
__device__ __forceinline__ uint32_t HwFp16(float x) {
  uint16_t out;
  asm("cvt.rn.satfinite.f16.f32 %0, %1;" : "=h"(out) : "f"(x));
  return out;
}
__device__ __forceinline__ uint32_t HwBf16(float x) {
  uint16_t out;
  asm("cvt.rn.satfinite.bf16.f32 %0, %1;" : "=h"(out) : "f"(x));
  return out;
}

// Four E4M3 codes packed little-endian (x0 in the lowest byte).
__device__ __forceinline__ uint32_t E4m3x4(float x0, float x1, float x2, float x3) {
#if PARAMD_CUDA_HW_CASTS
  return HwE4m3x2(x0, x1) | (HwE4m3x2(x2, x3) << 16);
#else
  return SwE4m3(x0) | (SwE4m3(x1) << 8) | (SwE4m3(x2) << 16) | (SwE4m3(x3) << 24);
#endif
}
__device__ __forceinline__ uint32_t E4m3(float x) {
#if PARAMD_CUDA_HW_CASTS
  return HwE4m3x2(x, 0.0f) & 0xFFu;
#else
  return SwE4m3(x);
#endif
}
__device__ __forceinline__ uint32_t Fp16(float x) {
#if PARAMD_CUDA_HW_CASTS
  return HwFp16(x);
#else
  return SwFp16(x);
#endif
}
__device__ __forceinline__ uint32_t Bf16(float x) {
#if PARAMD_CUDA_HW_CASTS
  return HwBf16(x);
#else
  return SwBf16(x);
#endif
}

// ---- decodes ---------------------------------------------------------------------------------

// Exact decodes of kernels/formats.h (NaN codes give the quiet NaN of their sign): state_codec.h's
// branch-free forms on one lane.
__device__ __forceinline__ float DecodeE4m3(uint32_t code) {
  return cpu_internal::DecodeE4m3<VecCuda>(code);
}
__device__ __forceinline__ float DecodeFp16(uint32_t code) {
  return cpu_internal::DecodeFp16<VecCuda>(code);
}
__device__ __forceinline__ float DecodeBf16(uint32_t code) { return __uint_as_float(code << 16); }

// Decodes of moment codes that are multiplied by their chunk's 1 / s next: with hardware casts the
// converts (cvt.f32.f16, cvt.rn.f16x2.e4m3x2), exact for every code that is not NaN. A NaN code
// decodes to a NaN of another payload, and the multiply that follows makes every NaN the GPU's
// canonical one either way.
__device__ __forceinline__ float DecodeFp16Moment(uint32_t code) {
#if PARAMD_CUDA_HW_CASTS
  return __half2float(__ushort_as_half(static_cast<unsigned short>(code)));
#else
  return DecodeFp16(code);
#endif
}
// Two E4M3 codes (the low byte first) -> two floats.
__device__ __forceinline__ void DecodeE4m3x2Moment(uint32_t codes, float* lo, float* hi) {
#if PARAMD_CUDA_HW_CASTS
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<uint16_t>(codes)));
  *lo = __half2float(__ushort_as_half(static_cast<unsigned short>(h2 & 0xFFFFu)));
  *hi = __half2float(__ushort_as_half(static_cast<unsigned short>(h2 >> 16)));
#else
  *lo = DecodeE4m3(codes & 0xFFu);
  *hi = DecodeE4m3((codes >> 8) & 0xFFu);
#endif
}

// ---- states: one moment value -> code, nearest or stochastic with the random word r ----------

template <class Fmt>
__device__ __forceinline__ uint32_t EncodeStochastic(float y, uint32_t r) {
  return cpu_internal::Encode<VecCuda, Fmt, true>(y, r);
}

// ---- scales: fast paths for normal amaxes ---------------------------------------------------
//
// Each computes kernels/formats.h's definition in a few integer operations when amax is a normal
// float, and calls the definition itself otherwise (zero, subnormal, inf, NaN: rare in a step).
// tests/gpu/cuda_casts_test.cc checks them against formats.h on all 2^32 inputs.

// Whether the magnitude bits are those of a normal float (biased exponent 1..254).
__device__ __forceinline__ bool NormalBits(uint32_t abs_bits) {
  return abs_bits - 0x00800000u < 0x7F000000u;
}

// Pow2Scale(amax, top) for a finite `top` >= 4 (448 and 32768 here). For normal amax, top's bits
// minus amax's bits, shifted arithmetically by 23, is exactly the exponent difference minus one
// when amax's significand exceeds top's (the subtraction then borrows from the exponent field):
// formats.h's e. With top >= 4 and amax < 2^128, e >= -126, so only the upper clamp can bind.
__device__ __forceinline__ float Pow2ScaleNormalDev(uint32_t abs_bits, float top) {
  const int e = min(static_cast<int>(__float_as_uint(top) - abs_bits) >> 23, 126);
  return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
}
__device__ __forceinline__ float Pow2ScaleDev(float amax, float top) {
  const uint32_t bits = __float_as_uint(amax) & 0x7FFFFFFFu;
  if (!NormalBits(bits)) return Pow2Scale(amax, top);
  return Pow2ScaleNormalDev(bits, top);
}

// MxScaleCode for a normal amax: e + 127 = field - 8, plus one when the significand is above 448's
// (1.75, mantissa 0x600000). Adding 0x1FFFFF carries into the exponent field exactly then, so the
// code is the shifted sum minus 8; at most 247, so only the lower clamp can bind.
__device__ __forceinline__ uint32_t MxScaleCodeNormalDev(uint32_t abs_bits) {
  return static_cast<uint32_t>(max(static_cast<int>((abs_bits + 0x1FFFFFu) >> 23) - 8, 0));
}
__device__ __forceinline__ uint32_t MxScaleCodeDev(float amax) {
  const uint32_t bits = __float_as_uint(amax) & 0x7FFFFFFFu;
  if (!NormalBits(bits)) return MxScaleCode(amax);
  return MxScaleCodeNormalDev(bits);
}

// MxDataScale: 2^(127 - code), whose FP32 bits are (254 - code) << 23 for codes up to 253.
__device__ __forceinline__ float MxDataScaleDev(uint32_t code) {
  if (code >= 254u) return MxDataScale(static_cast<uint8_t>(code));
  return __uint_as_float((254u - code) << 23);
}

// An mxfp8 block's E8M0 code and data scale together (MxScaleCodeDev, MxDataScaleDev): a normal
// amax gives a code of at most 247, whose scale needs no check.
__device__ __forceinline__ float MxBlockScaleDev(float amax, uint32_t* code) {
  const uint32_t bits = __float_as_uint(amax) & 0x7FFFFFFFu;
  if (!NormalBits(bits)) {
    *code = MxScaleCode(amax);
    return MxDataScale(static_cast<uint8_t>(*code));
  }
  *code = MxScaleCodeNormalDev(bits);
  return __uint_as_float((254u - *code) << 23);
}

// ScaleInv (1 / scale, one IEEE division) of a power of two in [2^-126, 2^126], which every
// Pow2Scale is: the exponent field mirrored around 127, exact.
__device__ __forceinline__ float Pow2ScaleInvDev(float scale) {
  return __uint_as_float(0x7F000000u - __float_as_uint(scale));
}

// ---- small helpers ----------------------------------------------------------------------------

__device__ __forceinline__ uint32_t AbsBitsDev(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

// max(|a|, |b|), NaN (the canonical one) if either is NaN: one instruction (the absolute values
// are operand modifiers). Its bits order like AbsBitsDev's maximum, every NaN above inf, and
// AmaxFromBits of either is the same amax (DESIGN.md §3's NaN rule).
__device__ __forceinline__ float AbsMaxDev(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(fabsf(a)), "f"(fabsf(b)));
  return r;
}

__device__ __forceinline__ uint32_t WarpMaxU(uint32_t x) {
  return __reduce_max_sync(0xFFFFFFFFu, x);
}

// Global stores of the step's outputs, as st.global: generic stores (what plain C++ stores into
// these pointers compile to) may alias shared memory, so the compiler re-read every descriptor
// field kept there after each of them, and it split the 16- and 8-byte ones into 32-bit stores.
// No memory clobber: nothing in a launch reads back what these write.
__device__ __forceinline__ void StGlobal(void* p, float4 v) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w));
}
__device__ __forceinline__ void StGlobal(void* p, uint2 v) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y));
}
__device__ __forceinline__ void StGlobal(void* p, uint32_t v) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(v));
}
__device__ __forceinline__ void StGlobal(void* p, float v) {
  asm volatile("st.global.f32 [%0], %1;" ::"l"(p), "f"(v));
}
__device__ __forceinline__ void StGlobalU8(void* p, uint32_t v) {
  asm volatile("st.global.u8 [%0], %1;" ::"l"(p), "r"(v));
}

// Max over the aligned group of `width` lanes (a power of two <= 32) that holds this lane.
template <int kWidth>
__device__ __forceinline__ uint32_t GroupMaxU(uint32_t x) {
#pragma unroll
  for (int m = kWidth / 2; m >= 1; m /= 2) x = max(x, __shfl_xor_sync(0xFFFFFFFFu, x, m));
  return x;
}

// Stochastic rounding's word of `stream` for element `index` of a tensor (kernels/philox.h).
__device__ __forceinline__ uint32_t RandomWord(uint64_t seed, RoundingStream stream, uint32_t k,
                                               uint32_t tensor_index, uint64_t index) {
  return RoundingWord(RoundingKey(seed), stream, k, tensor_index, index);
}

// The words of `stream` for elements index .. index + 3 (kernels/philox.h's RoundingWords4: one
// Philox block where index is a multiple of 4).
__device__ __forceinline__ void RandomWords4(uint64_t seed, RoundingStream stream, uint32_t k,
                                             uint32_t tensor_index, uint64_t index, uint32_t* r) {
  RoundingWords4(RoundingKey(seed), stream, k, tensor_index, index, r);
}

}  // namespace paramd::kernels::cuda_internal
