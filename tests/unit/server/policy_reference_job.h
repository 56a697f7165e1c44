// The scalar model of a whole job under any state policy and serve formats, built only from
// paramd_reference (which does not link kernels/): the rank-ordered slot sums, the step rules
// (finiteness, block sums of squares, clip), the policy step (reference/policy_reference.h), and
// every served format from the stored master (reference/quantize_reference.h), with fp8_tensor's
// previous scale and fp8_delayed's amax history carried from step to step (DESIGN.md §2-§3). Like
// reference_job.h it knows none of the daemon's classes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "paramd/v1/control.pb.h"
#include "reference/adamw_reference.h"
#include "reference/policy_reference.h"
#include "reference/quantize_reference.h"
#include "reference/step_rules_reference.h"
#include "tests/unit/server/reference_job.h"

namespace paramd::testing {

// DESIGN.md §3's policy as the reference spells it. UNSPECIFIED values mean their defaults: fp32
// types; stochastic rounding for an fp8 exp_avg_sq, nearest elsewhere.
inline reference::PolicyRef PolicyRefOf(const v1::StatePolicy& p) {
  auto moment = [](v1::MomentType t) {
    switch (t) {
      case v1::MOMENT_TYPE_BF16:
        return reference::MomentRef::kBf16;
      case v1::MOMENT_TYPE_FP16:
        return reference::MomentRef::kFp16;
      case v1::MOMENT_TYPE_FP8:
        return reference::MomentRef::kFp8;
      default:
        return reference::MomentRef::kFp32;
    }
  };
  reference::PolicyRef ref;
  ref.master = p.master() == v1::MASTER_TYPE_BF16_REMAINDER ? reference::MasterRef::kBf16Remainder
               : p.master() == v1::MASTER_TYPE_FP16         ? reference::MasterRef::kFp16
                                                            : reference::MasterRef::kFp32;
  ref.exp_avg = moment(p.exp_avg());
  ref.exp_avg_sq = moment(p.exp_avg_sq());
  ref.exp_avg_stochastic = p.exp_avg_rounding() == v1::ROUNDING_STOCHASTIC;
  ref.exp_avg_sq_stochastic = p.exp_avg_sq_rounding() == v1::ROUNDING_STOCHASTIC ||
                              (p.exp_avg_sq_rounding() == v1::ROUNDING_UNSPECIFIED &&
                               p.exp_avg_sq() == v1::MOMENT_TYPE_FP8);
  return ref;
}

inline reference::RecipeRef RecipeRefOf(v1::Recipe recipe) {
  switch (recipe) {
    case v1::RECIPE_BF16:
      return reference::RecipeRef::kBf16;
    case v1::RECIPE_FP16:
      return reference::RecipeRef::kFp16;
    case v1::RECIPE_FP8_TENSOR:
      return reference::RecipeRef::kFp8Tensor;
    case v1::RECIPE_FP8_DELAYED:
      return reference::RecipeRef::kFp8Delayed;
    case v1::RECIPE_FP8_BLOCK:
      return reference::RecipeRef::kFp8Block;
    case v1::RECIPE_MXFP8:
      return reference::RecipeRef::kMxfp8;
    default:
      return reference::RecipeRef::kFp32;
  }
}

// g0 of every element of tensor `i`: the FP32 sum of the ranks' slots in rank order.
inline std::vector<float> RankOrderedSums(const v1::RegisterRequest& spec,
                                          const StepGradients& grads, int i) {
  const v1::TensorSpec& t = spec.tensors(i);
  const size_t n = static_cast<size_t>(Elements(t));
  const int ranks = spec.world_size();
  std::vector<float> g0(n);
  if (t.grad_type() == v1::ELEMENT_TYPE_BF16) {
    std::vector<std::vector<uint16_t>> slots;
    std::vector<const uint16_t*> ptrs;
    for (int r = 0; r < ranks; ++r) slots.push_back(FromBytes<uint16_t>(grads[i][r]));
    for (const auto& s : slots) ptrs.push_back(s.data());
    for (size_t e = 0; e < n; ++e) g0[e] = reference::SumSlotsBf16(ptrs.data(), ranks, e);
  } else {
    std::vector<std::vector<float>> slots;
    std::vector<const float*> ptrs;
    for (int r = 0; r < ranks; ++r) slots.push_back(FromBytes<float>(grads[i][r]));
    for (const auto& s : slots) ptrs.push_back(s.data());
    for (size_t e = 0; e < n; ++e) g0[e] = reference::SumSlotsFp32(ptrs.data(), ranks, e);
  }
  return g0;
}

// Transposes a row-major [rows, cols] array of `bytes`-byte elements.
inline std::vector<uint8_t> TransposedBytes(const std::vector<uint8_t>& in, int64_t rows,
                                            int64_t cols, size_t bytes) {
  std::vector<uint8_t> out(in.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      std::memcpy(&out[static_cast<size_t>(c * rows + r) * bytes],
                  &in[static_cast<size_t>(r * cols + c) * bytes], bytes);
    }
  }
  return out;
}

