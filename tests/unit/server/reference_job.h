// Shared by the server tests (unit and integration): job descriptions, seeded data as the bytes a
// trainer pushes, the scalar model of a whole job (paramd_reference, which does not link kernels/),
// bit-for-bit and job-status comparisons. Nothing here knows the daemon's classes.
#pragma once

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "paramd/v1/control.pb.h"
#include "reference/adamw_reference.h"
#include "tests/unit/server/status_assertions.h"

namespace paramd::testing {

struct TensorDef {
  std::string name;
  int64_t rows = 1;
  int64_t cols = 1;
  v1::ElementType grad_type = v1::ELEMENT_TYPE_FP32;
};

// A valid job description (rank 0) with DESIGN.md §3's hyper-parameters, serving fp32 and bf16.
inline v1::RegisterRequest MakeSpec(const std::string& job, int world_size,
                                    const std::vector<TensorDef>& tensors) {
  v1::RegisterRequest spec;
  spec.set_job(job);
  spec.set_world_size(world_size);
  for (const TensorDef& t : tensors) {
    v1::TensorSpec* s = spec.add_tensors();
    s->set_name(t.name);
    s->set_rows(t.rows);
    s->set_cols(t.cols);
    s->set_grad_type(t.grad_type);
  }
  v1::AdamwHyperparams* h = spec.mutable_hyperparams();
  h->set_lr(1e-3);
  h->set_beta1(0.9);
  h->set_beta2(0.999);
  h->set_eps(1e-8);
  h->set_weight_decay(0.01);
  spec.add_serve()->set_recipe(v1::RECIPE_BF16);
  // FP32 is served only when asked for; these tests read the master through it.
  spec.add_serve()->set_recipe(v1::RECIPE_FP32);
  spec.set_seed(20261130);
  return spec;
}

// A serve format as Register lists it.
inline v1::ServeFormat ServeFormatOf(v1::Recipe recipe,
                                     v1::Direction direction = v1::DIRECTION_ROWWISE) {
  v1::ServeFormat f;
  f.set_recipe(recipe);
  f.set_direction(direction);
  return f;
}

inline v1::RegisterRequest ForRank(v1::RegisterRequest spec, int rank) {
  spec.set_rank(rank);
  return spec;
}

inline int64_t Elements(const v1::TensorSpec& t) { return t.rows() * t.cols(); }
inline int64_t GradElementBytes(v1::ElementType type) {
  return type == v1::ELEMENT_TYPE_BF16 ? 2 : 4;
}

template <typename T>
std::string ToBytes(std::span<const T> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size_bytes());
}
template <typename T>
std::string ToBytes(const std::vector<T>& values) {
  return ToBytes(std::span<const T>(values));
}
template <typename T>
std::vector<T> FromBytes(std::string_view bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

// Initial weights drawn from N(0, 0.02), one vector per tensor.
inline std::vector<std::vector<float>> RandomWeights(const v1::RegisterRequest& spec,
                                                     uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 0.02);
  std::vector<std::vector<float>> weights;
  for (const v1::TensorSpec& t : spec.tensors()) {
    std::vector<float> w(static_cast<size_t>(Elements(t)));
    for (float& x : w) x = static_cast<float>(normal(rng));
    weights.push_back(std::move(w));
  }
  return weights;
}

// The bytes every rank pushes for one step: [tensor][rank], in each tensor's grad_type.
using StepGradients = std::vector<std::vector<std::string>>;

// Gradients N(0, 1e-3) * (1 + 0.5 N(0, 1)) (DESIGN.md §3's accuracy setup), a function of the seed.
inline StepGradients RandomGradients(const v1::RegisterRequest& spec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  StepGradients grads;
  for (const v1::TensorSpec& t : spec.tensors()) {
    std::vector<std::string> per_rank;
    for (int r = 0; r < spec.world_size(); ++r) {
      std::vector<float> g(static_cast<size_t>(Elements(t)));
      for (float& x : g) x = static_cast<float>(1e-3 * normal(rng) * (1.0 + 0.5 * normal(rng)));
      if (t.grad_type() == v1::ELEMENT_TYPE_BF16) {
        std::vector<uint16_t> codes(g.size());
        for (size_t i = 0; i < g.size(); ++i) codes[i] = reference::Bf16FromFloat(g[i]);
        per_rank.push_back(ToBytes(codes));
      } else {
        per_rank.push_back(ToBytes(g));
      }
    }
    grads.push_back(std::move(per_rank));
  }
  return grads;
}

