// DESIGN.md §3's accuracy bar for the fp32 policy: after 1000 steps on the reference setup, the
// weights stay within a norm-relative 1e-4 of a float64 AdamW fed the same gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/fused_step.h"
#include "reference/adamw_reference.h"
#include "tests/unit/kernels/kernels_test_util.h"

namespace paramd::kernels {
namespace {

TEST(AdamwAccuracyTest, Fp32PolicyStaysWithinTheBarOfFloat64After1000Steps) {
  constexpr size_t kWeights = 8192;
  constexpr int kSteps = 1000;
  const AdamwHyper hyper = testing::AccuracySetupHyper();
  const reference::Hyper hyper64{hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay};
  std::mt19937_64 rng(2026);
  std::normal_distribution<double> normal(0.0, 1.0);

  std::vector<float> p(kWeights), m(kWeights, 0.0f), v(kWeights, 0.0f), grad(kWeights);
  std::vector<double> p64(kWeights), m64(kWeights, 0.0), v64(kWeights, 0.0), grad64(kWeights);
  for (size_t i = 0; i < kWeights; ++i) {
    p[i] = static_cast<float>(0.02 * normal(rng));
    p64[i] = p[i];
  }
  const void* slot = grad.data();
  FusedStepArgs args;
  args.slots = &slot;
  args.num_slots = 1;
  args.master = p.data();
  args.exp_avg = m.data();
  args.exp_avg_sq = v.data();

  for (int64_t k = 1; k <= kSteps; ++k) {
    // Both models see the same FP32 gradient, so the difference is the optimizer arithmetic.
    for (size_t i = 0; i < kWeights; ++i) {
      grad[i] = static_cast<float>(1e-3 * normal(rng) * (1.0 + 0.5 * normal(rng)));
      grad64[i] = grad[i];
    }
    args.scalars = MakeAdamwScalars(hyper, k);
    const KStatus st = FusedStepCpu(args, 0, kWeights);
    ASSERT_TRUE(st.ok()) << st.message();
    reference::AdamwStepF64(hyper64, k, grad64.data(), p64.data(), m64.data(), v64.data(),
                            kWeights);
  }

  double diff2 = 0.0, norm2 = 0.0;
  for (size_t i = 0; i < kWeights; ++i) {
    diff2 += (p[i] - p64[i]) * (p[i] - p64[i]);
    norm2 += p64[i] * p64[i];
  }
  const double rel = std::sqrt(diff2 / norm2);
  std::printf(
      "fp32 policy vs float64 AdamW after %d steps: ||p - p64|| / ||p64|| = %.3e (bar %.0e)\n",
      kSteps, rel, testing::Tolerances::kFp32PolicyVsFloat64);
  RecordProperty("norm_relative_error", std::to_string(rel));
  EXPECT_LT(rel, testing::Tolerances::kFp32PolicyVsFloat64);
}

}  // namespace
}  // namespace paramd::kernels
