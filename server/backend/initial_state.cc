#include "server/backend/initial_state.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_step.h"
#include "kernels/formats.h"
#include "server/backend/kernel_status.h"

namespace paramd {

absl::Status MakeInitialState(const TensorInfo& info, std::span<const float> initial,
                              kernels::ThreadPool& pool, InitialState* state, ServedTensor* out,
                              const WholeAmax& whole_amax) {
  const int64_t n = info.rows * info.cols;
  const bool split = info.policy.master == kernels::MasterType::kBf16Remainder;
  const bool half = info.policy.master == kernels::MasterType::kFp16;
  state->master.resize(static_cast<size_t>(n * (half || split ? 2 : 4)));
  if (split) state->remainder.resize(static_cast<size_t>(n));
  // The stored master's value, what every format is cut from.
  float* fp32_master = split || half ? nullptr : reinterpret_cast<float*>(state->master.data());
  std::vector<float> working;
  absl::StatusOr<float*> fp32_values = Fp32Values(info, out, fp32_master, &working);
  if (!fp32_values.ok()) return fp32_values.status();
  float* fp32 = *fp32_values;
  pool.ParallelForAsGuest(n, kernels::kDefaultGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float x = initial[static_cast<size_t>(i)];
      if (split) {
        const kernels::Bf16Split s = kernels::SplitBf16Remainder(x);
        reinterpret_cast<uint16_t*>(state->master.data())[i] = s.served;
        state->remainder[static_cast<size_t>(i)] = s.remainder;
        fp32[i] = x;
      } else if (half) {
        const uint16_t code = kernels::Fp16FromFloat(x);
        reinterpret_cast<uint16_t*>(state->master.data())[i] = code;
        fp32[i] = kernels::FloatFromFp16(code);
      } else {
        fp32_master[i] = x;
        fp32[i] = x;  // the master itself where FP32 is not served
      }
    }
  });
  if (out->Find(FormatKey{v1::RECIPE_FP8_TENSOR, v1::DIRECTION_ROWWISE}) != nullptr ||
      out->Find(FormatKey{v1::RECIPE_FP8_TENSOR, v1::DIRECTION_COLUMNWISE}) != nullptr) {
    float amax = kernels::AmaxCpu(fp32, n);
    if (whole_amax) {
      absl::StatusOr<float> whole = whole_amax(amax);
      if (!whole.ok()) return whole.status();
      amax = *whole;
    }
    state->fp8_tensor_scale = kernels::NextFp8TensorScale(amax, 1.0f).scale;
  }
  return ServeFromFp32(info, fp32,
                       split ? reinterpret_cast<const uint16_t*>(state->master.data()) : nullptr,
                       state->fp8_tensor_scale, state->delayed_scale, pool, out);
}

absl::StatusOr<float*> Fp32Values(const TensorInfo& info, ServedTensor* out, float* fp32_master,
                                  std::vector<float>* working) try {
  if (float* fp32 = out->Fp32(); fp32 != nullptr) return fp32;
  if (fp32_master != nullptr) return fp32_master;
  working->resize(static_cast<size_t>(info.rows * info.cols));
  return working->data();
} catch (const std::bad_alloc&) {
  return absl::ResourceExhaustedError(absl::StrCat("no host memory for the FP32 values of a ",
                                                   info.rows, "x", info.cols, " tensor"));
}

absl::Status ServeFromFp32(const TensorInfo& info, const float* fp32, const uint16_t* bf16_halves,
                           float fp8_tensor_scale, float fp8_delayed_scale,
                           kernels::ThreadPool& pool, ServedTensor* out) {
  std::vector<kernels::ServeArgs> formats;
  for (ServedFormat& f : out->formats) {
    if (f.key.recipe == v1::RECIPE_FP32 && f.key.direction == v1::DIRECTION_ROWWISE) continue;
    const float scale = f.key.recipe == v1::RECIPE_FP8_TENSOR    ? fp8_tensor_scale
                        : f.key.recipe == v1::RECIPE_FP8_DELAYED ? fp8_delayed_scale
                                                                 : 1.0f;
    formats.push_back(ServeArgsOf(info, fp32, bf16_halves, scale, f));
  }
  return FromKernel(kernels::CpuCutPanels(formats, info.rows, pool, /*as_guest=*/true));
}

namespace {

// Element i of a 16-bit stored master (bf16 + remainder, or fp16) as the FP32 value it holds.
float HalfMasterValue(const TensorInfo& info, const HostTensorState& state, int64_t i) {
  const auto* halves = reinterpret_cast<const uint16_t*>(state.master.data());
  return info.policy.master == kernels::MasterType::kFp16
             ? kernels::FloatFromFp16(halves[i])
             : kernels::MergeBf16Remainder(halves[i], state.remainder[static_cast<size_t>(i)]);
}

}  // namespace

float InitialFp8TensorScale(const TensorInfo& info, const HostTensorState& state) {
  const int64_t n = info.rows * info.cols;
  float amax = 0.0f;
  if (info.policy.master == kernels::MasterType::kFp32) {
    amax = kernels::AmaxCpu(reinterpret_cast<const float*>(state.master.data()), n);
  } else {
    std::vector<float> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      values[static_cast<size_t>(i)] = HalfMasterValue(info, state, i);
    amax = kernels::AmaxCpu(values.data(), n);
  }
  return kernels::NextFp8TensorScale(amax, 1.0f).scale;
}

absl::Status ServeImportedMaster(const TensorInfo& info, const HostTensorState& state,
                                 kernels::ThreadPool& pool, ServedTensor* out) {
  const int64_t n = info.rows * info.cols;
  const bool split = info.policy.master == kernels::MasterType::kBf16Remainder;
  const bool half = info.policy.master == kernels::MasterType::kFp16;
  const auto* halves = reinterpret_cast<const uint16_t*>(state.master.data());
  if (!split && !half && out->Fp32() == nullptr) {
    // An FP32 master is the values every format is cut from.
    return ServeFromFp32(info, reinterpret_cast<const float*>(state.master.data()), nullptr,
                         state.scalars.fp8_tensor_scale, state.scalars.fp8_delayed_scale, pool,
                         out);
  }
  std::vector<float> working;
  absl::StatusOr<float*> fp32_values = Fp32Values(info, out, nullptr, &working);
  if (!fp32_values.ok()) return fp32_values.status();
  float* fp32 = *fp32_values;
  pool.ParallelForAsGuest(n, kernels::kDefaultGrain, [&](int64_t begin, int64_t end) {
    if (!split && !half) {
      std::memcpy(fp32 + begin, state.master.data() + begin * 4,
                  static_cast<size_t>(end - begin) * sizeof(float));
      return;
    }
    for (int64_t i = begin; i < end; ++i) fp32[i] = HalfMasterValue(info, state, i);
  });
  return ServeFromFp32(info, fp32, split ? halves : nullptr, state.scalars.fp8_tensor_scale,
                       state.scalars.fp8_delayed_scale, pool, out);
}

}  // namespace paramd
