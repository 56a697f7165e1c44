// The state policies and the job every policy test runs (tests/unit/server/policy_job_test.cc,
// the backend conformance suite): every master and moment type and rounding, every recipe x
// direction served, shapes with edges, weights with edges.
#pragma once

#include <algorithm>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "paramd/v1/control.pb.h"
#include "tests/unit/server/reference_job.h"

namespace paramd::testing {

inline constexpr v1::Recipe kRecipes[] = {
    v1::RECIPE_FP32,        v1::RECIPE_BF16,      v1::RECIPE_FP16, v1::RECIPE_FP8_TENSOR,
    v1::RECIPE_FP8_DELAYED, v1::RECIPE_FP8_BLOCK, v1::RECIPE_MXFP8};
inline constexpr v1::Direction kDirections[] = {v1::DIRECTION_ROWWISE, v1::DIRECTION_COLUMNWISE};

struct PolicyCase {
  std::string name;
  v1::StatePolicy policy;
  int delayed_history = 0;  // fp8_delayed's amax_history (0 = the default, 16)
  int delayed_margin = 0;
};
inline void PrintTo(const PolicyCase& c, std::ostream* os) { *os << c.name; }

inline v1::StatePolicy Policy(v1::MasterType master, v1::MomentType exp_avg,
                              v1::MomentType exp_avg_sq,
                              v1::Rounding exp_avg_rounding = v1::ROUNDING_UNSPECIFIED,
                              v1::Rounding exp_avg_sq_rounding = v1::ROUNDING_UNSPECIFIED) {
  v1::StatePolicy p;
  p.set_master(master);
  p.set_exp_avg(exp_avg);
  p.set_exp_avg_sq(exp_avg_sq);
  p.set_exp_avg_rounding(exp_avg_rounding);
  p.set_exp_avg_sq_rounding(exp_avg_sq_rounding);
  return p;
}

inline std::vector<PolicyCase> Cases() {
  constexpr auto kFp32 = v1::MOMENT_TYPE_FP32, kBf16 = v1::MOMENT_TYPE_BF16,
                 kFp16 = v1::MOMENT_TYPE_FP16, kFp8 = v1::MOMENT_TYPE_FP8;
  constexpr auto kStochastic = v1::ROUNDING_STOCHASTIC, kNearest = v1::ROUNDING_NEAREST;
  return {
      // Every enum left UNSPECIFIED: the fp32 policy.
      {"Fp32", v1::StatePolicy(), 0, 0},
      {"Bf16RemainderMaster", Policy(v1::MASTER_TYPE_BF16_REMAINDER, kFp32, kFp32), 3, 1},
      {"Fp16Master", Policy(v1::MASTER_TYPE_FP16, kFp32, kFp32), 1, 0},
      {"Bf16Moments", Policy(v1::MASTER_TYPE_FP32, kBf16, kBf16), 2, 3},
      {"Fp16Moments", Policy(v1::MASTER_TYPE_FP32, kFp16, kFp16), 3, 0},
      {"Fp8ExpAvgFp16ExpAvgSq", Policy(v1::MASTER_TYPE_FP32, kFp8, kFp16), 0, 0},
      {"Fp8BothWithDefaultRounding", Policy(v1::MASTER_TYPE_FP32, kFp8, kFp8), 3, 1},
      {"Fp8BothNearest", Policy(v1::MASTER_TYPE_FP32, kFp8, kFp8, kNearest, kNearest), 2, 0},
      {"StochasticBf16AndFp16MomentsOnABf16RemainderMaster",
       Policy(v1::MASTER_TYPE_BF16_REMAINDER, kBf16, kFp16, kStochastic, kStochastic), 3, 2},
      {"StochasticFp8ExpAvgOnAnFp16Master",
       Policy(v1::MASTER_TYPE_FP16, kFp8, kFp8, kStochastic, v1::ROUNDING_UNSPECIFIED), 4, 0},
  };
}

// Shapes: one element; odd sizes (partial SIMD vectors, mxfp8 and fp8_block edge blocks); several
// 128-row panels with a partial last one; a 1-D tensor. Gradients in fp32 and bf16 slots.
inline v1::RegisterRequest PolicySpec(const PolicyCase& c) {
  v1::RegisterRequest spec = MakeSpec("policy", 2,
                                      {{"scalar", 1, 1, v1::ELEMENT_TYPE_FP32},
                                       {"odd", 7, 13, v1::ELEMENT_TYPE_BF16},
                                       {"panels", 131, 257, v1::ELEMENT_TYPE_FP32},
                                       {"vector", 1, 1000, v1::ELEMENT_TYPE_BF16}});
  *spec.mutable_state_policy() = c.policy;
  spec.clear_serve();
  for (v1::Recipe recipe : kRecipes) {
    for (v1::Direction direction : kDirections) {
      v1::ServeFormat* f = spec.add_serve();
      f->set_recipe(recipe);
      f->set_direction(direction);
      if (recipe == v1::RECIPE_FP8_DELAYED) {
        f->set_amax_history(c.delayed_history);
        f->set_margin(c.delayed_margin);
      }
    }
  }
  return spec;
}

// N(0, 0.02) weights with edges: a zero 1x1 tensor (fp8_tensor's amax 0 keeps the first scale 1),
// and in the 1-D tensor signed zeros, FP32 and FP16 subnormals, a value FP16 saturates, and
// values on BF16 and FP16 rounding ties.
inline std::vector<std::vector<float>> PolicyWeights(const v1::RegisterRequest& spec) {
  std::vector<std::vector<float>> w = RandomWeights(spec, 41);
  w[0][0] = 0.0f;
  const std::vector<float> edges = {0.0f,
                                    -0.0f,
                                    1e-40f,
                                    -3e-6f,
                                    7e4f,
                                    1.0f + 0x1p-8f,
                                    -(1.0f + 0x3p-8f),
                                    1.0f + 0x1p-11f,
                                    0x1.0018p0f,
                                    0x1p-20f};
  std::copy(edges.begin(), edges.end(), w[3].begin());
  return w;
}

inline std::optional<double> StepLr(int64_t step) {
  return step % 2 == 1 ? std::nullopt : std::optional<double>(1e-3 * (1.0 + 0.5 * step));
}
inline std::optional<double> StepGradScale(int64_t step) {
  return step == 2 ? std::nullopt : std::optional<double>(0.5);
}

}  // namespace paramd::testing
