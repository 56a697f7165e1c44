// The step rules (kernels/step_rules.h): finiteness over every rank's slot, the FP64 sums of
// squares in DESIGN.md §2's fixed pairwise order (equal, bit for bit, to the reference's recursive
// tree on every path), and the clip factor against a float64 norm.
#include "kernels/step_rules.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/adamw_reference.h"
#include "reference/step_rules_reference.h"
#include "tests/unit/kernels/kernels_test_util.h"

namespace paramd::kernels {
namespace {

// Slots of one tensor in either type, and the gs the reference forms from them.
struct Slots {
  SlotType type;
  std::vector<std::vector<float>> fp32;
  std::vector<std::vector<uint16_t>> bf16;
  std::vector<const void*> ptrs;

  Slots(std::mt19937_64& rng, SlotType t, int num, size_t n) : type(t) {
    for (int r = 0; r < num; ++r) {
      std::vector<float> v = testing::RandomFloats(rng, n);
      if (t == SlotType::kFp32) {
        fp32.push_back(std::move(v));
      } else {
        bf16.emplace_back(n);
        for (size_t i = 0; i < n; ++i) bf16.back()[i] = reference::Bf16FromFloat(v[i]);
      }
    }
    Repoint();
  }
  void Repoint() {
    ptrs.clear();
    for (auto& s : fp32) ptrs.push_back(s.data());
    for (auto& s : bf16) ptrs.push_back(s.data());
  }
  GradSlots Grad(float grad_scale) const {
    return {ptrs.data(), static_cast<int>(ptrs.size()), type, grad_scale};
  }
  std::vector<float> Gs(float grad_scale) const {
    const size_t n = type == SlotType::kFp32 ? fp32[0].size() : bf16[0].size();
    const int num = static_cast<int>(ptrs.size());
    std::vector<float> gs(n);
    for (size_t i = 0; i < n; ++i) {
      const float g0 =
          type == SlotType::kFp32
              ? reference::SumSlotsFp32(reinterpret_cast<const float* const*>(ptrs.data()), num, i)
              : reference::SumSlotsBf16(reinterpret_cast<const uint16_t* const*>(ptrs.data()), num,
                                        i);
      gs[i] = g0 * grad_scale;
    }
    return gs;
  }
};

std::vector<CpuPath> SupportedPaths() {
  std::vector<CpuPath> paths;
  for (CpuPath p : {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512}) {
    if (CpuPathSupported(p)) paths.push_back(p);
  }
  return paths;
}

TEST(StepRulesTest, ANonFiniteValueInOneRanksSlotMakesTheJobNonFinite) {
  std::mt19937_64 rng(1);
  constexpr size_t kN = 1000;
  const float inf = std::numeric_limits<float>::infinity();
  for (CpuPath path : SupportedPaths()) {
    for (SlotType type : {SlotType::kFp32, SlotType::kBf16}) {
      for (const float bad : {std::nanf(""), inf, -inf, 2e19f /* its square overflows */}) {
        for (const size_t at : {size_t{0}, size_t{17}, size_t{640}, kN - 1}) {
          Slots s(rng, type, 3, kN);
          if (type == SlotType::kFp32) {
            s.fp32[1][at] = bad;
          } else {
            s.bf16[1][at] = reference::Bf16FromFloat(bad);
            if (std::isnan(bad)) s.bf16[1][at] = 0x7FC0;
          }
          bool finite = true;
          ASSERT_TRUE(GradFiniteCpu(s.Grad(1.0f), 0, kN, &finite, path).ok());
          EXPECT_FALSE(finite) << CpuPathName(path) << " value " << bad << " at " << at;
          finite = true;
          std::vector<double> sums(NumNormBlocks(kN));
          ASSERT_TRUE(GradBlockSumsCpu(s.Grad(1.0f), 1, kN, 0, 1, sums.data(), &finite, path).ok());
          EXPECT_FALSE(finite) << CpuPathName(path) << " with sums, value " << bad << " at " << at;
        }
      }
    }
  }
}

TEST(StepRulesTest, FiniteGradientsStayFiniteAndGradScaleCanOverflowTheSquare) {
  std::mt19937_64 rng(2);
  constexpr size_t kN = 777;
  for (CpuPath path : SupportedPaths()) {
    Slots s(rng, SlotType::kFp32, 2, kN);
    s.fp32[0][5] = 1e19f;  // square 1e38: finite
    s.fp32[1][5] = 0.0f;
    bool finite = true;
    ASSERT_TRUE(GradFiniteCpu(s.Grad(1.0f), 0, kN, &finite, path).ok());
    EXPECT_TRUE(finite) << CpuPathName(path);
    ASSERT_TRUE(GradFiniteCpu(s.Grad(4.0f), 0, kN, &finite, path).ok());
    EXPECT_FALSE(finite) << CpuPathName(path) << ": gs = 4e19, its square overflows";
  }
}

TEST(StepRulesTest, BlockSumsEqualTheReferenceTreeBitForBitOnEveryPath) {
  std::mt19937_64 rng(3);
  const float grad_scale = static_cast<float>(1.0 / 3072.0);
  for (const int64_t rows : {1, 2, 127, 128, 129, 300}) {
    for (const int64_t cols : {1, 3, 37, 128, 1000}) {
      for (SlotType type : {SlotType::kFp32, SlotType::kBf16}) {
        const Slots s(rng, type, 1 + static_cast<int>(rows % 3), static_cast<size_t>(rows * cols));
        const std::vector<double> want =
            reference::BlockSumsOfSquaresRef(s.Gs(grad_scale).data(), rows, cols);
        for (CpuPath path : SupportedPaths()) {
          std::vector<double> got(NumNormBlocks(rows));
          bool finite = true;
          ASSERT_TRUE(GradBlockSumsCpu(s.Grad(grad_scale), rows, cols, 0, NumNormBlocks(rows),
                                       got.data(), &finite, path)
                          .ok());
          EXPECT_TRUE(finite);
          ASSERT_EQ(got.size(), want.size());
          for (size_t b = 0; b < got.size(); ++b) {
            EXPECT_EQ(std::bit_cast<uint64_t>(got[b]), std::bit_cast<uint64_t>(want[b]))
                << CpuPathName(path) << " [" << rows << ", " << cols << "] block " << b << ": "
                << got[b] << " vs " << want[b];
          }
        }
      }
    }
  }
}

TEST(StepRulesTest, ChunkSumsComposeAcrossRangesIntoTheBlockSum) {
  std::mt19937_64 rng(4);
  constexpr int64_t kRows = 1, kCols = 128 * 50 + 17;  // one block of 51 chunks
  const Slots s(rng, SlotType::kFp32, 2, kRows * kCols);
  std::vector<double> chunks(51);
  bool finite = true;
  // Three ranges, as three threads would run them.
  ASSERT_TRUE(GradChunkSumsCpu(s.Grad(1.0f), 0, 128 * 7, chunks.data(), &finite).ok());
  ASSERT_TRUE(GradChunkSumsCpu(s.Grad(1.0f), 128 * 7, 128 * 40, chunks.data() + 7, &finite).ok());
  ASSERT_TRUE(GradChunkSumsCpu(s.Grad(1.0f), 128 * 40, kCols, chunks.data() + 40, &finite).ok());
  double block = 0.0;
  ASSERT_TRUE(GradBlockSumsCpu(s.Grad(1.0f), kRows, kCols, 0, 1, &block, &finite).ok());
  EXPECT_EQ(std::bit_cast<uint64_t>(PairwiseSum(chunks.data(), 51)),
            std::bit_cast<uint64_t>(block));
  EXPECT_EQ(GradChunkSumsCpu(s.Grad(1.0f), 64, 128, chunks.data(), &finite).code(),
            Code::kInvalidArgument)
      << "chunk sums start at a multiple of 128";
}

TEST(StepRulesTest, PairwiseSumIsTheFixedTree) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> value(-1e3, 1e3);
  for (const int n : {0, 1, 2, 3, 5, 64, 100, 127, 128, 129, 1000}) {
    std::vector<double> v(n);
    for (double& x : v) x = value(rng) * std::pow(10.0, static_cast<int>(value(rng)) % 9);
    EXPECT_EQ(std::bit_cast<uint64_t>(PairwiseSum(v.data(), n)),
              std::bit_cast<uint64_t>(reference::PairwiseTreeRef(v)))
        << "n=" << n;
  }
}

TEST(StepRulesTest, ClipFactorMatchesTheFloat64Norm) {
  std::mt19937_64 rng(6);
  // A job of three tensors; the total adds their block sums in registration order.
  std::vector<double> blocks;
  long double exact = 0.0L;
  for (const auto& [rows, cols] : {std::pair{300, 64}, std::pair{1, 1000}, std::pair{129, 7}}) {
    const Slots s(rng, SlotType::kFp32, 2, static_cast<size_t>(rows * cols));
    std::vector<double> sums(NumNormBlocks(rows));
    bool finite = true;
    ASSERT_TRUE(
        GradBlockSumsCpu(s.Grad(1.0f), rows, cols, 0, NumNormBlocks(rows), sums.data(), &finite)
            .ok());
    blocks.insert(blocks.end(), sums.begin(), sums.end());
    for (float gs : s.Gs(1.0f)) exact += static_cast<long double>(gs) * gs;
  }
  const double total = SumInOrder(blocks.data(), static_cast<int64_t>(blocks.size()));
  double in_order = 0.0;
  for (double b : blocks) in_order += b;
  EXPECT_EQ(std::bit_cast<uint64_t>(total), std::bit_cast<uint64_t>(in_order));
  // The tree differs from an exact sum by FP64 rounding only.
  EXPECT_NEAR(total, static_cast<double>(exact), 1e-12 * static_cast<double>(exact));

  const double norm = std::sqrt(static_cast<double>(exact));
  for (const double max_norm : {norm * 0.01, norm * 0.5, norm * 0.999, norm * 2.0, 1e-30}) {
    const float clip = ClipFactor(total, max_norm);
    EXPECT_EQ(clip, reference::ClipFactorRef(total, max_norm));
    const double want = std::min(1.0, max_norm / (norm + 1e-6));
    // One FP32 rounding of the float64 value (half an ulp, 2^-24 relative).
    EXPECT_NEAR(clip, want, want * 0x1p-24) << "max_norm " << max_norm;
  }
  EXPECT_EQ(ClipFactor(total, norm * 10.0), 1.0f) << "no clipping below the maximum norm";
}

}  // namespace
}  // namespace paramd::kernels
