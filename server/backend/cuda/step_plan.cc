// A cuda:N step's plan (cuda_backend.h): the kernels' descriptors of the step's tensors, bound to a
// device workspace, and the few plans kept across steps so that a step over buffers seen lately
// sends nothing up.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "server/backend/cuda/cuda_backend.h"
#include "server/backend/kernel_status.h"

namespace paramd::cuda {

// The kernels' descriptors of this step's tensors, bound to a device workspace; without `wait`
// through page-locked staging, the host waiting for nothing (the previous step has run: every
// step ends synchronized).
absl::Status CudaBackend::Plan(std::span<TensorStep> tensors, bool wait) {
  // Kept from step to step (grown for a bigger job only).
  if (step_scalars_.bytes() < 2 * tensors.size() * sizeof(float)) {
    step_scalars_.Free();
    if (absl::Status s = step_scalars_.Allocate(2 * tensors.size() * sizeof(float)); !s.ok()) {
      return s;
    }
  }
  // The fp8_delayed scales and the amaxes, then a step decided on the device's flag and clip.
  const int64_t host_bytes = static_cast<int64_t>((2 * tensors.size() + 2) * sizeof(float));
  if (host_scalars_.size() < host_bytes) {
    absl::StatusOr<HostBuffer> pinned = HostAllocator()->Allocate(host_bytes);
    if (!pinned.ok()) return pinned.status();
    host_scalars_ = *std::move(pinned);
  }
  std::vector<kernels::CudaStepTensor> descs;
  for (TensorStep& t : tensors) {
    auto& s = *static_cast<CudaTensorState*>(t.state);
    kernels::CudaStepTensor& d = descs.emplace_back();
    d.rows = s.info.rows;
    d.cols = s.info.cols;
    d.policy = s.info.policy;
    d.tensor_index = s.info.index;
    d.index_offset = s.info.first_element();
    d.slot_type = t.slot_type;
    for (size_t r = 0; r < s.slots.size(); ++r) {
      const bool on_device = r < t.device_slots.size() && t.device_slots[r] != nullptr;
      d.d_slots.push_back(on_device ? t.device_slots[r] : s.slots[r].get());
    }
    d.d_master = s.master.get();
    d.d_master_remainder = static_cast<int16_t*>(s.remainder.get());
    d.d_exp_avg = s.exp_avg.get();
    d.d_exp_avg_scale_inv = static_cast<float*>(s.exp_avg_scale_inv.get());
    d.d_exp_avg_sq = s.exp_avg_sq.get();
    d.d_exp_avg_sq_scale_inv = static_cast<float*>(s.exp_avg_sq_scale_inv.get());
    for (size_t f = 0; f < s.outputs.size(); ++f) {
      DeviceOutput& o = s.outputs[f];
      if (AfterAmaxRound(t, o)) continue;
      const ServedFormat& served = t.out->formats[f];
      void* data = nullptr;
      void* scales = nullptr;
      if (WritesInPlace(served)) {
        data = served.device.get();
        if (o.layout.scale_bytes > 0) {
          scales = static_cast<uint8_t*>(served.device.get()) + o.layout.data_bytes;
        }
      } else {
        if (absl::Status st = OwnOutput(o); !st.ok()) return st;
        data = o.data.get();
        scales = o.scales.get();
      }
      d.outputs.push_back(
          {KernelRecipe(o.key.recipe), KernelDirection(o.key.direction), data, scales});
    }
    // The fp8_tensor scale stays with the tensor (the next step starts from it); the
    // fp8_delayed scale and the amax are the step's, in one array for all tensors.
    // A split tensor's scale waits for the owners' amax (ServeSplitPerTensor).
    d.d_fp8_tensor_scale = t.whole_amax ? nullptr : static_cast<float*>(s.scalars.get());
    auto* step_scalars = static_cast<float*>(step_scalars_.get());
    d.d_fp8_delayed_scale = step_scalars + descs.size() - 1;
    d.d_master_amax = step_scalars + tensors.size() + descs.size() - 1;
  }
  return UsePlan(std::move(descs), wait);
}

// Makes the plan of `descs` the step's: a kept one made from the same descriptors (bound
// already: only its counters are zeroed), else one made now into the least recently used place,
// bound without waiting unless `wait`. A place's workspace is allocated only when it is too
// small; where that fails (another job filled the GPU) a kept workspace large enough is taken
// over, so a job whose steps ran before still steps.
absl::Status CudaBackend::UsePlan(std::vector<kernels::CudaStepTensor> descs, bool wait) {
  ++plan_uses_;
  for (KeptPlan& kept : plans_) {
    if (kept.bound && kept.descs == descs) {
      kept.used = plan_uses_;
      plan_ = &kept;
      return FromKernel(kept.plan.ResetCounters(stream_));
    }
  }
  kernels::CudaStepPlan made;
  if (absl::Status s = FromKernel(kernels::CudaStepPlan::Create(descs, &made)); !s.ok()) {
    return s;
  }
  plans_made_.fetch_add(1);
  KeptPlan* place =
      &*std::min_element(plans_.begin(), plans_.end(),
                         [](const KeptPlan& a, const KeptPlan& b) { return a.used < b.used; });
  if (place->workspace.bytes() < made.workspace_bytes()) {
    place->bound = false;
    place->workspace.Free();
    if (absl::Status s = place->workspace.Allocate(made.workspace_bytes()); !s.ok()) {
      KeptPlan* roomy = nullptr;
      for (KeptPlan& kept : plans_) {
        if (kept.workspace.bytes() >= made.workspace_bytes()) roomy = &kept;
      }
      if (roomy == nullptr) return s;
      place = roomy;
    }
  }
  place->bound = false;
  place->descs = std::move(descs);
  place->plan = std::move(made);
  place->used = plan_uses_;
  plan_ = place;
  if (wait) {
    PARAMD_RETURN_IF_ERROR(
        FromKernel(place->plan.Bind(place->workspace.get(), place->workspace.bytes(), stream_)));
    place->bound = true;
    return absl::OkStatus();
  }
  const auto staging_bytes = static_cast<int64_t>(place->plan.workspace_bytes());
  if (place->staging.size() < staging_bytes) {
    absl::StatusOr<HostBuffer> pinned = HostAllocator()->Allocate(staging_bytes);
    if (!pinned.ok()) return pinned.status();
    place->staging = *std::move(pinned);
  }
  PARAMD_RETURN_IF_ERROR(FromKernel(place->plan.BindAsync(
      place->workspace.get(), place->workspace.bytes(), place->staging.data(), stream_)));
  place->bound = true;
  return absl::OkStatus();
}

}  // namespace paramd::cuda
