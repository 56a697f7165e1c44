// A cuda:N tensor's state: created from initial weights, imported from a host copy, read back for
// an export (cuda_backend.h).
#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "server/backend/cuda/cuda_backend.h"
#include "server/backend/initial_state.h"

namespace paramd::cuda {

absl::StatusOr<std::unique_ptr<TensorState>> CudaBackend::CreateState(
    const TensorInfo& info, std::span<const float> initial, ServedTensor* out,
    const WholeAmax& whole_amax) {
  UncheckedMutexLock lock(&mu_);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  InitialState init;
  if (absl::Status s = MakeInitialState(info, initial, pool_, &init, out, whole_amax); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<CudaTensorState>> allocated = Allocate(info, *out);
  if (!allocated.ok()) return allocated.status();
  std::unique_ptr<CudaTensorState> state = *std::move(allocated);
  CudaTensorState& s = *state;
  s.delayed_scale = init.delayed_scale;
  const size_t chunks = static_cast<size_t>(kernels::NumChunks(s.n));
  PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.master.get(), init.master.data(),
                                              init.master.size(), cudaMemcpyHostToDevice, stream_));
  if (!init.remainder.empty()) {
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.remainder.get(), init.remainder.data(),
                                                s.remainder.bytes(), cudaMemcpyHostToDevice,
                                                stream_));
  }
  PARAMD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(s.exp_avg.get(), 0, s.exp_avg.bytes(), stream_));
  PARAMD_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(s.exp_avg_sq.get(), 0, s.exp_avg_sq.bytes(), stream_));
  const std::vector<float> ones(chunks, 1.0f);  // a new tensor's chunk scales
  for (DeviceBuffer* scales : {&s.exp_avg_scale_inv, &s.exp_avg_sq_scale_inv}) {
    if (scales->bytes() == 0) continue;
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scales->get(), ones.data(), scales->bytes(),
                                                cudaMemcpyHostToDevice, stream_));
  }
  const float scalars[3] = {init.fp8_tensor_scale, init.delayed_scale, 0.0f};
  PARAMD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(s.scalars.get(), scalars, sizeof(scalars), cudaMemcpyHostToDevice, stream_));
  if (absl::Status st = UploadServed(*out); !st.ok()) return st;
  {
    absl::MutexLock host_lock(&out->host_mu);
    out->host_stale = false;  // computed on the host, then uploaded
  }
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return state;
}

absl::Status CudaBackend::ReadStateArray(const TensorState& state, StateArray array, int64_t offset,
                                         std::span<uint8_t> out) {
  UncheckedMutexLock lock(&mu_);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const auto& s = static_cast<const CudaTensorState&>(state);
  const DeviceBuffer* buffer = nullptr;
  switch (array) {
    case StateArray::kMaster:
      buffer = &s.master;
      break;
    case StateArray::kMasterRemainder:
      buffer = &s.remainder;
      break;
    case StateArray::kExpAvg:
      buffer = &s.exp_avg;
      break;
    case StateArray::kExpAvgScaleInv:
      buffer = &s.exp_avg_scale_inv;
      break;
    case StateArray::kExpAvgSq:
      buffer = &s.exp_avg_sq;
      break;
    case StateArray::kExpAvgSqScaleInv:
      buffer = &s.exp_avg_sq_scale_inv;
      break;
  }
  if (offset < 0 ||
      offset + static_cast<int64_t>(out.size()) > static_cast<int64_t>(buffer->bytes())) {
    return absl::InternalError(absl::StrCat("state read [", offset, ", +", out.size(),
                                            ") outside an array of ", buffer->bytes(), " bytes"));
  }
  if (out.empty()) return absl::OkStatus();
  // A chunk at a time into the caller's (pageable) buffer: the export is bounded by the link,
  // not by this copy.
  PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(),
                                              static_cast<const uint8_t*>(buffer->get()) + offset,
                                              out.size(), cudaMemcpyDeviceToHost, stream_));
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<TensorScalars> CudaBackend::ReadStateScalars(const TensorState& state) {
  UncheckedMutexLock lock(&mu_);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const auto& s = static_cast<const CudaTensorState&>(state);
  TensorScalars scalars;
  // The fp8_tensor scale lives on the device (the step computes it there); fp8_delayed's and
  // the history on the host.
  PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&scalars.fp8_tensor_scale, s.scalars.get(),
                                              sizeof(float), cudaMemcpyDeviceToHost, stream_));
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  scalars.fp8_delayed_scale = s.delayed_scale;
  scalars.delayed_history = s.history.Entries();
  return scalars;
}

