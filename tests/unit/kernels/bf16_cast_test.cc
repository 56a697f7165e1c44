// The FP32 -> BF16 cast (DESIGN.md §3): round to nearest even, saturate (infinities too), NaN ->
// 0x7FFF, subnormals kept. Checked for kernels/cast.h, the reference's own cast, and the cast
// inside every vector path of the fused step, against a deliberately plain oracle.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <vector>

#include "kernels/cast.h"
#include "kernels/fused_step.h"
#include "reference/adamw_reference.h"

namespace paramd::kernels {

// Readable test parameters in GoogleTest output (found by argument-dependent lookup).
void PrintTo(CpuPath p, std::ostream* os) { *os << CpuPathName(p); }

namespace {

float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// The oracle: compare x with the two BF16 neighbours of its magnitude in double arithmetic, pick
// the nearer (the even code on a tie), then saturate. No bit tricks shared with the casts.
uint16_t OracleBf16(float x) {
  if (std::isnan(x)) return 0x7FFF;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double mag = std::fabs(static_cast<double>(x));
  const uint16_t below = static_cast<uint16_t>(std::bit_cast<uint32_t>(std::fabs(x)) >> 16);
  uint16_t code = below;
  if (below < 0x7F80) {  // finite: there is a neighbour above (possibly the infinity code)
    const double lo = FloatFromBf16(below);
    const double hi = below + 1 == 0x7F80 ? std::ldexp(1.0, 128) : FloatFromBf16(below + 1);
    if (mag - lo > hi - mag || (mag - lo == hi - mag && (below & 1) != 0)) code = below + 1;
  }
  if (code >= 0x7F80) code = 0x7F7F;
  return sign | code;
}

struct CastCase {
  uint32_t input_bits;
  uint16_t want;
  const char* what;
};

TEST(Bf16CastTest, HandlesTiesSaturationInfNanAndSubnormals) {
  const CastCase cases[] = {
      {0x3F800000, 0x3F80, "one"},
      {0x3F808000, 0x3F80, "tie below an even code stays"},
      {0x3F818000, 0x3F82, "tie above an odd code goes up to even"},
      {0x3F808001, 0x3F81, "just above a tie rounds up"},
      {0x3F807FFF, 0x3F80, "just below a tie rounds down"},
      {0x3F7FFFFF, 0x3F80, "rounding carries into the exponent"},
      {0x7F7FFFFF, 0x7F7F, "FLT_MAX saturates"},
      {0xFF7FFFFF, 0xFF7F, "-FLT_MAX saturates"},
      {0x7F7F8000, 0x7F7F, "a tie that would round to inf saturates"},
      {0x7F7F7FFF, 0x7F7F, "largest value below the tie rounds down"},
      {0x7F800000, 0x7F7F, "+inf saturates"},
      {0xFF800000, 0xFF7F, "-inf saturates"},
      {0x7FC00000, 0x7FFF, "quiet NaN"},
      {0xFFC00000, 0x7FFF, "negative NaN is the positive NaN code"},
      {0x7F800001, 0x7FFF, "signalling NaN whose payload is in the dropped half"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0 keeps its sign"},
      {0x00000001, 0x0000, "smallest subnormal rounds to zero"},
      {0x00008000, 0x0000, "subnormal tie goes to even zero"},
      {0x00008001, 0x0001, "subnormal above a tie rounds up"},
      {0x00018000, 0x0002, "subnormal tie goes up to even"},
      {0x807FFFFF, 0x8080, "largest subnormal rounds up to the smallest normal"},
      {0x00410000, 0x0041, "exact subnormal BF16 kept"},
  };
  for (const CastCase& c : cases) {
    const float x = FromBits(c.input_bits);
    EXPECT_EQ(Bf16FromFloat(x), c.want) << c.what << " (kernels)";
    EXPECT_EQ(reference::Bf16FromFloat(x), c.want) << c.what << " (reference)";
    EXPECT_EQ(OracleBf16(x), c.want) << c.what << " (oracle)";
  }
}

TEST(Bf16CastTest, RoundTripsEveryFiniteCode) {
  for (uint32_t code = 0; code <= 0xFFFF; ++code) {
    const uint16_t c = static_cast<uint16_t>(code);
    const uint16_t exponent_bits = c & 0x7F80;
    if (exponent_bits == 0x7F80) continue;  // inf and NaN codes
    EXPECT_EQ(Bf16FromFloat(FloatFromBf16(c)), c);
    EXPECT_EQ(reference::FloatFromBf16(c), FloatFromBf16(c));
  }
}

// Every high half with the low halves that matter for rounding, plus random patterns.
std::vector<float> ManyBitPatterns() {
  std::vector<float> out;
  const uint32_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (uint32_t hi = 0; hi <= 0xFFFF; ++hi) {
    for (uint32_t lo : lows) out.push_back(FromBits(hi << 16 | lo));
    out.push_back(FromBits(hi << 16 | (bits(rng) & 0xFFFF)));
  }
  for (int i = 0; i < 1 << 20; ++i) out.push_back(FromBits(bits(rng)));
  return out;
}

TEST(Bf16CastTest, ScalarCastsMatchTheOracleOnManyBitPatterns) {
  int failures = 0;
  for (const float x : ManyBitPatterns()) {
    const uint16_t want = OracleBf16(x);
    if (Bf16FromFloat(x) != want || reference::Bf16FromFloat(x) != want) {
      ADD_FAILURE() << "input 0x" << std::hex << std::bit_cast<uint32_t>(x) << ": kernels 0x"
                    << Bf16FromFloat(x) << ", reference 0x" << reference::Bf16FromFloat(x)
                    << ", oracle 0x" << want;
      if (++failures == 10) return;
    }
  }
}

// The fused step with zero gradients and moments, decay 1 and step size 0 leaves every master
// exactly as it is (p * 1, then p + -0 * 0), so its BF16 output is the cast of the master itself.
class VectorCastTest : public ::testing::TestWithParam<CpuPath> {
 protected:
  void SetUp() override {
    if (!CpuPathSupported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << CpuPathName(GetParam()) << " path";
    }
  }
};

TEST_P(VectorCastTest, MatchesTheOracleOnManyBitPatterns) {
  std::vector<float> master = ManyBitPatterns();
  const size_t n = master.size();
  const std::vector<float> input = master;
  std::vector<float> zeros(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  std::vector<uint16_t> out(n);
  const void* slot = zeros.data();
  FusedStepArgs a;
  a.slots = &slot;
  a.num_slots = 1;
  a.scalars = {0.9f, 0.999f, 0.1f, 0.001f, /*eps=*/1.0f, /*decay=*/1.0f, /*step_size=*/0.0f, 1.0f};
  a.master = master.data();
  a.exp_avg = m.data();
  a.exp_avg_sq = v.data();
  a.out_bf16 = out.data();
  // An odd length leaves a tail for the masked or scalar remainder.
  ASSERT_TRUE(FusedStepCpu(a, 0, static_cast<int64_t>(n) - 5, GetParam()).ok());
  ASSERT_TRUE(
      FusedStepCpu(a, static_cast<int64_t>(n) - 5, static_cast<int64_t>(n), GetParam()).ok());
  int failures = 0;
  for (size_t i = 0; i < n; ++i) {
    if (out[i] != OracleBf16(input[i])) {
      ADD_FAILURE() << CpuPathName(GetParam()) << ": input 0x" << std::hex
                    << std::bit_cast<uint32_t>(input[i]) << " gave 0x" << out[i] << ", want 0x"
                    << OracleBf16(input[i]);
      if (++failures == 10) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryPath, VectorCastTest,
                         ::testing::Values(CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512),
                         [](const ::testing::TestParamInfo<CpuPath>& info) {
                           return std::string(CpuPathName(info.param));
                         });

}  // namespace
}  // namespace paramd::kernels
