// kernels/formats.h's casts against the CUDA toolkit's own conversions, compiled for the host by
// the C++ compiler (cuda_fp8.h and cuda_fp16.h define them as host functions too): the GPU kernels
// and the GEMMs that read the served bytes agree with the CPU on every input tried.
//
// Where DESIGN.md §3 and CUDA agree (everything for FP8 with __NV_SATFINITE, NaN included: both
// give 0x7F), the codes must be equal. They differ on purpose in one place: __float2half_rn
// rounds past 65504 to +-inf, paramd saturates to +-65504 (0x7BFF / 0xFBFF); those inputs are
// checked against that rule instead.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/formats.h"

namespace paramd::kernels {
namespace {

constexpr int kRandomBitPatterns = 5'000'000;  // per format
constexpr int kRandomValues = 5'000'000;       // per format, spread over its range

float FromBits(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }

uint8_t CudaE4m3(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
uint8_t CudaE5m2(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); }
uint16_t CudaFp16(float x) {
  const __half h = __float2half_rn(x);
  uint16_t code;
  std::memcpy(&code, &h, sizeof code);
  return code;
}

// Boundaries of a format whose finite magnitudes are decode(0 .. max_code): each value, each
// midpoint (ties), the floats next to them, one step past the largest finite value; zeros,
// infinities, NaNs of both signs and several payloads, FP32 subnormals and extremes.
template <typename Decode>
std::vector<float> Boundaries(uint32_t max_code, Decode decode) {
  std::vector<float> mags;
  for (uint32_t c = 0; c <= max_code; ++c) {
    const double lo = decode(c);
    const double hi = c < max_code ? decode(c + 1) : 2 * lo - decode(c - 1);
    for (const float m : {static_cast<float>(lo), static_cast<float>((lo + hi) / 2)}) {
      mags.insert(mags.end(), {m, std::nextafter(m, 0.0f),
                               std::nextafter(m, std::numeric_limits<float>::max())});
    }
  }
  for (const uint32_t b :
       {0x00000000u, 0x00000001u, 0x00400000u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0x7F800000u,
        0x7F800001u, 0x7FA00000u, 0x7FC00000u, 0x7FC00001u, 0x7FFFFFFFu}) {
    mags.push_back(FromBits(b));
  }
  std::vector<float> out;
  for (const float m : mags) out.insert(out.end(), {m, -m});
  return out;
}

// Random bit patterns, then random values with an exponent uniform in [lo_exp, hi_exp).
std::vector<float> RandomInputs(uint64_t seed, int lo_exp, int hi_exp) {
  std::mt19937_64 rng(seed);
  std::vector<float> out;
  out.reserve(kRandomBitPatterns + kRandomValues);
  for (int i = 0; i < kRandomBitPatterns; ++i)
    out.push_back(FromBits(static_cast<uint32_t>(rng())));
  std::uniform_int_distribution<int> exp(lo_exp, hi_exp - 1);
  std::uniform_real_distribution<float> sig(1.0f, 2.0f);
  for (int i = 0; i < kRandomValues; ++i) {
    out.push_back((rng() & 1 ? -1.0f : 1.0f) * std::ldexp(sig(rng), exp(rng)));
  }
  return out;
}

struct Tally {
  int64_t compared = 0;
  int64_t mismatched = 0;
};

template <typename Ours, typename Theirs>
Tally CompareAll(const std::vector<float>& inputs, Ours ours, Theirs theirs) {
  Tally t;
  for (const float x : inputs) {
    ++t.compared;
    if (ours(x) != theirs(x) && ++t.mismatched <= 10) {
      ADD_FAILURE() << "input " << x << " (0x" << std::hex << Bits(x) << "): paramd 0x"
                    << uint32_t{ours(x)} << ", CUDA 0x" << uint32_t{theirs(x)};
    }
  }
  return t;
}

TEST(CudaHostCastsTest, E4m3EqualsCudaSatfiniteOnEveryInputTried) {
  std::vector<float> inputs = Boundaries(0x7E, [](uint32_t c) { return FloatFromE4m3(c); });
  const size_t boundaries = inputs.size();
  for (const float x : RandomInputs(1, -12, 11)) inputs.push_back(x);
  const Tally t = CompareAll(inputs, E4m3FromFloat, CudaE4m3);
  EXPECT_EQ(t.mismatched, 0);
  RecordProperty("compared", std::to_string(t.compared));
  std::printf("E4M3: %lld inputs (%zu boundaries), %lld differ from cuda_fp8.h\n",
              static_cast<long long>(t.compared), boundaries, static_cast<long long>(t.mismatched));
}

TEST(CudaHostCastsTest, E5m2EqualsCudaSatfiniteOnEveryInputTried) {
  std::vector<float> inputs = Boundaries(0x7B, [](uint32_t c) { return FloatFromE5m2(c); });
  const size_t boundaries = inputs.size();
  for (const float x : RandomInputs(2, -19, 18)) inputs.push_back(x);
  const Tally t = CompareAll(inputs, E5m2FromFloat, CudaE5m2);
  EXPECT_EQ(t.mismatched, 0);
  RecordProperty("compared", std::to_string(t.compared));
  std::printf("E5M2: %lld inputs (%zu boundaries), %lld differ from cuda_fp8.h\n",
              static_cast<long long>(t.compared), boundaries, static_cast<long long>(t.mismatched));
}

TEST(CudaHostCastsTest, NaNBecomes0x7FInBothFp8FormatsLikeCuda) {
  for (const uint32_t b : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu}) {
    EXPECT_EQ(E4m3FromFloat(FromBits(b)), 0x7F);
    EXPECT_EQ(CudaE4m3(FromBits(b)), 0x7F);
    EXPECT_EQ(E5m2FromFloat(FromBits(b)), 0x7F);
    EXPECT_EQ(CudaE5m2(FromBits(b)), 0x7F);
  }
}

// FP16: equal to __float2half_rn wherever that gives a finite code or NaN; where it gives +-inf
// (|x| >= 65520, infinities), paramd gives +-65504.
TEST(CudaHostCastsTest, Fp16EqualsFloat2HalfRnExceptThatItSaturates) {
  std::vector<float> inputs = Boundaries(0x7BFF, [](uint32_t c) { return FloatFromFp16(c); });
  for (const float x : RandomInputs(3, -27, 18)) inputs.push_back(x);
  Tally agree, saturated;
  for (const float x : inputs) {
    const uint16_t theirs = CudaFp16(x);
    const uint16_t ours = Fp16FromFloat(x);
    const bool cuda_inf = (theirs & 0x7FFF) == 0x7C00;
    const uint16_t want = cuda_inf ? static_cast<uint16_t>((theirs & 0x8000) | 0x7BFF) : theirs;
    Tally& t = cuda_inf ? saturated : agree;
    ++t.compared;
    if (ours != want && ++t.mismatched <= 10) {
      ADD_FAILURE() << "input " << x << " (0x" << std::hex << Bits(x) << "): paramd 0x" << ours
                    << ", CUDA 0x" << theirs << ", want 0x" << want;
    }
  }
  EXPECT_EQ(agree.mismatched, 0);
  EXPECT_EQ(saturated.mismatched, 0);
  EXPECT_GT(saturated.compared, 0);
  std::printf(
      "FP16: %lld inputs equal to __float2half_rn, %lld where it gives inf saturated to "
      "+-65504; %lld + %lld differ\n",
      static_cast<long long>(agree.compared), static_cast<long long>(saturated.compared),
      static_cast<long long>(agree.mismatched), static_cast<long long>(saturated.mismatched));
}

// Decoding: every FP8 code through CUDA's FP8 -> half conversion (exact) and half -> float.
TEST(CudaHostCastsTest, DecodesEveryFp8CodeLikeCuda) {
  for (uint32_t code = 0; code < 256; ++code) {
    for (const bool e4m3 : {true, false}) {
      const __half_raw raw = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code),
                                                     e4m3 ? __NV_E4M3 : __NV_E5M2);
      const float theirs = __half2float(__half(raw));
      const float ours = e4m3 ? FloatFromE4m3(code) : FloatFromE5m2(code);
      if (std::isnan(theirs)) {
        EXPECT_TRUE(std::isnan(ours)) << (e4m3 ? "E4M3" : "E5M2") << " code " << code;
      } else {
        EXPECT_EQ(Bits(ours), Bits(theirs)) << (e4m3 ? "E4M3" : "E5M2") << " code " << code;
      }
    }
  }
}

}  // namespace
}  // namespace paramd::kernels
