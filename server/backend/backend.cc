#include "server/backend/backend.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/step_rules.h"

namespace paramd {

std::string FormatName(const FormatKey& format) {
  return absl::StrCat(kernels::RecipeName(KernelRecipe(format.recipe)),
                      format.direction == v1::DIRECTION_COLUMNWISE ? "/columnwise" : "");
}

FormatKey FormatKeyOf(const v1::ServeFormat& format) {
  // A pull that names no recipe gets the FP32 master, which every job serves. (Registration
  // refuses an unnamed recipe before this is reached.)
  return {
      format.recipe() == v1::RECIPE_UNSPECIFIED ? v1::RECIPE_FP32 : format.recipe(),
      format.direction() == v1::DIRECTION_UNSPECIFIED ? v1::DIRECTION_ROWWISE : format.direction()};
}

kernels::ServeArgs ServeArgsOf(const TensorInfo& info, const float* fp32,
                               const uint16_t* bf16_halves, float tensor_scale, ServedFormat& f) {
  kernels::ServeArgs args;
  args.master = fp32;
  args.rows = info.rows;
  args.cols = info.cols;
  args.recipe = KernelRecipe(f.key.recipe);
  args.direction = KernelDirection(f.key.direction);
  args.tensor_scale = tensor_scale;
  args.data = f.data();
  args.scales = f.layout.scale_bytes > 0 ? f.scales() : nullptr;
  if (f.key.recipe == v1::RECIPE_BF16) args.bf16_halves = bf16_halves;
  return args;
}

bool WrittenInTheStepsPass(const FormatKey& format) {
  return format.direction == v1::DIRECTION_ROWWISE &&
         (format.recipe == v1::RECIPE_FP32 || format.recipe == v1::RECIPE_BF16 ||
          format.recipe == v1::RECIPE_FP16);
}

int64_t CpuWorkingBytes(const TensorInfo& info, std::span<const FormatKey> formats) {
  bool serves_fp32 = false;
  bool cuts = false;
  for (const FormatKey& f : formats) {
    serves_fp32 = serves_fp32 || f == FormatKey{v1::RECIPE_FP32, v1::DIRECTION_ROWWISE};
    cuts = cuts || !WrittenInTheStepsPass(f);
  }
  const bool needed = info.policy.master != kernels::MasterType::kFp32 && !serves_fp32 && cuts;
  return needed ? 4 * info.rows * info.cols : 0;
}

StateBytes PolicyStateBytes(const TensorInfo& info) {
  const int64_t n = info.rows * info.cols;
  auto moment = [n](kernels::MomentType type) {
    switch (type) {
      case kernels::MomentType::kFp32:
        return 4 * n;
      case kernels::MomentType::kBf16:
      case kernels::MomentType::kFp16:
        return 2 * n;
      case kernels::MomentType::kFp8:
        return n;
    }
    return 4 * n;
  };
  auto scales = [n](kernels::MomentType type) {
    return kernels::HasChunkScales(type) ? 4 * kernels::NumChunks(n) : 0;
  };
  StateBytes bytes;
  bytes.master = info.policy.master == kernels::MasterType::kFp16 ? 2 * n : 4 * n;
  bytes.exp_avg = moment(info.policy.exp_avg);
  bytes.exp_avg_sq = moment(info.policy.exp_avg_sq);
  bytes.moment_scales = scales(info.policy.exp_avg) + scales(info.policy.exp_avg_sq);
  return bytes;
}

bool TensorCheck::Answers(float step_grad_scale, bool step_norms) const {
  return std::memcmp(&grad_scale, &step_grad_scale, sizeof(float)) == 0 && (norms || !step_norms);
}

void ServedTensor::SetOutcomePending() {
  absl::MutexLock lock(&outcome_mu_);
  outcome_pending_ = true;
}

void ServedTensor::ResolveOutcome(bool was_skipped) {
  absl::MutexLock lock(&outcome_mu_);
  skipped = was_skipped;
  outcome_pending_ = false;
}

bool ServedTensor::outcome_pending() const {
  absl::MutexLock lock(&outcome_mu_);
  return outcome_pending_;
}

const ServedFormat* ServedTensor::Find(const FormatKey& format) const {
  for (const ServedFormat& f : formats) {
    if (f.key == format) return &f;
  }
  return nullptr;
}

int64_t ServedTensor::bytes() const {
  int64_t total = 0;
  for (const ServedFormat& f : formats) total += static_cast<int64_t>(f.bytes.size());
  return total;
}

absl::Status Backend::ServePrevious(std::span<TensorStep> tensors,
                                    const std::function<void(size_t)>& tensor_done) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    ServedTensor& out = *tensors[i].out;
    const ServedTensor& previous = *tensors[i].previous;
    for (size_t f = 0; f < out.formats.size(); ++f) {
      std::memcpy(out.formats[f].bytes.data(), previous.formats[f].bytes.data(),
                  static_cast<size_t>(previous.formats[f].bytes.size()));
    }
    if (tensor_done) tensor_done(i);
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> Backend::StepDecidedOnHost(const StepInput& input) {
  const bool clipping = input.max_grad_norm > 0;
  PARAMD_ASSIGN_OR_RETURN(const GradientCheck local,
                          CheckGradients(input.tensors, input.scalars.grad_scale, clipping));
  JobCheck job;
  if (input.agreement) {
    PARAMD_ASSIGN_OR_RETURN(job, input.agreement(local));
  } else {
    job.finite = local.finite;
    if (clipping) {
      for (const std::vector<double>& tensor : local.block_sums) {
        job.block_sums.insert(job.block_sums.end(), tensor.begin(), tensor.end());
      }
    }
  }
  StepOutcome outcome;
  outcome.skipped = !job.finite;
  // Every tensor is published with the outcome decided: its pullers learn whether it was skipped.
  auto publish = [&](size_t i) { input.publish(i, i + 1, &outcome); };
  if (outcome.skipped) {
    // The state stays as it is; the new version re-serves the previous bytes.
    PARAMD_RETURN_IF_ERROR(ServePrevious(input.tensors, publish));
    return outcome;
  }
  StepScalars scalars = input.scalars;
  if (clipping) {
    scalars.clip = kernels::ClipFactor(
        kernels::SumInOrder(job.block_sums.data(), static_cast<int64_t>(job.block_sums.size())),
        input.max_grad_norm);
  }
  outcome.clip = scalars.clip;
  PARAMD_RETURN_IF_ERROR(ApplyStep(input.tensors, scalars, publish));
  return outcome;
}

}  // namespace paramd
