// DESIGN.md §3's accuracy bars for every state policy: after 1000 steps of the reference setup
// (8192 weights from N(0, 0.02); gradients N(0, 1e-3) * (1 + 0.5 N(0, 1)); lr 1e-3, betas
// (0.9, 0.999), eps 1e-8, weight decay 0.01) the weights stay within each policy's norm-relative
// bar of a float64 AdamW fed the same FP32 gradients. Also: harsh hyper-parameters keep every
// policy finite.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/fused_step.h"
#include "reference/adamw_reference.h"
#include "reference/policy_reference.h"
#include "tests/unit/kernels/kernels_test_util.h"
#include "tests/unit/kernels/policy_test_util.h"

namespace paramd::kernels {
namespace {

using testing::PolicyTensor;
using testing::Tolerances;

struct Bar {
  const char* name;
  StatePolicy policy;
  double bar;  // 0: printed, not checked
};

std::vector<Bar> Bars() {
  StatePolicy all_nearest = MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp8);
  all_nearest.exp_avg_sq_rounding = Rounding::kNearest;
  return {
      {"fp32", MakeStatePolicy(MasterType::kFp32, MomentType::kFp32, MomentType::kFp32),
       Tolerances::kFp32PolicyVsFloat64},
      {"bf16+remainder master",
       MakeStatePolicy(MasterType::kBf16Remainder, MomentType::kFp32, MomentType::kFp32),
       Tolerances::kBf16RemainderVsFloat64},
      {"fp16 master", MakeStatePolicy(MasterType::kFp16, MomentType::kFp32, MomentType::kFp32),
       Tolerances::kFp16MasterVsFloat64},
      {"block fp16 moments",
       MakeStatePolicy(MasterType::kFp32, MomentType::kFp16, MomentType::kFp16),
       Tolerances::kFp16MomentsVsFloat64},
      {"bf16 moments", MakeStatePolicy(MasterType::kFp32, MomentType::kBf16, MomentType::kBf16),
       Tolerances::kBf16MomentsVsFloat64},
      {"fp8 exp_avg + block fp16 exp_avg_sq",
       MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp16),
       Tolerances::kFp8MFp16VVsFloat64},
      {"fp8 both, default rounding",
       MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp8),
       Tolerances::kFp8MomentsVsFloat64},
      {"fp8 both, all nearest (no bar)", all_nearest, 0.0},
  };
}

// Runs `steps` steps of every policy and of float64 AdamW on the same gradients; returns the
// norm-relative error of each policy's stored master, and whether everything stayed finite.
struct Outcome {
  std::vector<double> rel;
  std::vector<bool> finite;
};

Outcome RunPolicies(const AdamwHyper& hyper, int steps, const std::vector<Bar>& bars) {
  constexpr size_t kWeights = 8192;
  std::mt19937_64 rng(2026);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> initial(kWeights);
  for (float& w : initial) w = static_cast<float>(0.02 * normal(rng));
  std::vector<double> p64(initial.begin(), initial.end()), m64(kWeights, 0.0), v64(kWeights, 0.0);
  std::vector<PolicyTensor> tensors;
  for (const Bar& b : bars) tensors.emplace_back(b.policy, initial);

  std::vector<float> grad(kWeights);
  std::vector<double> grad64(kWeights);
  const std::vector<const void*> slots = {grad.data()};
  for (int64_t k = 1; k <= steps; ++k) {
    for (size_t i = 0; i < kWeights; ++i) {
      grad[i] = static_cast<float>(1e-3 * normal(rng) * (1.0 + 0.5 * normal(rng)));
      grad64[i] = grad[i];
    }
    const AdamwScalars scalars = MakeAdamwScalars(hyper, k);
    for (PolicyTensor& t : tensors) {
      const KStatus st = FusedStepCpu(
          t.Args(slots, SlotType::kFp32, 1.0f, 1.0f, scalars, {2026, static_cast<uint32_t>(k), 0}),
          0, kWeights);
      EXPECT_TRUE(st.ok()) << st.message();
    }
    reference::AdamwStepF64(testing::ToRefHyper(hyper), k, grad64.data(), p64.data(), m64.data(),
                            v64.data(), kWeights);
  }

  Outcome out;
  for (const PolicyTensor& t : tensors) {
    const reference::PolicyRef policy = testing::ToRef(t.policy);
    double diff2 = 0.0, norm2 = 0.0;
    bool finite = true;
    for (size_t i = 0; i < kWeights; ++i) {
      const double p = reference::MasterValueRef(policy, t.state, i);
      finite = finite && std::isfinite(p) &&
               std::isfinite(reference::MomentValueRef(policy.exp_avg, t.state.exp_avg, i)) &&
               std::isfinite(reference::MomentValueRef(policy.exp_avg_sq, t.state.exp_avg_sq, i));
      diff2 += (p - p64[i]) * (p - p64[i]);
      norm2 += p64[i] * p64[i];
    }
    out.rel.push_back(std::sqrt(diff2 / norm2));
    out.finite.push_back(finite);
  }
  return out;
}

TEST(PolicyAccuracyTest, EveryPolicyStaysWithinItsBarOfFloat64After1000Steps) {
  const std::vector<Bar> bars = Bars();
  const Outcome out = RunPolicies(testing::AccuracySetupHyper(), 1000, bars);
  std::printf("%-40s %12s %10s\n", "policy (1000 steps)", "||p-p64||/||p64||", "bar");
  for (size_t b = 0; b < bars.size(); ++b) {
    std::printf("%-40s %12.3e %10.1e\n", bars[b].name, out.rel[b], bars[b].bar);
    RecordProperty(std::string("rel_") + std::to_string(b), std::to_string(out.rel[b]));
    EXPECT_TRUE(out.finite[b]) << bars[b].name;
    if (bars[b].bar > 0.0) {
      EXPECT_LT(out.rel[b], bars[b].bar) << bars[b].name;
    }
  }
  EXPECT_EQ(out.rel[0], out.rel[1]) << "bf16+remainder is the fp32 policy, bit for bit";
}

TEST(PolicyAccuracyTest, HarshHyperParametersKeepEveryPolicyFiniteAndNearFloat64) {
  AdamwHyper harsh = testing::AccuracySetupHyper();
  harsh.lr = 1.0;
  harsh.beta1 = 0.1;
  harsh.beta2 = 0.25;
  const std::vector<Bar> bars = Bars();
  const Outcome out = RunPolicies(harsh, 300, bars);
  std::printf("%-40s %12s %10s\n", "policy (lr 1, betas 0.1/0.25, 300 steps)", "rel", "bar");
  for (size_t b = 0; b < bars.size(); ++b) {
    std::printf("%-40s %12.3e %10.1e\n", bars[b].name, out.rel[b], Tolerances::kHarshVsFloat64);
    EXPECT_TRUE(out.finite[b]) << bars[b].name;
    EXPECT_LT(out.rel[b], Tolerances::kHarshVsFloat64) << bars[b].name;
  }
}

}  // namespace
}  // namespace paramd::kernels