class PolicyReferenceJob {
 public:
  PolicyReferenceJob(const v1::RegisterRequest& spec,
                     const std::vector<std::vector<float>>& initial)
      : spec_(spec), hyper_(spec.hyperparams()), policy_(PolicyRefOf(spec.state_policy())) {
    for (const v1::ServeFormat& f : spec.serve()) {
      if (f.recipe() != v1::RECIPE_FP8_DELAYED) continue;
      history_len_ = f.amax_history() == 0 ? 16 : f.amax_history();
      margin_ = f.margin();
    }
    for (size_t i = 0; i < initial.size(); ++i) {
      Tensor& t = tensors_.emplace_back();
      t.state = reference::MakePolicyStateRef(policy_, initial[i]);
      // Version 0: fp8_tensor from the stored master's amax (previous scale 1); fp8_delayed from
      // the empty history (1).
      const std::vector<float> master = MasterValues(static_cast<int>(i));
      t.tensor_scale = reference::ScaleFromAmaxRef(
          reference::AmaxRef(master.data(), static_cast<int64_t>(master.size())), 448.0, 1.0f);
      t.delayed_scale = 1.0f;
    }
  }

  const reference::PolicyRef& policy() const { return policy_; }
  int64_t applied_steps() const { return k_; }
  int history_len() const { return history_len_; }

  // gs = g0 * (float)grad_scale of every element of tensor `i`.
  std::vector<float> ScaledGradients(const StepGradients& grads, int i, double grad_scale) const {
    std::vector<float> gs = RankOrderedSums(spec_, grads, i);
    const float scale = static_cast<float>(grad_scale);
    for (float& x : gs) x = x * scale;
    return gs;
  }

