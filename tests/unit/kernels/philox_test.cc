// Philox 4x32-10 (kernels/philox.h): the published known-answer vectors (Random123's kat_vectors),
// the reference's own implementation, DESIGN.md §3's key and counter layout, and every CPU path's
// lane-parallel form against the scalar one.
#include "kernels/philox.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/fused_step_paths.h"
#include "reference/policy_reference.h"

namespace paramd::kernels {
namespace {

struct KnownAnswer {
  PhiloxCounter counter;
  PhiloxKey key;
  PhiloxCounter expected;
};

// Random123 kat_vectors, "philox4x32 10" lines: counter, key, result.
constexpr KnownAnswer kKnownAnswers[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

static_assert(Philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5, "constexpr Philox");

TEST(PhiloxTest, MatchesThePublishedKnownAnswers) {
  for (const KnownAnswer& kat : kKnownAnswers) {
    EXPECT_EQ(Philox4x32_10(kat.counter, kat.key), kat.expected);
    EXPECT_EQ(reference::PhiloxRef(kat.counter, kat.key), kat.expected) << "reference";
  }
}

TEST(PhiloxTest, RoundingKeyAndCounterFollowTheDesignLayout) {
  EXPECT_EQ(RoundingKey(0x0123456789ABCDEFull), (PhiloxKey{0x89ABCDEF, 0x01234567}));
  EXPECT_EQ(RoundingCounter(0x0000000500000007ull, 9, 4), (PhiloxCounter{7, 5, 9, 4}));
}

TEST(PhiloxTest, KernelsAndReferenceAgreeOnRandomInputs) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 10000; ++i) {
    const PhiloxCounter c = {static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng()),
                             static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng())};
    const PhiloxKey k = {static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng())};
    ASSERT_EQ(Philox4x32_10(c, k), reference::PhiloxRef(c, k));
  }
}

class PhiloxPathTest : public ::testing::TestWithParam<CpuPath> {
 protected:
  void SetUp() override {
    if (!CpuPathSupported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << CpuPathName(GetParam()) << " path";
    }
  }
};

TEST_P(PhiloxPathTest, LaneParallelWordsEqualTheScalarGenerator) {
  std::mt19937_64 rng(2);
  constexpr int kCount = 128;
  std::vector<uint32_t> w0(kCount), w1(kCount);
  // Indices with a zero and a non-zero high word, and the last chunk before the low word wraps.
  const uint64_t starts[] = {0, 128 * 1000, (uint64_t{5} << 32) + 256, 0xFFFFFF80ull,
                             (uint64_t{0xFFFFFFFF} << 32) | 0xFFFFFF80u};
  for (const uint64_t index : starts) {
    for (int trial = 0; trial < 20; ++trial) {
      const uint64_t seed = rng();
      const uint32_t k = static_cast<uint32_t>(rng());
      const uint32_t tensor = static_cast<uint32_t>(rng());
      cpu_internal::PhiloxForTest(GetParam(), seed, k, tensor, index, kCount, w0.data(), w1.data());
      for (int j = 0; j < kCount; ++j) {
        const PhiloxCounter want =
            Philox4x32_10(RoundingCounter(index + j, k, tensor), RoundingKey(seed));
        ASSERT_EQ(w0[j], want[0]) << "index " << index + j;
        ASSERT_EQ(w1[j], want[1]) << "index " << index + j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, PhiloxPathTest,
                         ::testing::Values(CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512),
                         [](const ::testing::TestParamInfo<CpuPath>& info) {
                           return std::string(CpuPathName(info.param));
                         });

}  // namespace
}  // namespace paramd::kernels
