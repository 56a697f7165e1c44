// GradCheckCuda against the CPU step rules (kernels/step_rules.h): the FP64 sums of squares of
// every 128-row block in the exact pairwise order (bit-identical), for many tensors in one call,
// and finiteness (inf, NaN, a square that overflows).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_step.h"
#include "kernels/step_rules.h"
#include "tests/gpu/gpu_test_util.h"

namespace paramd::kernels {
namespace {

using testing::CudaTest;
using testing::DeviceBuffer;
using testing::GradValue;

struct Shape {
  int64_t rows, cols;
};

struct GradTensor {
  Shape shape;
  SlotType type;
  std::vector<std::vector<unsigned char>> slots;
  std::vector<DeviceBuffer> d_slots;
  // Unused state the plan needs.
  DeviceBuffer master, m, v;
};

class StepRulesCudaTest : public CudaTest {
 protected:
  // Returns the GPU's block sums and finiteness next to the CPU's for these tensors.
  void Check(const std::vector<Shape>& shapes, uint64_t seed, float poison_value) {
    std::mt19937_64 rng(seed);
    std::vector<GradTensor> tensors(shapes.size());
    std::vector<CudaStepTensor> described;
    for (size_t j = 0; j < shapes.size(); ++j) {
      GradTensor& t = tensors[j];
      t.shape = shapes[j];
      t.type = j % 2 == 0 ? SlotType::kFp32 : SlotType::kBf16;
      const int64_t n = t.shape.rows * t.shape.cols;
      const int ranks = 1 + static_cast<int>(j % 3);
      for (int r = 0; r < ranks; ++r) {
        std::vector<unsigned char> bytes(n * (t.type == SlotType::kFp32 ? 4 : 2));
        for (int64_t i = 0; i < n; ++i) {
          float g = GradValue(rng, 1e-2f);
          if (poison_value != 0.0f && j == shapes.size() / 2 && i == n / 2 && r == 0) {
            g = poison_value;
          }
          if (t.type == SlotType::kFp32) {
            std::memcpy(bytes.data() + 4 * i, &g, 4);
          } else {
            const uint16_t b = Bf16FromFloat(g);
            std::memcpy(bytes.data() + 2 * i, &b, 2);
          }
        }
        t.d_slots.emplace_back(bytes.size());
        PARAMD_CUDA_OK(t.d_slots.back().Upload(bytes));
        t.slots.push_back(std::move(bytes));
      }
      t.master = DeviceBuffer(4 * n);
      t.m = DeviceBuffer(4 * n);
      t.v = DeviceBuffer(4 * n);
      CudaStepTensor c;
      c.rows = t.shape.rows;
      c.cols = t.shape.cols;
      c.slot_type = t.type;
      for (DeviceBuffer& s : t.d_slots) c.d_slots.push_back(s.get());
      c.d_master = t.master.get();
      c.d_exp_avg = t.m.get();
      c.d_exp_avg_sq = t.v.get();
      described.push_back(c);
    }
    CudaStepPlan plan;
    KStatus st = CudaStepPlan::Create(described, &plan);
    ASSERT_TRUE(st.ok()) << st.message();
    DeviceBuffer workspace(plan.workspace_bytes());
    ASSERT_TRUE(plan.Bind(workspace.get(), plan.workspace_bytes(), stream_).ok());
    DeviceBuffer sums(plan.num_norm_blocks() * 8), finite(4), finite_only(4);
    const float grad_scale = 0.37f;
    st = GradCheckCuda(plan, grad_scale, sums.as<double>(), finite.as<int>(), stream_);
    ASSERT_TRUE(st.ok()) << st.message();
    st = GradCheckCuda(plan, grad_scale, nullptr, finite_only.as<int>(), stream_);
    ASSERT_TRUE(st.ok()) << st.message();
    PARAMD_CUDA_OK(cudaStreamSynchronize(stream_));
    const std::vector<double> gpu = sums.Download<double>(plan.num_norm_blocks());
    const int gpu_finite = finite.Download<int>(1)[0];
    const int gpu_finite_only = finite_only.Download<int>(1)[0];

    bool cpu_finite = true;
    size_t at = 0;
    for (size_t j = 0; j < tensors.size(); ++j) {
      GradTensor& t = tensors[j];
      std::vector<const void*> ptrs;
      for (auto& s : t.slots) ptrs.push_back(s.data());
      const GradSlots g{ptrs.data(), static_cast<int>(ptrs.size()), t.type, grad_scale};
      const int64_t blocks = NumNormBlocks(t.shape.rows);
      std::vector<double> cpu(blocks);
      ASSERT_TRUE(
          GradBlockSumsCpu(g, t.shape.rows, t.shape.cols, 0, blocks, cpu.data(), &cpu_finite).ok());
      for (int64_t b = 0; b < blocks; ++b, ++at) {
        if (std::isnan(cpu[b]) && std::isnan(gpu[at])) continue;
        EXPECT_EQ(std::bit_cast<uint64_t>(gpu[at]), std::bit_cast<uint64_t>(cpu[b]))
            << "tensor " << j << " [" << t.shape.rows << "x" << t.shape.cols << "] block " << b
            << ": gpu " << gpu[at] << ", cpu " << cpu[b];
      }
    }
    EXPECT_EQ(gpu_finite != 0, cpu_finite);
    EXPECT_EQ(gpu_finite_only != 0, cpu_finite);
    EXPECT_EQ(cpu_finite, poison_value == 0.0f);
  }
};

const std::vector<Shape> kShapes = {{1, 1},      {7, 13},     {1, 300000}, {1000, 129},
                                    {300, 4096}, {129, 1},    {128, 128},  {257, 384},
                                    {5, 99991},  {2048, 640}, {3, 200}};

TEST_F(StepRulesCudaTest, BlockSumsAreBitIdenticalToTheCpu) { Check(kShapes, 11, 0.0f); }

TEST_F(StepRulesCudaTest, InfinityIsFound) { Check(kShapes, 12, INFINITY); }

TEST_F(StepRulesCudaTest, NanIsFound) { Check(kShapes, 13, NAN); }

TEST_F(StepRulesCudaTest, AnOverflowingSquareIsFound) {
  Check(kShapes, 14, 1e20f);  // (1e20 * 0.37)^2 is past FLT_MAX; 3e19 squared was not
}

// The clip of a step decided on the device is the host's bit for bit: sums of very different
// magnitudes (the order matters), counts from 1 to thousands, norms above and below max_grad_norm.
TEST_F(StepRulesCudaTest, TheDeviceDecisionsClipIsTheHostsBitForBit) {
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<double> exponent(-30.0, 30.0);
  DeviceBuffer clip(4);
  for (int64_t n : {1, 2, 3, 17, 128, 4099}) {
    std::vector<double> sums(static_cast<size_t>(n));
    for (double& x : sums) x = std::pow(2.0, exponent(rng)) * (1.0 + exponent(rng) / 64.0);
    DeviceBuffer d_sums(sums.size() * 8);
    ASSERT_EQ(d_sums.Upload(sums), cudaSuccess);
    const double total = SumInOrder(sums.data(), n);
    for (double max_norm : {1e-3, 1.0, std::sqrt(total), 1e12}) {
      ASSERT_TRUE(
          StepDecisionCuda(d_sums.as<double>(), n, max_norm, clip.as<float>(), nullptr).ok());
      const float want = ClipFactor(total, max_norm);
      const float got = clip.Download<float>(1)[0];
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
          << "n " << n << ", max_norm " << max_norm << ": " << got << " vs " << want;
    }
  }
  EXPECT_FALSE(StepDecisionCuda(nullptr, 3, 1.0, clip.as<float>(), nullptr).ok());
  EXPECT_FALSE(StepDecisionCuda(nullptr, 0, 0.0, clip.as<float>(), nullptr).ok());
}

// A skipped step's copies run only where the flag says skipped, whole, at any size and alignment,
// and more of them than one launch takes.
TEST_F(StepRulesCudaTest, SkipCopiesRunOnlyForASkippedStep) {
  std::mt19937_64 rng(22);
  std::vector<int64_t> sizes;
  for (int i = 0; i < 70; ++i) sizes.push_back(static_cast<int64_t>(rng() % 5000));
  sizes.push_back(3 << 20);
  for (int skipped : {0, 1}) {
    DeviceBuffer flag(4);
    ASSERT_EQ(flag.Upload(std::vector<int>{skipped ? 0 : 1}), cudaSuccess);
    std::vector<DeviceBuffer> src, dst;
    std::vector<std::vector<uint8_t>> want;
    std::vector<CudaSkipCopy> copies;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t at = static_cast<int64_t>(i % 3);  // offsets 0, 1, 2: not all aligned
      std::vector<uint8_t> bytes(static_cast<size_t>(sizes[i] + 3));
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
      src.emplace_back(bytes.size());
      dst.emplace_back(bytes.size());
      ASSERT_EQ(src.back().Upload(bytes), cudaSuccess);
      ASSERT_EQ(dst.back().Poison(0x5A), cudaSuccess);
      std::vector<uint8_t> expect(bytes.size(), 0x5A);
      if (skipped) {
        std::copy(bytes.begin() + at, bytes.begin() + at + sizes[i], expect.begin() + at);
      }
      want.push_back(expect);
      copies.push_back({dst.back().as<uint8_t>() + at, src.back().as<uint8_t>() + at, sizes[i]});
    }
    ASSERT_TRUE(CopyIfSkippedCuda(copies, flag.as<int>(), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t i = 0; i < copies.size(); ++i) {
      EXPECT_EQ(dst[i].Download<uint8_t>(want[i].size()), want[i])
          << "copy " << i << " of " << sizes[i] << " bytes, skipped " << skipped;
    }
  }
}

}  // namespace
}  // namespace paramd::kernels
