#include "server/state/state_fields.h"

#include "common/element_type.h"

namespace paramd {
namespace {

v1::ElementType MomentElementType(kernels::MomentType type) {
  switch (type) {
    case kernels::MomentType::kFp32:
      return v1::ELEMENT_TYPE_FP32;
    case kernels::MomentType::kBf16:
      return v1::ELEMENT_TYPE_BF16;
    case kernels::MomentType::kFp16:
      return v1::ELEMENT_TYPE_FP16;
    case kernels::MomentType::kFp8:
      return v1::ELEMENT_TYPE_FP8_E4M3;
  }
  return v1::ELEMENT_TYPE_UNSPECIFIED;
}

bool Serves(std::span<const FormatKey> formats, v1::Recipe recipe) {
  for (const FormatKey& f : formats) {
    if (f.recipe == recipe) return true;
  }
  return false;
}

}  // namespace

int64_t StateFieldSpec::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t StateFieldSpec::bytes() const { return elements() * ElementTypeBytes(type); }

std::vector<StateFieldSpec> TensorStateFields(const TensorInfo& info,
                                              std::span<const FormatKey> formats) {
  const std::vector<int64_t> matrix = {info.rows, info.cols};
  const std::vector<int64_t> chunks = {kernels::NumChunks(info.rows * info.cols)};
  std::vector<StateFieldSpec> fields;
  switch (info.policy.master) {
    case kernels::MasterType::kFp32:
      fields.push_back(
          {StateFieldKind::kMaster, "master", v1::ELEMENT_TYPE_FP32, matrix, StateArray::kMaster});
      break;
    case kernels::MasterType::kFp16:
      fields.push_back(
          {StateFieldKind::kMaster, "master", v1::ELEMENT_TYPE_FP16, matrix, StateArray::kMaster});
      break;
    case kernels::MasterType::kBf16Remainder:
      fields.push_back(
          {StateFieldKind::kMaster, "master", v1::ELEMENT_TYPE_BF16, matrix, StateArray::kMaster});
      fields.push_back({StateFieldKind::kMasterRemainder, "master_remainder",
                        v1::ELEMENT_TYPE_INT16, matrix, StateArray::kMasterRemainder});
      break;
  }
  fields.push_back({StateFieldKind::kExpAvg, "exp_avg", MomentElementType(info.policy.exp_avg),
                    matrix, StateArray::kExpAvg});
  if (kernels::HasChunkScales(info.policy.exp_avg)) {
    fields.push_back({StateFieldKind::kExpAvgScales, "exp_avg_scales", v1::ELEMENT_TYPE_FP32,
                      chunks, StateArray::kExpAvgScaleInv});
  }
  fields.push_back({StateFieldKind::kExpAvgSq, "exp_avg_sq",
                    MomentElementType(info.policy.exp_avg_sq), matrix, StateArray::kExpAvgSq});
  if (kernels::HasChunkScales(info.policy.exp_avg_sq)) {
    fields.push_back({StateFieldKind::kExpAvgSqScales, "exp_avg_sq_scales", v1::ELEMENT_TYPE_FP32,
                      chunks, StateArray::kExpAvgSqScaleInv});
  }
  if (Serves(formats, v1::RECIPE_FP8_TENSOR)) {
    fields.push_back({StateFieldKind::kFp8TensorScale,
                      "fp8_tensor_scale",
                      v1::ELEMENT_TYPE_FP32,
                      {1},
                      std::nullopt});
  }
  if (Serves(formats, v1::RECIPE_FP8_DELAYED)) {
    fields.push_back({StateFieldKind::kFp8DelayedScale,
                      "fp8_delayed_scale",
                      v1::ELEMENT_TYPE_FP32,
                      {1},
                      std::nullopt});
    fields.push_back({StateFieldKind::kFp8DelayedHistory,
                      "fp8_delayed_history",
                      v1::ELEMENT_TYPE_FP32,
                      {info.delayed_history},
                      std::nullopt});
  }
  return fields;
}

}  // namespace paramd
