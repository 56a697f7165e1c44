#include "server/cpu_backend.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cast.h"
#include "server/kernel_status.h"

namespace paramd {
namespace {

class CpuTensorState : public TensorState {
 public:
  explicit CpuTensorState(std::span<const float> initial)
      : master(initial.begin(), initial.end()),
        exp_avg(initial.size(), 0.0f),
        exp_avg_sq(initial.size(), 0.0f) {}
  int64_t elements() const override { return static_cast<int64_t>(master.size()); }
  int64_t state_bytes() const override { return elements() * 12; }

  std::vector<float> master;
  std::vector<float> exp_avg;
  std::vector<float> exp_avg_sq;
};

// Pointers into the served buffers the step writes.
void BindOutputs(ServedTensor* out, kernels::FusedStepArgs* args) {
  for (auto& [format, bytes] : out->formats) {
    if (format.recipe == v1::RECIPE_FP32) args->out_fp32 = reinterpret_cast<float*>(bytes.data());
    if (format.recipe == v1::RECIPE_BF16)
      args->out_bf16 = reinterpret_cast<uint16_t*>(bytes.data());
  }
}

}  // namespace

CpuBackend::CpuBackend(int threads) : pool_(threads) {}
CpuBackend::~CpuBackend() = default;

absl::StatusOr<std::unique_ptr<TensorState>> CpuBackend::CreateState(std::span<const float> initial,
                                                                     ServedTensor* out) {
  auto state = std::make_unique<CpuTensorState>(initial);
  // Version 0 serves the initial weights; bf16 is their cast (one step with zero moments would
  // change them, so the formats are filled directly).
  for (auto& [format, bytes] : out->formats) {
    if (format.recipe == v1::RECIPE_FP32) {
      std::memcpy(bytes.data(), initial.data(), initial.size_bytes());
    } else if (format.recipe == v1::RECIPE_BF16) {
      auto* dst = reinterpret_cast<uint16_t*>(bytes.data());
      pool_.ParallelFor(static_cast<int64_t>(initial.size()), kernels::kDefaultGrain,
                        [&](int64_t begin, int64_t end) {
                          for (int64_t i = begin; i < end; ++i) {
                            dst[i] = kernels::Bf16FromFloat(initial[static_cast<size_t>(i)]);
                          }
                        });
    } else {
      return absl::UnimplementedError(
          absl::StrCat("the cpu backend cannot serve ", FormatName(format), " yet"));
    }
  }
  return state;
}

absl::Status CpuBackend::Step(std::span<TensorStep> tensors, const kernels::AdamwScalars& scalars,
                              float grad_scale) {
  for (TensorStep& t : tensors) {
    auto* state = static_cast<CpuTensorState*>(t.state);
    kernels::FusedStepArgs args;
    args.slots = t.slots.data();
    args.num_slots = static_cast<int>(t.slots.size());
    args.slot_type = t.slot_type;
    args.grad_scale = grad_scale;
    args.scalars = scalars;
    args.master = state->master.data();
    args.exp_avg = state->exp_avg.data();
    args.exp_avg_sq = state->exp_avg_sq.data();
    BindOutputs(t.out, &args);
    std::atomic<bool> failed{false};
    kernels::KStatus first_error;
    pool_.ParallelFor(state->elements(), kernels::kDefaultGrain, [&](int64_t begin, int64_t end) {
      kernels::KStatus s = kernels::FusedStepCpu(args, begin, end);
      if (!s.ok() && !failed.exchange(true)) first_error = s;
    });
    if (failed.load()) return FromKernel(first_error);
  }
  return absl::OkStatus();
}

}  // namespace paramd
