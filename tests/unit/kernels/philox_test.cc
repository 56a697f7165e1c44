// Philox 4x32-10 (kernels/philox.h): the published known-answer vectors (Random123's kat_vectors),
// the reference's own implementation, stochastic rounding's key, counter and block layout
// (README.md "Numerics"), and every CPU path's lane-parallel form against the scalar one.
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

TEST(PhiloxTest, RoundingKeyAndCounterFollowTheBlockLayout) {
  EXPECT_EQ(RoundingKey(0x0123456789ABCDEFull), (PhiloxKey{0x89ABCDEF, 0x01234567}));
  // Block 0x5_00000007 of each stream: word 1 holds the block's high bits, plus 2^31 for
  // exp_avg_sq.
  EXPECT_EQ(RoundingCounter(0x0000000500000007ull, RoundingStream::kExpAvg, 9, 4),
            (PhiloxCounter{7, 5, 9, 4}));
  EXPECT_EQ(RoundingCounter(0x0000000500000007ull, RoundingStream::kExpAvgSq, 9, 4),
            (PhiloxCounter{7, 0x80000005u, 9, 4}));
  // The largest block (element indices below 2^64) leaves bit 31 of word 1 to the stream.
  EXPECT_EQ(RoundingCounter(UINT64_MAX / 4, RoundingStream::kExpAvgSq, 0, 0),
            (PhiloxCounter{0xFFFFFFFFu, 0xBFFFFFFFu, 0, 0}));
  // Element i takes word i % 4 of block i / 4: every word of a block is used, by 4 consecutive
  // elements.
  const PhiloxKey key = RoundingKey(0x0123456789ABCDEFull);
  for (const RoundingStream stream : {RoundingStream::kExpAvg, RoundingStream::kExpAvgSq}) {
    const uint64_t block = (uint64_t{3} << 32) + 11;
    const PhiloxCounter words = Philox4x32_10(RoundingCounter(block, stream, 9, 4), key);
    for (uint64_t w = 0; w < 4; ++w) {
      EXPECT_EQ(RoundingWord(key, stream, 9, 4, 4 * block + w), words[w]);
    }
  }
}

// The GPU kernel's draw for a thread's 4 consecutive elements, run here: the words of one block
// where the first index is a multiple of 4, each element's own word elsewhere, always equal to
// RoundingWord element by element (high block numbers included).
TEST(PhiloxTest, FourWordsAtOnceEqualEachElementsWord) {
  const PhiloxKey key = RoundingKey(0x0123456789abcdefull);
  for (const RoundingStream stream : {RoundingStream::kExpAvg, RoundingStream::kExpAvgSq}) {
    for (const uint64_t base : {uint64_t{0}, uint64_t{4096}, (uint64_t{1} << 34) + 8}) {
      for (uint64_t index = base; index < base + 12; ++index) {
        uint32_t words[4];
        RoundingWords4(key, stream, 7, 3, index, words);
        for (int j = 0; j < 4; ++j) {
          ASSERT_EQ(words[j], RoundingWord(key, stream, 7, 3, index + j))
              << "index " << index << " + " << j;
        }
      }
    }
  }
}

TEST(PhiloxTest, TheTwoStreamsDrawDifferentWords) {
  const PhiloxKey key = RoundingKey(42);
  int equal = 0;
  for (uint64_t i = 0; i < 4096; ++i) {
    equal += RoundingWord(key, RoundingStream::kExpAvg, 1, 0, i) ==
             RoundingWord(key, RoundingStream::kExpAvgSq, 1, 0, i);
  }
  EXPECT_EQ(equal, 0);  // a chance match has probability 2^-32 per element
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

TEST(PhiloxTest, KernelsAndReferenceDrawTheSameRoundingWords) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 10000; ++i) {
    const reference::RngRef ref{rng(), static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng())};
    const uint64_t index = i % 2 == 0 ? rng() : rng() % 100000;
    ASSERT_EQ(RoundingWord(RoundingKey(ref.seed), RoundingStream::kExpAvg, ref.k, ref.tensor_index,
                           index),
              reference::RandomWordRef(ref, reference::StreamRef::kExpAvg, index));
    ASSERT_EQ(RoundingWord(RoundingKey(ref.seed), RoundingStream::kExpAvgSq, ref.k,
                           ref.tensor_index, index),
              reference::RandomWordRef(ref, reference::StreamRef::kExpAvgSq, index));
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
  // Elements from the first of a block and from inside one; a zero and a non-zero high word of
  // the block number; ranges across the block where its low word wraps (element 2^34) and up to
  // the last element below 2^64.
  const uint64_t starts[] = {0,
                             1,
                             3,
                             128 * 1000,
                             128 * 1000 + 2,
                             (uint64_t{5} << 34) + 256,
                             (uint64_t{5} << 34) + 257,
                             (uint64_t{1} << 34) - 128,
                             (uint64_t{1} << 34) - 130,
                             (uint64_t{1} << 34) - 3,
                             (uint64_t{7} << 34) - 64,
                             UINT64_MAX - 300};
  // Whole chunks, a part of one, and more than one (the hook draws 128 elements at a time).
  const int64_t counts[] = {128, 1, 37, 301};
  std::vector<uint32_t> words(301);
  for (const uint64_t index : starts) {
    for (const int64_t count : counts) {
      if (static_cast<uint64_t>(count - 1) > UINT64_MAX - index) continue;
      for (int trial = 0; trial < 8; ++trial) {
        const uint64_t seed = rng();
        const uint32_t k = static_cast<uint32_t>(rng());
        const uint32_t tensor = static_cast<uint32_t>(rng());
        for (const RoundingStream stream : {RoundingStream::kExpAvg, RoundingStream::kExpAvgSq}) {
          cpu_internal::PhiloxForTest(GetParam(), seed, stream, k, tensor, index, count,
                                      words.data());
          for (int64_t j = 0; j < count; ++j) {
            const uint64_t i = index + static_cast<uint64_t>(j);
            ASSERT_EQ(words[j], RoundingWord(RoundingKey(seed), stream, k, tensor, i))
                << "element " << i << " stream " << static_cast<int>(stream);
          }
        }
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
