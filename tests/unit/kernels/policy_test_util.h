// Shared by the state-policy tests: the policy list, one tensor's state held in the reference's
// layout (which is the kernels' layout, so the kernel steps the very same vectors), its
// FusedStepArgs, and bitwise comparisons of two states.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/fused_step.h"
#include "reference/adamw_reference.h"
#include "reference/policy_reference.h"

namespace paramd::kernels::testing {

inline const char* MasterName(MasterType t) {
  switch (t) {
    case MasterType::kFp32:
      return "Fp32";
    case MasterType::kBf16Remainder:
      return "Bf16Rem";
    case MasterType::kFp16:
      return "Fp16";
  }
  return "?";
}

inline const char* MomentName(MomentType t) {
  switch (t) {
    case MomentType::kFp32:
      return "Fp32";
    case MomentType::kBf16:
      return "Bf16";
    case MomentType::kFp16:
      return "Fp16";
    case MomentType::kFp8:
      return "Fp8";
  }
  return "?";
}

// e.g. "MasterFp32_MFp8n_VFp8s" (n = nearest, s = stochastic).
inline std::string PolicyName(const StatePolicy& p) {
  auto r = [](Rounding x) { return x == Rounding::kStochastic ? "s" : "n"; };
  return std::string("Master") + MasterName(p.master) + "_M" + MomentName(p.exp_avg) +
         r(p.exp_avg_rounding) + "_V" + MomentName(p.exp_avg_sq) + r(p.exp_avg_sq_rounding);
}

// Every master x exp_avg x exp_avg_sq with the default rounding, plus every quantized moment type
// with the other rounding (on an fp32 master).
inline std::vector<StatePolicy> AllPolicies() {
  const MasterType masters[] = {MasterType::kFp32, MasterType::kBf16Remainder, MasterType::kFp16};
  const MomentType moments[] = {MomentType::kFp32, MomentType::kBf16, MomentType::kFp16,
                                MomentType::kFp8};
  std::vector<StatePolicy> out;
  for (MasterType master : masters) {
    for (MomentType m : moments) {
      for (MomentType v : moments) out.push_back(MakeStatePolicy(master, m, v));
    }
  }
  for (MomentType t : {MomentType::kBf16, MomentType::kFp16, MomentType::kFp8}) {
    StatePolicy p = MakeStatePolicy(MasterType::kFp32, t, t);
    p.exp_avg_rounding = Rounding::kStochastic;
    p.exp_avg_sq_rounding =
        t == MomentType::kFp8 ? Rounding::kNearest : Rounding::kStochastic;  // flip the default
    out.push_back(p);
  }
  return out;
}

inline reference::PolicyRef ToRef(const StatePolicy& p) {
  reference::PolicyRef r;
  r.master = static_cast<reference::MasterRef>(static_cast<int>(p.master));
  r.exp_avg = static_cast<reference::MomentRef>(static_cast<int>(p.exp_avg));
  r.exp_avg_sq = static_cast<reference::MomentRef>(static_cast<int>(p.exp_avg_sq));
  r.exp_avg_stochastic = p.exp_avg_rounding == Rounding::kStochastic;
  r.exp_avg_sq_stochastic = p.exp_avg_sq_rounding == Rounding::kStochastic;
  return r;
}

inline reference::Hyper ToRefHyper(const AdamwHyper& h) {
  return {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
}

// One tensor under a policy: its state (the reference's vectors) and served outputs.
struct PolicyTensor {
  StatePolicy policy;
  size_t n = 0;
  reference::PolicyStateRef state;
  std::vector<float> out_fp32;
  std::vector<uint16_t> out_bf16, out_fp16;

  PolicyTensor(const StatePolicy& p, const std::vector<float>& initial)
      : policy(p),
        n(initial.size()),
        state(reference::MakePolicyStateRef(ToRef(p), initial)),
        out_fp32(initial.size()),
        out_bf16(initial.size()),
        out_fp16(initial.size()) {}

  static void* MomentData(MomentType t, reference::MomentStateRef& m) {
    switch (t) {
      case MomentType::kFp32:
        return m.fp32.data();
      case MomentType::kBf16:
      case MomentType::kFp16:
        return m.u16.data();
      case MomentType::kFp8:
        return m.u8.data();
    }
    return nullptr;
  }

  FusedStepArgs Args(const std::vector<const void*>& slots, SlotType slot_type, float grad_scale,
                     float clip, const AdamwScalars& scalars, const RngStream& rng) {
    FusedStepArgs a;
    a.slots = slots.data();
    a.num_slots = static_cast<int>(slots.size());
    a.slot_type = slot_type;
    a.grad_scale = grad_scale;
    a.clip = clip;
    a.scalars = scalars;
    a.policy = policy;
    a.rng = rng;
    a.numel = static_cast<int64_t>(n);
    if (policy.master == MasterType::kFp32) {
      a.master = state.master_fp32.data();
    } else {
      a.master = state.master_u16.data();
    }
    a.master_remainder =
        policy.master == MasterType::kBf16Remainder ? state.master_remainder.data() : nullptr;
    a.exp_avg = MomentData(policy.exp_avg, state.exp_avg);
    a.exp_avg_scale_inv = state.exp_avg.scale_inv.data();
    a.exp_avg_sq = MomentData(policy.exp_avg_sq, state.exp_avg_sq);
    a.exp_avg_sq_scale_inv = state.exp_avg_sq.scale_inv.data();
    a.out_fp32 = out_fp32.data();
    a.out_bf16 = out_bf16.data();
    a.out_fp16 = out_fp16.data();
    return a;
  }

  // Points a's state sources (FusedStepArgs' *_in) at this tensor's state: a step of another
  // tensor's args then reads this state and writes that tensor's.
  void SetAsSources(FusedStepArgs* a) {
    a->master_in = policy.master == MasterType::kFp32
                       ? static_cast<const void*>(state.master_fp32.data())
                       : state.master_u16.data();
    a->master_remainder_in =
        policy.master == MasterType::kBf16Remainder ? state.master_remainder.data() : nullptr;
    a->exp_avg_in = MomentData(policy.exp_avg, state.exp_avg);
    a->exp_avg_scale_inv_in = state.exp_avg.scale_inv.data();
    a->exp_avg_sq_in = MomentData(policy.exp_avg_sq, state.exp_avg_sq);
    a->exp_avg_sq_scale_inv_in = state.exp_avg_sq.scale_inv.data();
  }
};

inline std::string ToHex(uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%x", x);
  return buf;
}

// Index of the first differing element of two vectors of trivially copyable values, bitwise.
template <typename T>
int64_t FirstDifference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

template <typename T>
std::string ShowDifference(const char* what, const std::vector<T>& got,
                           const std::vector<T>& want) {
  const int64_t i = FirstDifference(got, want);
  if (i < 0) return "";
  if (got.size() != want.size()) return std::string(what) + ": sizes differ";
  uint32_t g = 0, w = 0;
  std::memcpy(&g, &got[static_cast<size_t>(i)], sizeof(T));
  std::memcpy(&w, &want[static_cast<size_t>(i)], sizeof(T));
  return std::string(what) + "[" + std::to_string(i) + "]: got 0x" + ToHex(g) + ", want 0x" +
         ToHex(w) + "; ";
}

// "" when the two tensors' states (and, with outputs, their served copies) are bitwise equal,
// else where they first differ.
inline std::string CompareTensors(const PolicyTensor& got, const PolicyTensor& want,
                                  bool outputs = true) {
  std::string d;
  d += ShowDifference("master_fp32", got.state.master_fp32, want.state.master_fp32);
  d += ShowDifference("master_u16", got.state.master_u16, want.state.master_u16);
  d += ShowDifference("master_remainder", got.state.master_remainder, want.state.master_remainder);
  for (auto [name, g, w] :
       {std::tuple{"exp_avg", &got.state.exp_avg, &want.state.exp_avg},
        std::tuple{"exp_avg_sq", &got.state.exp_avg_sq, &want.state.exp_avg_sq}}) {
    d += ShowDifference((std::string(name) + ".fp32").c_str(), g->fp32, w->fp32);
    d += ShowDifference((std::string(name) + ".u16").c_str(), g->u16, w->u16);
    d += ShowDifference((std::string(name) + ".u8").c_str(), g->u8, w->u8);
    d += ShowDifference((std::string(name) + ".scale_inv").c_str(), g->scale_inv, w->scale_inv);
  }
  if (outputs) {
    d += ShowDifference("out_fp32", got.out_fp32, want.out_fp32);
    d += ShowDifference("out_bf16", got.out_bf16, want.out_bf16);
    d += ShowDifference("out_fp16", got.out_fp16, want.out_fp16);
  }
  return d;
}

}  // namespace paramd::kernels::testing
