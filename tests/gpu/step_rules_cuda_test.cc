// GradCheckCuda against the CPU step rules (kernels/step_rules.h): the FP64 sums of squares of
// every 128-row block in the exact pairwise order (bit-identical), for many tensors in one call,
// and finiteness (inf, NaN, a square that overflows).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace paramd::kernels