absl::StatusOr<std::unique_ptr<TensorState>> CudaBackend::ImportState(const TensorInfo& info,
                                                                      HostTensorState host,
                                                                      ServedTensor* out) {
  UncheckedMutexLock lock(&mu_);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  // The served bytes on the host, as CreateState's version 0: the device's outputs are written
  // by the next step before they are read.
  if (absl::Status st = ServeImportedMaster(info, host, pool_, out); !st.ok()) return st;
  absl::StatusOr<std::unique_ptr<CudaTensorState>> allocated = Allocate(info, *out);
  if (!allocated.ok()) return allocated.status();
  std::unique_ptr<CudaTensorState> state = *std::move(allocated);
  CudaTensorState& s = *state;
  s.delayed_scale = host.scalars.fp8_delayed_scale;
  s.history.Restore(host.scalars.delayed_history);
  const std::pair<DeviceBuffer*, const void*> uploads[] = {
      {&s.master, host.master.data()},
      {&s.remainder, host.remainder.data()},
      {&s.exp_avg, host.exp_avg.data()},
      {&s.exp_avg_scale_inv, host.exp_avg_scale_inv.data()},
      {&s.exp_avg_sq, host.exp_avg_sq.data()},
      {&s.exp_avg_sq_scale_inv, host.exp_avg_sq_scale_inv.data()}};
  for (const auto& [device, bytes] : uploads) {
    if (device->bytes() == 0) continue;
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(device->get(), bytes, device->bytes(), cudaMemcpyHostToDevice, stream_));
  }
  const float scalars[3] = {host.scalars.fp8_tensor_scale, host.scalars.fp8_delayed_scale, 0.0f};
  PARAMD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(s.scalars.get(), scalars, sizeof(scalars), cudaMemcpyHostToDevice, stream_));
  if (absl::Status st = UploadServed(*out); !st.ok()) return st;
  {
    absl::MutexLock host_lock(&out->host_mu);
    out->host_stale = false;  // computed on the host, then uploaded
  }
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return state;
}

// A tensor's device buffers for its policy (contents undefined) and its served formats' device
// outputs, laid out as `out`'s.
absl::StatusOr<std::unique_ptr<CudaTensorState>> CudaBackend::Allocate(const TensorInfo& info,
                                                                       const ServedTensor& out) {
  auto state = std::make_unique<CudaTensorState>(info);
  CudaTensorState& s = *state;
  s.history = kernels::AmaxHistory(info.delayed_history);
  const StateBytes bytes = PolicyStateBytes(info);
  const bool scaled_m = kernels::HasChunkScales(info.policy.exp_avg);
  const bool scaled_v = kernels::HasChunkScales(info.policy.exp_avg_sq);
  const bool split = info.policy.master == kernels::MasterType::kBf16Remainder;
  const size_t n = static_cast<size_t>(s.n);
  const size_t chunks = static_cast<size_t>(kernels::NumChunks(s.n));
  const size_t master = info.policy.master == kernels::MasterType::kFp32 ? 4 * n : 2 * n;
  for (absl::Status st :
       {s.master.Allocate(master), s.remainder.Allocate(split ? n * sizeof(int16_t) : 0),
        s.exp_avg.Allocate(static_cast<size_t>(bytes.exp_avg)),
        s.exp_avg_scale_inv.Allocate(scaled_m ? chunks * 4 : 0),
        s.exp_avg_sq.Allocate(static_cast<size_t>(bytes.exp_avg_sq)),
        s.exp_avg_sq_scale_inv.Allocate(scaled_v ? chunks * 4 : 0),
        s.scalars.Allocate(3 * sizeof(float))}) {
    if (!st.ok()) return st;
  }
  for (const ServedFormat& f : out.formats) {
    DeviceOutput& o = s.outputs.emplace_back();
    o.key = f.key;
    o.layout = f.layout;
    if (WritesInPlace(f)) continue;
    if (absl::Status st = OwnOutput(o); !st.ok()) return st;
  }
  return state;
}

// The state's own buffers of a served format (for versions the step cannot write in place).
absl::Status CudaBackend::OwnOutput(DeviceOutput& o) {
  if (o.data.get() != nullptr) return absl::OkStatus();
  if (absl::Status st = o.data.Allocate(static_cast<size_t>(o.layout.data_bytes)); !st.ok()) {
    return st;
  }
  return o.scales.Allocate(static_cast<size_t>(o.layout.scale_bytes));
}

// Version 0 (or an imported version), computed on the host, into its exported GPU bytes.
absl::Status CudaBackend::UploadServed(const ServedTensor& out) {
  for (const ServedFormat& f : out.formats) {
    if (f.device.empty()) continue;
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(f.device.get(), f.bytes.data(),
                                                static_cast<size_t>(f.bytes.size()),
                                                cudaMemcpyHostToDevice, stream_));
  }
  return absl::OkStatus();
}

}  // namespace paramd::cuda
