// kernels/formats.h (DESIGN.md §3) against the independent float64 model of
// reference/quantize_reference.h: every code's value, casts on boundaries and many random inputs,
// power-of-two and E8M0 scales, the per-tensor scale, amax, and the bf16+remainder split.
#include "kernels/formats.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reference/quantize_reference.h"

namespace paramd::kernels {
namespace {

using reference::Format;

float FromBits(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }

// The same value, or both NaN.
bool SameValue(float got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return Bits(got) == Bits(static_cast<float>(want));
}

// Stops a loop's failures at ten, so one bug does not print millions of lines.
class FailureBudget {
 public:
  bool Spend() { return ++spent_ <= 10; }

 private:
  int spent_ = 0;
};

template <typename Decode>
void ExpectEveryCodeDecodes(Format format, uint32_t num_codes, Decode decode) {
  FailureBudget budget;
  for (uint32_t code = 0; code < num_codes; ++code) {
    const double want = reference::DecodeRef(format, code);
    if (!SameValue(decode(code), want) && budget.Spend()) {
      ADD_FAILURE() << "code 0x" << std::hex << code << ": got " << decode(code) << ", want "
                    << want;
    }
  }
}

TEST(FormatsTest, DecodesEveryE4m3Code) {
  ExpectEveryCodeDecodes(Format::kE4m3, 256, [](uint32_t c) { return FloatFromE4m3(c); });
  EXPECT_EQ(FloatFromE4m3(0x7E), 448.0f);
  EXPECT_EQ(FloatFromE4m3(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(FloatFromE4m3(0x7F)));
  EXPECT_TRUE(std::isnan(FloatFromE4m3(0xFF)));
}

TEST(FormatsTest, DecodesEveryE5m2Code) {
  ExpectEveryCodeDecodes(Format::kE5m2, 256, [](uint32_t c) { return FloatFromE5m2(c); });
  EXPECT_EQ(FloatFromE5m2(0x7B), 57344.0f);
  EXPECT_EQ(FloatFromE5m2(0x7C), std::numeric_limits<float>::infinity());
  EXPECT_EQ(FloatFromE5m2(0x01), std::ldexp(1.0f, -16));
}

TEST(FormatsTest, DecodesEveryFp16Code) {
  ExpectEveryCodeDecodes(Format::kFp16, 65536, [](uint32_t c) { return FloatFromFp16(c); });
  EXPECT_EQ(FloatFromFp16(0x7BFF), 65504.0f);
  EXPECT_EQ(FloatFromFp16(0x0001), std::ldexp(1.0f, -24));
}

TEST(FormatsTest, DecodesEveryBf16Code) {
  ExpectEveryCodeDecodes(Format::kBf16, 65536, [](uint32_t c) { return FloatFromBf16(c); });
}

// Inputs where a cast can go wrong, for a format whose finite magnitude codes are [0, max_code]:
// every code's value, the midpoints between neighbours and the floats next to them, both signs;
// beyond the largest finite value; zeros, infinities, NaNs and FP32 subnormals.
std::vector<float> BoundaryInputs(Format format, uint32_t max_code) {
  std::vector<float> mags;
  for (uint32_t c = 0; c <= max_code; ++c) {
    const double lo = reference::DecodeRef(format, c);
    // Past the largest finite value, where the next code would be: one more step.
    const double hi = c < max_code ? reference::DecodeRef(format, c + 1)
                                   : 2 * lo - reference::DecodeRef(format, c - 1);
    const float value = static_cast<float>(lo);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: one bit more than the format
    for (const float m : {value, mid}) {
      mags.push_back(m);
      mags.push_back(std::nextafter(m, 0.0f));
      mags.push_back(std::nextafter(m, FLT_MAX));
    }
  }
  for (const uint32_t b : {0x00000000u, 0x00000001u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu,
                           0x7F800000u, 0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu}) {
    mags.push_back(FromBits(b));
  }
  std::vector<float> out;
  for (const float m : mags) {
    out.push_back(m);
    out.push_back(-m);
  }
  return out;
}

std::vector<float> RandomBitPatterns(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<float> out(n);
  for (float& x : out) x = FromBits(static_cast<uint32_t>(rng()));
  return out;
}

// Random values spread over a format's range: uniform exponent in [lo_exp, hi_exp), uniform
// significand, random sign.
std::vector<float> RandomInRange(uint64_t seed, int n, int lo_exp, int hi_exp) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> exp(lo_exp, hi_exp - 1);
  std::uniform_real_distribution<float> sig(1.0f, 2.0f);
  std::vector<float> out(n);
  for (float& x : out) x = (rng() & 1 ? -1.0f : 1.0f) * std::ldexp(sig(rng), exp(rng));
  return out;
}

template <typename Encode>
void ExpectEncodesLikeReference(Format format, uint32_t max_code, int lo_exp, int hi_exp,
                                Encode encode) {
  std::vector<float> inputs = BoundaryInputs(format, max_code);
  for (const float x : RandomBitPatterns(11, 1 << 20)) inputs.push_back(x);
  for (const float x : RandomInRange(12, 1 << 20, lo_exp, hi_exp)) inputs.push_back(x);
  FailureBudget budget;
  for (const float x : inputs) {
    const uint32_t want = reference::EncodeRef(format, x);
    if (encode(x) != want && budget.Spend()) {
      ADD_FAILURE() << "input " << x << " (0x" << std::hex << Bits(x) << "): got 0x" << encode(x)
                    << ", want 0x" << want;
    }
  }
}

TEST(FormatsTest, EncodesE4m3LikeTheReference) {
  ExpectEncodesLikeReference(Format::kE4m3, 0x7E, -12, 11,
                             [](float x) { return uint32_t{E4m3FromFloat(x)}; });
}

TEST(FormatsTest, EncodesE5m2LikeTheReference) {
  ExpectEncodesLikeReference(Format::kE5m2, 0x7B, -19, 18,
                             [](float x) { return uint32_t{E5m2FromFloat(x)}; });
}

TEST(FormatsTest, EncodesFp16LikeTheReference) {
  ExpectEncodesLikeReference(Format::kFp16, 0x7BFF, -27, 18,
                             [](float x) { return uint32_t{Fp16FromFloat(x)}; });
}

TEST(FormatsTest, EncodesBf16LikeTheReference) {
  ExpectEncodesLikeReference(Format::kBf16, 0x7F7F, -136, 128,
                             [](float x) { return uint32_t{Bf16FromFloat(x)}; });
}

TEST(FormatsTest, CastsSaturateAndSendNaNToThePositiveNaNCode) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(E4m3FromFloat(464.0f), 0x7E) << "a tie between 448 and 480 goes to even 448";
  EXPECT_EQ(E4m3FromFloat(480.0f), 0x7E) << "480 would be the NaN code: saturates";
  EXPECT_EQ(E4m3FromFloat(inf), 0x7E);
  EXPECT_EQ(E4m3FromFloat(-inf), 0xFE);
  EXPECT_EQ(E4m3FromFloat(nan), 0x7F);
  EXPECT_EQ(E4m3FromFloat(-nan), 0x7F);
  EXPECT_EQ(E4m3FromFloat(std::ldexp(1.0f, -10)), 0x00) << "half the smallest subnormal: even 0";
  EXPECT_EQ(E4m3FromFloat(std::ldexp(3.0f, -10)), 0x02) << "1.5 steps: even 2";
  EXPECT_EQ(E4m3FromFloat(-0.0f), 0x80);
  EXPECT_EQ(E5m2FromFloat(inf), 0x7B);
  EXPECT_EQ(E5m2FromFloat(61440.0f), 0x7B) << "a tie past the largest finite saturates";
  EXPECT_EQ(E5m2FromFloat(-nan), 0x7F);
  EXPECT_EQ(Fp16FromFloat(65520.0f), 0x7BFF) << "rounds to inf in IEEE: saturates here";
  EXPECT_EQ(Fp16FromFloat(-inf), 0xFBFF);
  EXPECT_EQ(Fp16FromFloat(nan), 0x7FFF);
  EXPECT_EQ(Fp16FromFloat(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(Fp16FromFloat(std::ldexp(1.0f, -24)), 0x0001);
}

// amax values that exercise every branch of the scale functions.
std::vector<float> AmaxInputs() {
  std::vector<float> out = RandomBitPatterns(21, 1 << 18);
  for (const float x : RandomInRange(22, 1 << 18, -149, 128)) out.push_back(x);
  for (const uint32_t b : {0x00000000u, 0x80000000u, 0x00000001u, 0x00800000u, 0x7F7FFFFFu,
                           0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x43E00000u /* 448 */,
                           0x43E00001u, 0x43DFFFFFu, 0x47000000u /* 32768 */, 0x47000001u}) {
    out.push_back(FromBits(b));
  }
  for (int e = -149; e <= 127; ++e) {
    for (const float m : {1.0f, 1.75f, 1.7500001f, 1.9999999f}) out.push_back(std::ldexp(m, e));
  }
  return out;
}

TEST(FormatsTest, Pow2ScaleIsTheLargestPowerOfTwoUnderTheTop) {
  FailureBudget budget;
  for (const float amax : AmaxInputs()) {
    for (const float top : {448.0f, 32768.0f}) {
      const float want = reference::Pow2ScaleRef(std::fabs(static_cast<double>(amax)), top);
      if (Bits(Pow2Scale(amax, top)) != Bits(want) && budget.Spend()) {
        ADD_FAILURE() << "amax " << amax << " top " << top << ": got " << Pow2Scale(amax, top)
                      << ", want " << want;
      }
    }
  }
  EXPECT_EQ(Pow2Scale(0.0f, 448.0f), 1.0f);
  EXPECT_EQ(Pow2Scale(std::numeric_limits<float>::quiet_NaN(), 448.0f), 1.0f);
  EXPECT_EQ(Pow2Scale(448.0f, 448.0f), 1.0f);
  EXPECT_EQ(Pow2Scale(449.0f, 448.0f), 0.5f);
  EXPECT_EQ(Pow2Scale(FromBits(1), 448.0f), std::ldexp(1.0f, 126)) << "clamped at 2^126";
}

TEST(FormatsTest, MxScaleCodeIsTheSmallestExponentThatFits) {
  FailureBudget budget;
  for (const float amax : AmaxInputs()) {
    const uint8_t want = reference::MxScaleCodeRef(std::fabs(static_cast<double>(amax)));
    if (MxScaleCode(amax) != want && budget.Spend()) {
      ADD_FAILURE() << "amax " << amax << ": got " << int{MxScaleCode(amax)} << ", want "
                    << int{want};
    }
  }
  EXPECT_EQ(MxScaleCode(0.0f), 127);
  EXPECT_EQ(MxScaleCode(448.0f), 127);
  EXPECT_EQ(MxScaleCode(449.0f), 128);
  EXPECT_EQ(MxScaleCode(std::numeric_limits<float>::infinity()), 255);
  EXPECT_EQ(MxScaleCode(FromBits(1)), 0) << "clamped at code 0";
  EXPECT_EQ(MxDataScale(255), 1.0f);
  EXPECT_EQ(MxDataScale(0), std::ldexp(1.0f, 127));
  EXPECT_EQ(FloatFromE8m0(130), 8.0f);
  EXPECT_TRUE(std::isnan(FloatFromE8m0(255)));
}

TEST(FormatsTest, Fp8TensorScaleIsOneDivisionClampedAndKeepsThePreviousOnZeroOrNonFinite) {
  FailureBudget budget;
  for (const float amax : AmaxInputs()) {
    const float want = reference::ScaleFromAmaxRef(amax, 448.0, 0.25f);
    if (Bits(Fp8TensorScale(amax, 0.25f)) != Bits(want) && budget.Spend()) {
      ADD_FAILURE() << "amax " << amax << ": got " << Fp8TensorScale(amax, 0.25f) << ", want "
                    << want;
    }
  }
  EXPECT_EQ(Fp8TensorScale(0.0f, 0.25f), 0.25f);
  EXPECT_EQ(Fp8TensorScale(std::numeric_limits<float>::infinity(), 0.25f), 0.25f);
  EXPECT_EQ(Fp8TensorScale(std::numeric_limits<float>::quiet_NaN(), 0.25f), 0.25f);
  EXPECT_EQ(Fp8TensorScale(FromBits(1), 1.0f), kMaxScale);
  EXPECT_EQ(ScaleFromAmax(FLT_MAX, 448.0f * std::ldexp(1.0f, -100), 1.0f), kMinScale);
  EXPECT_EQ(Fp8TensorScale(3.0f, 1.0f), 448.0f / 3.0f);
  EXPECT_EQ(ScaleInv(4.0f), 0.25f);
}

TEST(FormatsTest, AmaxCombineIsNaNIfAnyIsNaNElseTheLargestMagnitude) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(AmaxCombine(-3.0f, 2.0f), 3.0f);
  EXPECT_EQ(AmaxCombine(2.0f, -3.0f), 3.0f);
  EXPECT_EQ(AmaxCombine(-inf, 1.0f), inf);
  EXPECT_EQ(Bits(AmaxCombine(-0.0f, 0.0f)), 0u) << "amax is a magnitude: +0";
  EXPECT_TRUE(std::isnan(AmaxCombine(nan, inf)));
  EXPECT_TRUE(std::isnan(AmaxCombine(inf, nan)));
  EXPECT_TRUE(std::isnan(AmaxCombine(1.0f, -nan)));
  EXPECT_EQ(Bits(AmaxCombine(FromBits(0xFFFFFFFF), 0.0f)), kCanonicalNaNBits);
  // Any order of a set gives the same bits.
  std::vector<float> xs = RandomInRange(31, 1000, -20, 20);
  xs[517] = -inf;
  float forward = 0.0f, backward = 0.0f;
  for (size_t i = 0; i < xs.size(); ++i) {
    forward = AmaxCombine(forward, xs[i]);
    backward = AmaxCombine(xs[xs.size() - 1 - i], backward);
  }
  EXPECT_EQ(Bits(forward), Bits(backward));
  EXPECT_EQ(forward, inf);
}

// High halves of every kind with the low halves that decide the rounding, plus random patterns.
std::vector<uint32_t> SplitInputs() {
  std::vector<uint32_t> out;
  std::mt19937_64 rng(41);
  for (uint32_t hi = 0; hi <= 0xFFFF; ++hi) {
    for (const uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      out.push_back(hi << 16 | lo);
    }
    out.push_back(hi << 16 | static_cast<uint32_t>(rng() & 0xFFFF));
  }
  for (int i = 0; i < 1 << 21; ++i) out.push_back(static_cast<uint32_t>(rng()));
  return out;
}

TEST(FormatsTest, Bf16RemainderSplitRoundTripsEveryBitPattern) {
  FailureBudget budget;
  for (const uint32_t bits : SplitInputs()) {
    const Bf16Split s = SplitBf16Remainder(FromBits(bits));
    const uint32_t back = Bits(MergeBf16Remainder(s.served, s.remainder));
    if (back != bits && budget.Spend()) {
      ADD_FAILURE() << std::hex << "0x" << bits << " came back as 0x" << back;
    }
  }
}

TEST(FormatsTest, Bf16RemainderServesTheNearestWithTiesAwayFromZero) {
  FailureBudget budget;
  for (const uint32_t bits : SplitInputs()) {
    const float master = FromBits(bits);
    if (!std::isfinite(master)) continue;
    const uint16_t want = reference::Bf16ServedRef(master);
    if (SplitBf16Remainder(master).served != want && budget.Spend()) {
      ADD_FAILURE() << std::hex << "master 0x" << bits << ": served 0x"
                    << SplitBf16Remainder(master).served << ", want 0x" << want;
    }
  }
  EXPECT_EQ(SplitBf16Remainder(FromBits(0x3F808000)).served, 0x3F81) << "a tie goes away from 0";
  EXPECT_EQ(SplitBf16Remainder(FromBits(0xBF808000)).served, 0xBF81);
  EXPECT_EQ(SplitBf16Remainder(FromBits(0x3F807FFF)).served, 0x3F80);
  EXPECT_EQ(SplitBf16Remainder(FromBits(0x3F808000)).remainder, -32768);
}

TEST(FormatsTest, Bf16RemainderEdgesServeInfinityAndZeroAsDesigned) {
  // Within 2^-9 of FLT_MAX: +-inf (outside the cast rules on purpose).
  EXPECT_EQ(SplitBf16Remainder(FromBits(0x7F7F8000)).served, 0x7F80);
  EXPECT_EQ(SplitBf16Remainder(FLT_MAX).served, 0x7F80);
  EXPECT_EQ(SplitBf16Remainder(-FLT_MAX).served, 0xFF80);
  EXPECT_EQ(SplitBf16Remainder(FromBits(0x7F7F7FFF)).served, 0x7F7F);
  // NaN masters whose rounding wraps the 16-bit code serve -0 / +0.
  EXPECT_EQ(SplitBf16Remainder(FromBits(0x7FFFFFFF)).served, 0x8000);
  EXPECT_EQ(SplitBf16Remainder(FromBits(0xFFFF8000)).served, 0x0000);
  for (const uint32_t bits : {0x7F7F8000u, 0xFF7FFFFFu, 0x7FFFFFFFu, 0xFFFF8000u, 0x7FC00000u}) {
    const Bf16Split s = SplitBf16Remainder(FromBits(bits));
    EXPECT_EQ(Bits(MergeBf16Remainder(s.served, s.remainder)), bits) << std::hex << bits;
  }
}

}  // namespace
}  // namespace paramd::kernels
