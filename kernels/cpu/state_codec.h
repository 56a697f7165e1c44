// Internal to kernels/cpu: the element casts of DESIGN.md §3 written once over a vector type V
// (vec_scalar.h, vec_avx2.h, vec_avx512.h) in integer operations on the bits, so every path gives
// the same codes as the scalar casts of kernels/formats.h (nearest) and the same stochastic
// rounding everywhere. Everything here is a template on V: each path's translation unit
// instantiates its own copy under its own target.
#pragma once

#include <cstdint>

// Per-vector helpers are always inlined into their loops: as calls they cost a call per vector
// and reload every constant (measured: a third of the fp32 policy's instructions). Under nvcc the
// same templates also serve the GPU (kernels/cuda/device_vec.cuh instantiates them on one lane).
#if defined(__CUDACC__)
#define PARAMD_LANES_INLINE __host__ __device__ __forceinline__
#else
#define PARAMD_LANES_INLINE [[gnu::always_inline]] inline
// The same for a lambda's body (after its parameters).
#define PARAMD_LANES_INLINE_LAMBDA __attribute__((always_inline))
#endif

namespace paramd::kernels::cpu_internal {

// Target formats of a cast: mantissa bits, the FP32 biased exponent of the smallest normal, the
// largest finite code (magnitude), the NaN code, and where the sign bit goes.
struct E4m3Format {
  static constexpr int kMan = 3;
  static constexpr uint32_t kEminBiased = 127 - 6;
  static constexpr uint32_t kMaxFinite = 0x7E;
  static constexpr uint32_t kNaN = 0x7F;
  static constexpr int kSignShift = 7;
};
struct Fp16Format {
  static constexpr int kMan = 10;
  static constexpr uint32_t kEminBiased = 127 - 14;
  static constexpr uint32_t kMaxFinite = 0x7BFF;
  static constexpr uint32_t kNaN = 0x7FFF;
  static constexpr int kSignShift = 15;
};
struct Bf16Format {
  static constexpr int kMan = 7;
  static constexpr uint32_t kEminBiased = 1;
  static constexpr uint32_t kMaxFinite = 0x7F7F;
  static constexpr uint32_t kNaN = 0x7FFF;
  static constexpr int kSignShift = 15;
};

// FP32 -> code of Fmt, one lane per element. Let |y| = man * 2^(e - 150) (man with its implicit
// bit, e the biased exponent, 1 for subnormals) and q the number of man's low bits below the
// target's last place: q = 23 - kMan, plus the distance below the target's smallest normal
// exponent. lo = the code of |y| truncated (monotonic in the magnitude, so + 1 is the next code
// up, across exponents too); frac = floor(2^32 * (|y| - lo) / (hi - lo)) exactly, since hi - lo is
// 2^q units of man. Nearest even rounds up iff frac > 1/2, or == 1/2 with lo odd; stochastic
// rounds up iff r < frac (DESIGN.md §3). Then saturation to the largest finite code (infinities
// included), the sign, and NaN -> the positive NaN code.
template <class V, class Fmt, bool kStochastic>
PARAMD_LANES_INLINE typename V::I Encode(typename V::F y, typename V::I r) {
  using I = typename V::I;
  const I bits = V::AsI(y);
  const I mag = V::And(bits, V::SetI(0x7FFFFFFFu));
  const I efield = V::template Shr<23>(mag);
  I e, man;
  if constexpr (Fmt::kEminBiased > 1) {
    // E4M3, FP16: FP32 subnormals lie far below half the target's smallest step, so they may take
    // the implicit bit and exponent 0 like other tiny values: the result (0, never rounded up) is
    // the same, for two operations less.
    e = efield;
    man = V::Or(V::And(mag, V::SetI(0x7FFFFFu)), V::SetI(0x800000u));
  } else {
    e = V::MaxU(efield, V::SetI(1));
    man = V::Or(V::And(mag, V::SetI(0x7FFFFFu)), V::template Shl<23>(V::MinU(efield, V::SetI(1))));
  }
  const I e_eff = V::MaxU(e, V::SetI(Fmt::kEminBiased));
  const I q = V::AddI(V::SubI(e_eff, e), V::SetI(23 - Fmt::kMan));
  const I lo = V::AddI(V::template Shl<Fmt::kMan>(V::SubI(e_eff, V::SetI(Fmt::kEminBiased))),
                       V::Shrv(man, q));
  // frac: for q <= 32, man << (32 - q) keeps exactly the q bits below the last place; for q > 32
  // (all of man below it) man >> (q - 32). Each shift's count is negative, i.e. huge as unsigned,
  // where the other applies, and gives 0. Nearest needs only the first: for q > 32 frac < 2^-8
  // and never rounds up.
  const I frac_high = V::Shlv(man, V::SubI(V::SetI(32), q));
  typename V::M up;
  if constexpr (kStochastic) {
    up = V::GtU(V::Or(frac_high, V::Shrv(man, V::SubI(q, V::SetI(32)))), r);
  } else {
    up = V::GtU(frac_high, V::SubI(V::SetI(0x80000000u), V::And(lo, V::SetI(1))));
  }
  const I sign =
      V::And(V::template Shr<31 - Fmt::kSignShift>(bits), V::SetI(1u << Fmt::kSignShift));
  const I code = V::Or(V::MinU(V::AddOneIf(up, lo), V::SetI(Fmt::kMaxFinite)), sign);
  return V::Select(V::GtS(mag, V::SetI(0x7F800000u)), V::SetI(Fmt::kNaN), code);
}

// FP32 -> BF16, nearest even: the short form of Encode<V, Bf16Format, false> (same codes; the unit
// tests check). Adding 0x7FFF plus the lowest kept bit rounds the low half; a carry bumps the
// exponent; results at or past infinity saturate; NaN -> 0x7FFF.
template <class V>
PARAMD_LANES_INLINE typename V::I EncodeBf16Nearest(typename V::F y) {
  using I = typename V::I;
  const I bits = V::AsI(y);
  const I lsb = V::And(V::template Shr<16>(bits), V::SetI(1));
  I hi = V::template Shr<16>(V::AddI(bits, V::AddI(lsb, V::SetI(0x7FFF))));
  const I abs_hi = V::And(hi, V::SetI(0x7FFF));
  hi = V::Select(V::GtU(abs_hi, V::SetI(0x7F7F)), V::Or(V::Xor(hi, abs_hi), V::SetI(0x7F7F)), hi);
  const I mag = V::And(bits, V::SetI(0x7FFFFFFFu));
  return V::Select(V::GtS(mag, V::SetI(0x7F800000u)), V::SetI(0x7FFF), hi);
}

// The end of E4M3's short casts: the code rounded below E4M3's smallest normal 2^-6 or at and
// above it, picked by |y|, saturated (infinity included), signed; NaN -> 0x7F.
template <class V>
PARAMD_LANES_INLINE typename V::I E4m3Code(typename V::I bits, typename V::I mag,
                                           typename V::I subnormal, typename V::I normal) {
  using I = typename V::I;
  // Signed compares: mag is below 2^31.
  const I code = V::MinU(V::Select(V::GtS(V::SetI(121u << 23), mag), subnormal, normal),
                         V::SetI(E4m3Format::kMaxFinite));
  const I sign = V::And(V::template Shr<24>(bits), V::SetI(0x80));
  return V::Select(V::GtS(mag, V::SetI(0x7F800000u)), V::SetI(E4m3Format::kNaN), V::Or(code, sign));
}

// FP32 -> E4M3, nearest even: the short form of Encode<V, E4m3Format, false> (same codes; the unit
// tests check every FP32 input of the exponents where the two forms' cases meet). At or above
// E4M3's smallest normal 2^-6, adding 2^19 - 1 plus the lowest kept bit to the FP32 bits rounds
// off their 20 low bits (a carry bumps the exponent) and the exponent is rebiased in the same add.
// Below it, an FP32 add of 2^14, whose last place is E4M3's subnormal step 2^-9, rounds |y| to a
// multiple of the step by the FPU's nearest even and leaves the code (0 to 8, 8 the smallest
// normal) in the sum's low bits. Then saturation (infinity included), the sign, NaN -> 0x7F.
template <class V>
PARAMD_LANES_INLINE typename V::I EncodeE4m3Nearest(typename V::F y) {
  using I = typename V::I;
  const I bits = V::AsI(y);
  const I mag = V::And(bits, V::SetI(0x7FFFFFFFu));
  const I lsb = V::And(V::template Shr<20>(mag), V::SetI(1));
  const I normal =
      V::template Shr<20>(V::AddI(V::AddI(mag, V::SetI(0x7FFFFu - (120u << 23))), lsb));
  const I subnormal = V::SubI(V::AsI(V::Add(V::AsF(mag), V::SetF(0x1p14f))), V::SetI(141u << 23));
  return E4m3Code<V>(bits, mag, subnormal, normal);
}

// FP32 -> E4M3, stochastic with the word r: the short form of Encode<V, E4m3Format, true> (same
// codes; the unit tests check them against the outside reference), with no shift by a count of
// its own per lane. At or above E4M3's smallest normal 2^-6, frac is the 20 bits below the last
// place moved up 12, so r < frac iff (r >> 12) < those bits, iff adding 2^20 - 1 - (r >> 12) to
// the FP32 bits carries into the kept ones (a carry past the mantissa bumps the exponent); the
// exponent is rebiased in the same add. Below it, u = |y| / 2^-9 (the subnormal step) is exact,
// and so are its integer part (the code truncated) and its fraction, whose 2^32 multiple truncated
// is frac. Then saturation (infinity included), the sign, NaN -> 0x7F.
template <class V>
PARAMD_LANES_INLINE typename V::I EncodeE4m3Stochastic(typename V::F y, typename V::I r) {
  using I = typename V::I;
  const I bits = V::AsI(y);
  const I mag = V::And(bits, V::SetI(0x7FFFFFFFu));
  const I normal = V::template Shr<20>(V::AddI(V::AddI(mag, V::SetI(0u - (120u << 23))),
                                               V::Xor(V::template Shr<12>(r), V::SetI(0xFFFFFu))));
  const typename V::F u = V::Mul(V::AsF(mag), V::SetF(0x1p9f));
  const I whole = V::TruncToI32(u);  // below 8 where it is used
  const I frac = V::TruncToU32(V::Mul(V::Sub(u, V::CvtI32ToF(whole)), V::SetF(0x1p32f)));
  const I subnormal = V::AddOneIf(V::GtU(frac, r), whole);
  return E4m3Code<V>(bits, mag, subnormal, normal);
}

// Code -> FP32, exactly as kernels/formats.h decodes: normals by moving the fields, subnormals as
// an exact integer-to-float conversion times a power of two; NaN codes give the quiet NaN of the
// code's sign, FP16's infinity codes infinity.
template <class V>
PARAMD_LANES_INLINE typename V::F DecodeE4m3(typename V::I code) {
  using I = typename V::I;
  const I mag = V::And(code, V::SetI(0x7F));
  const I sign = V::template Shl<24>(V::And(code, V::SetI(0x80)));
  const I normal = V::AddI(V::template Shl<20>(mag), V::SetI(120u << 23));
  const I subnormal = V::AsI(V::Mul(V::CvtI32ToF(mag), V::SetF(0x1p-9f)));
  I value = V::Select(V::GtU(V::SetI(8), mag), subnormal, normal);
  value = V::Select(V::Eq(mag, V::SetI(0x7F)), V::SetI(0x7FC00000u), value);
  return V::AsF(V::Or(value, sign));
}

template <class V>
PARAMD_LANES_INLINE typename V::F DecodeFp16(typename V::I code) {
  using I = typename V::I;
  const I mag = V::And(code, V::SetI(0x7FFF));
  const I sign = V::template Shl<16>(V::And(code, V::SetI(0x8000)));
  const I normal = V::AddI(V::template Shl<13>(mag), V::SetI(112u << 23));
  const I subnormal = V::AsI(V::Mul(V::CvtI32ToF(mag), V::SetF(0x1p-24f)));
  I value = V::Select(V::GtU(V::SetI(0x400), mag), subnormal, normal);
  value = V::Select(V::Eq(mag, V::SetI(0x7C00)), V::SetI(0x7F800000u), value);
  value = V::Select(V::GtU(mag, V::SetI(0x7C00)), V::SetI(0x7FC00000u), value);
  return V::AsF(V::Or(value, sign));
}

// FP16 <-> FP32 where the path converts in hardware (V::kHasF16c: F16C, AVX-512F), else as
// Encode<V, Fp16Format, false> and DecodeFp16. The hardware rounds to nearest even and converts
// exactly, but an overflow becomes infinity and a NaN keeps its payload, where DESIGN.md §3
// saturates to the largest finite code and the codecs give one NaN per sign (0x7FFF; the quiet
// NaN of the code's sign): both fixed up after the conversion. The same codes and values as the
// integer forms (the unit tests check every code, and every FP32 input of whole exponents).
template <class V>
PARAMD_LANES_INLINE typename V::I EncodeFp16Nearest(typename V::F y) {
  using I = typename V::I;
  if constexpr (V::kHasF16c) {
    const I h = V::CvtToF16(y);
    const I mag = V::And(h, V::SetI(0x7FFF));
    const I code = V::Or(V::MinU(mag, V::SetI(Fp16Format::kMaxFinite)), V::Xor(h, mag));
    return V::Select(V::GtS(mag, V::SetI(0x7C00)), V::SetI(Fp16Format::kNaN), code);
  } else {
    return Encode<V, Fp16Format, false>(y, V::SetI(0));
  }
}

// A hardware-decoded FP16 value with its NaN made the codecs' one.
template <class V>
PARAMD_LANES_INLINE typename V::F CanonicalFp16NaN(typename V::F x) {
  using I = typename V::I;
  const I bits = V::AsI(x);
  const I mag = V::And(bits, V::SetI(0x7FFFFFFFu));
  return V::AsF(
      V::Select(V::GtS(mag, V::SetI(0x7F800000u)), V::And(bits, V::SetI(0xFFC00000u)), bits));
}

// Codes (zero-extended lanes) -> FP32, as DecodeFp16.
template <class V>
PARAMD_LANES_INLINE typename V::F DecodeFp16Codes(typename V::I code) {
  if constexpr (V::kHasF16c) {
    return CanonicalFp16NaN<V>(V::CvtFromF16(code));
  } else {
    return DecodeFp16<V>(code);
  }
}

// kLanes codes at p -> FP32, as DecodeFp16.
template <class V>
PARAMD_LANES_INLINE typename V::F LoadFp16(const uint16_t* p) {
  if constexpr (V::kHasF16c) {
    return CanonicalFp16NaN<V>(V::LoadF16(p));
  } else {
    return DecodeFp16<V>(V::LoadU16(p));
  }
}

// kLanes E4M3 codes at p -> their values times scale_inv, the same bits as DecodeE4m3 then the
// multiply. Where the path converts FP16 in hardware, the codes' fields are moved into FP16's
// (V::LoadE4m3AsF16): with E4M3's bias 7 under FP16's 15 every code, subnormals included, reads
// as its value times 2^-8 exactly, and 0x7F (NaN in E4M3, 1.875 read so) is the one magnitude
// above 448 * 2^-8. Times 256 is exact, times scale_inv rounds as the decoded value would.
template <class V>
PARAMD_LANES_INLINE typename V::F LoadE4m3(const uint8_t* p, typename V::F scale_inv) {
  if constexpr (V::kHasF16c) {
    using I = typename V::I;
    const typename V::F h = V::LoadE4m3AsF16(p);
    const I bits = V::AsI(h);
    const I mag = V::And(bits, V::SetI(0x7FFFFFFFu));
    const I value = V::AsI(V::Mul(V::Mul(h, V::SetF(256.0f)), scale_inv));
    const I nan = V::Or(V::Xor(bits, mag), V::SetI(0x7FC00000u));
    return V::AsF(V::Select(V::GtS(mag, V::SetI(0x3FE00000u)), nan, value));  // above 1.75
  } else {
    return V::Mul(DecodeE4m3<V>(V::LoadU8(p)), scale_inv);
  }
}

template <class V>
PARAMD_LANES_INLINE typename V::F DecodeBf16(typename V::I code) {
  return V::AsF(V::template Shl<16>(code));
}

// bf16+remainder (DESIGN.md §3): hi, lo = the FP32 bits' halves; served = hi + 1 when lo >= 0x8000
// (16-bit wraparound), remainder = lo as int16. Lanes hold the 16-bit patterns zero-extended.
template <class V>
PARAMD_LANES_INLINE void SplitBf16RemainderLanes(typename V::F p, typename V::I* served,
                                                 typename V::I* remainder) {
  const typename V::I bits = V::AsI(p);
  const typename V::I lo = V::And(bits, V::SetI(0xFFFF));
  *served = V::And(V::AddI(V::template Shr<16>(bits), V::template Shr<15>(lo)), V::SetI(0xFFFF));
  *remainder = lo;
}

// Reconstruction: hi = served - (remainder < 0) (16-bit wraparound, dropped by the shift), bits =
// hi << 16 | remainder.
template <class V>
PARAMD_LANES_INLINE typename V::F MergeBf16RemainderLanes(typename V::I served,
                                                          typename V::I remainder) {
  const typename V::I hi = V::SubI(served, V::template Shr<15>(remainder));
  return V::AsF(V::Or(V::template Shl<16>(hi), remainder));
}

// |x| as bits: an unsigned max of these is the amax of DESIGN.md §3 (any NaN is above every
// magnitude, infinity included).
template <class V>
PARAMD_LANES_INLINE typename V::I MagnitudeBits(typename V::F x) {
  return V::And(V::AsI(x), V::SetI(0x7FFFFFFFu));
}

}  // namespace paramd::kernels::cpu_internal