// The fp32 policy of a whole job, step by step, as DESIGN.md §2-§3 order it: g0 = rank-ordered
// FP32 sum of the slots, gs = g0 * (float)grad_scale, then the FP32 AdamW with k = applied steps.
class ReferenceJob {
 public:
  ReferenceJob(const v1::RegisterRequest& spec, std::vector<std::vector<float>> initial)
      : spec_(spec), hyper_(spec.hyperparams()), master_(std::move(initial)) {
    for (const std::vector<float>& w : master_) {
      m_.emplace_back(w.size(), 0.0f);
      v_.emplace_back(w.size(), 0.0f);
    }
  }

  // The job's default hyper-parameters (SetHyperparams changes them).
  v1::AdamwHyperparams& hyper() { return hyper_; }

  // One applied step; `lr` unset means the job's default.
  void Step(const StepGradients& grads, std::optional<double> lr, double grad_scale) {
    ++k_;
    const reference::Hyper h{lr.value_or(hyper_.lr()), hyper_.beta1(), hyper_.beta2(), hyper_.eps(),
                             hyper_.weight_decay()};
    const float scale = static_cast<float>(grad_scale);
    const int ranks = spec_.world_size();
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      const size_t n = master_[static_cast<size_t>(i)].size();
      std::vector<float> gs(n);
      if (spec_.tensors(i).grad_type() == v1::ELEMENT_TYPE_BF16) {
        std::vector<std::vector<uint16_t>> slots;
        std::vector<const uint16_t*> ptrs;
        for (int r = 0; r < ranks; ++r) slots.push_back(FromBytes<uint16_t>(grads[i][r]));
        for (const auto& s : slots) ptrs.push_back(s.data());
        for (size_t e = 0; e < n; ++e)
          gs[e] = reference::SumSlotsBf16(ptrs.data(), ranks, e) * scale;
      } else {
        std::vector<std::vector<float>> slots;
        std::vector<const float*> ptrs;
        for (int r = 0; r < ranks; ++r) slots.push_back(FromBytes<float>(grads[i][r]));
        for (const auto& s : slots) ptrs.push_back(s.data());
        for (size_t e = 0; e < n; ++e)
          gs[e] = reference::SumSlotsFp32(ptrs.data(), ranks, e) * scale;
      }
      reference::AdamwStepFp32(h, k_, gs.data(), master_[i].data(), m_[i].data(), v_[i].data(), n);
    }
  }

  const std::vector<float>& master(int tensor) const {
    return master_[static_cast<size_t>(tensor)];
  }
  std::vector<uint16_t> Bf16(int tensor) const {
    std::vector<uint16_t> codes;
    for (float x : master(tensor)) codes.push_back(reference::Bf16FromFloat(x));
    return codes;
  }
  int64_t applied_steps() const { return k_; }

 private:
  v1::RegisterRequest spec_;
  v1::AdamwHyperparams hyper_;
  std::vector<std::vector<float>> master_, m_, v_;
  int64_t k_ = 0;
};

// Bit-for-bit equality of two arrays, naming the first differing element.
template <typename T>
::testing::AssertionResult BitIdentical(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "got " << got.size() << " elements, want " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      using Bits = std::conditional_t<sizeof(T) == 4, uint32_t,
                                      std::conditional_t<sizeof(T) == 2, uint16_t, uint8_t>>;
      size_t differing = 0;
      for (size_t j = i; j < got.size(); ++j) {
        differing += std::memcmp(&got[j], &want[j], sizeof(T)) != 0 ? 1 : 0;
      }
      // One Message, so std::hex holds (each << on an AssertionResult is a stream of its own).
      ::testing::Message message;
      message << "element " << i << " of " << got.size() << ": got " << +got[i] << " (0x"
              << std::hex << +std::bit_cast<Bits>(got[i]) << std::dec << "), want " << +want[i]
              << " (0x" << std::hex << +std::bit_cast<Bits>(want[i]) << std::dec << "); "
              << differing << " elements differ";
      return ::testing::AssertionFailure() << message;
    }
  }
  return ::testing::AssertionSuccess();
}

// The same job status before and after, field by field.
inline ::testing::AssertionResult SameStatus(const v1::JobStatus& got, const v1::JobStatus& want) {
  if (google::protobuf::util::MessageDifferencer::Equals(got, want)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "status changed:\n  before: " << want.ShortDebugString()
                                       << "\n  after:  " << got.ShortDebugString();
}

}  // namespace paramd::testing