  // Whether every tensor's gs is finite with a finite square (else the step is skipped).
  bool AllFinite(const StepGradients& grads, double grad_scale) const {
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      for (float gs : ScaledGradients(grads, i, grad_scale)) {
        if (!reference::GradFiniteRef(gs)) return false;
      }
    }
    return true;
  }

  // The job's sum of squares of gs in DESIGN.md §2's order: block sums (pairwise over chunks,
  // pairwise within a chunk) added one after another in registration order, then block order.
  double SumOfSquares(const StepGradients& grads, double grad_scale) const {
    double total = 0.0;
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      const std::vector<float> gs = ScaledGradients(grads, i, grad_scale);
      for (double block : reference::BlockSumsOfSquaresRef(gs.data(), spec_.tensors(i).rows(),
                                                           spec_.tensors(i).cols())) {
        total = total + block;
      }
    }
    return total;
  }

  // The clip factor of a step: 1 without clipping (max_grad_norm 0).
  float Clip(const StepGradients& grads, double grad_scale) const {
    if (spec_.max_grad_norm() <= 0) return 1.0f;
    return reference::ClipFactorRef(SumOfSquares(grads, grad_scale), spec_.max_grad_norm());
  }

  // One step of the job: skipped (nothing changes, false) when a gradient is not finite, else
  // applied with the clip of the step rules and k = applied steps + 1.
  bool Step(const StepGradients& grads, std::optional<double> lr, double grad_scale) {
    if (!AllFinite(grads, grad_scale)) return false;
    const float clip = Clip(grads, grad_scale);
    ++k_;
    const reference::Hyper h{lr.value_or(hyper_.lr()), hyper_.beta1(), hyper_.beta2(), hyper_.eps(),
                             hyper_.weight_decay()};
    const float scale = static_cast<float>(grad_scale);
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      Tensor& t = tensors_[static_cast<size_t>(i)];
      std::vector<float> g = RankOrderedSums(spec_, grads, i);
      for (float& x : g) x = reference::ClippedGradRef(x, scale, clip);
      const reference::RngRef rng{spec_.seed(), static_cast<uint32_t>(k_),
                                  static_cast<uint32_t>(i)};
      reference::PolicyStepRef(policy_, h, k_, rng, g.data(), g.size(), &t.state);
      // The per-tensor scales of the new version: fp8_delayed from the history as it stands,
      // then this step's amax appended; fp8_tensor from this step's amax and the previous scale.
      const std::vector<float> master = MasterValues(i);
      const float amax = static_cast<float>(
          reference::AmaxRef(master.data(), static_cast<int64_t>(master.size())));
      const std::vector<float> history(t.history.begin(), t.history.end());
      t.delayed_scale = reference::DelayedScaleRef(history.data(), static_cast<int>(history.size()),
                                                   margin_, t.delayed_scale);
      t.history.push_back(amax);
      if (static_cast<int>(t.history.size()) > history_len_) t.history.pop_front();
      t.tensor_scale = reference::ScaleFromAmaxRef(amax, 448.0, t.tensor_scale);
    }
    return true;
  }

  // The stored master of tensor `i` as FP32 values (reconstructed or decoded).
  std::vector<float> MasterValues(int i) const {
    const Tensor& t = tensors_[static_cast<size_t>(i)];
    const size_t n = static_cast<size_t>(Elements(spec_.tensors(i)));
    std::vector<float> values(n);
    for (size_t e = 0; e < n; ++e) values[e] = reference::MasterValueRef(policy_, t.state, e);
    return values;
  }

  // The served bytes (data, then scales) of tensor `i` in one format, current version.
  std::vector<uint8_t> Served(int i, v1::Recipe recipe, v1::Direction direction) const {
    const Tensor& t = tensors_[static_cast<size_t>(i)];
    const int64_t rows = spec_.tensors(i).rows(), cols = spec_.tensors(i).cols();
    const bool columnwise = direction == v1::DIRECTION_COLUMNWISE;
    if (recipe == v1::RECIPE_BF16 && policy_.master == reference::MasterRef::kBf16Remainder) {
      // A bf16+remainder master serves its stored high half (ties away from zero).
      std::vector<uint8_t> halves(t.state.master_u16.size() * 2);
      std::memcpy(halves.data(), t.state.master_u16.data(), halves.size());
      return columnwise ? TransposedBytes(halves, rows, cols, 2) : halves;
    }
    const std::vector<float> master = MasterValues(i);
    const float scale = recipe == v1::RECIPE_FP8_TENSOR    ? t.tensor_scale
                        : recipe == v1::RECIPE_FP8_DELAYED ? t.delayed_scale
                                                           : 1.0f;
    reference::ServedRef served =
        reference::ServeRef(RecipeRefOf(recipe), columnwise, master.data(), rows, cols, scale);
    served.data.insert(served.data.end(), served.scales.begin(), served.scales.end());
    return served.data;
  }

  float tensor_scale(int i) const { return tensors_[static_cast<size_t>(i)].tensor_scale; }
  float delayed_scale(int i) const { return tensors_[static_cast<size_t>(i)].delayed_scale; }
  const reference::PolicyStateRef& state(int i) const {
    return tensors_[static_cast<size_t>(i)].state;
  }

 private:
  struct Tensor {
    reference::PolicyStateRef state;
    float tensor_scale = 1.0f;   // fp8_tensor: the scale of the current version
    float delayed_scale = 1.0f;  // fp8_delayed: likewise
    std::deque<float> history;   // fp8_delayed: amax of the last applied steps, oldest first
  };

  v1::RegisterRequest spec_;
  v1::AdamwHyperparams hyper_;
  reference::PolicyRef policy_;
  int history_len_ = 16;
  int margin_ = 0;
  std::vector<Tensor> tensors_;
  int64_t k_ = 0;
};

}  // namespace paramd::testing
