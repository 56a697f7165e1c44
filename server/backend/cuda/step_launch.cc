// A cuda:N step's launch (cuda_backend.h): the pushed gradients copied up, the fused kernel, each
// served format on to where its version keeps it, and split tensors' fp8_tensor formats after
// their owners' amax round.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "common/cuda_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/backend/cuda/cuda_backend.h"
#include "server/backend/kernel_status.h"

namespace paramd::cuda {

// Copies every rank's gradient slots up to the device.
absl::Status CudaBackend::Upload(std::span<TensorStep> tensors) {
  for (TensorStep& t : tensors) {
    auto& s = *static_cast<CudaTensorState*>(t.state);
    const size_t bytes =
        static_cast<size_t>(s.n) * (t.slot_type == kernels::SlotType::kBf16 ? 2 : 4);
    if (s.slots.size() != t.slots.size()) s.slots = std::vector<DeviceBuffer>(t.slots.size());
    for (size_t r = 0; r < t.slots.size(); ++r) {
      // A slot a trainer wrote into exported GPU memory (cuda_ipc) is read where it lies.
      if (r < t.device_slots.size() && t.device_slots[r] != nullptr) continue;
      if (s.slots[r].get() == nullptr) {
        if (absl::Status st = s.slots[r].Allocate(bytes); !st.ok()) return st;
      }
      const void* host = t.slots[r];
      PARAMD_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(s.slots[r].get(), host, bytes, cudaMemcpyHostToDevice, stream_));
    }
  }
  return absl::OkStatus();
}

// Queues a bound plan's step: the fp8_delayed scales from the host's histories (one copy from
// page-locked memory), the kernel, the served bytes into the version's exported GPU bytes where
// the step did not write them there (they stay on the GPU: a host reader copies them down once,
// ReadyHostBytes), into host buffers for formats without exported bytes, and the masters' amaxes
// down into HostScalars() + n, all in one stream.
absl::Status CudaBackend::QueueStep(std::span<TensorStep> tensors,
                                    const kernels::CudaStepScalars& k) {
  const size_t n = tensors.size();
  float* delayed = HostScalars();  // [0, n): the fp8_delayed scales, [n, 2n): the amaxes
  for (size_t i = 0; i < n; ++i) {
    auto& s = *static_cast<CudaTensorState*>(tensors[i].state);
    delayed[i] = s.history.NextScale(s.info.delayed_margin, s.delayed_scale).scale;
    s.delayed_scale = delayed[i];
  }
  if (n > 0) {
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(step_scalars_.get(), delayed, n * sizeof(float),
                                                cudaMemcpyHostToDevice, stream_));
  }
  // The kernel's own time, for --log_level=debug (what the step's device time is made of).
  const bool timed = GetLogLevel() == LogLevel::kDebug;
  if (timed) PARAMD_CUDA_RETURN_IF_ERROR(cudaEventRecord(kernel_timing_[0], stream_));
  if (absl::Status s = FromKernel(kernels::FusedStepCuda(plan(), k, stream_)); !s.ok()) return s;
  if (timed) PARAMD_CUDA_RETURN_IF_ERROR(cudaEventRecord(kernel_timing_[1], stream_));
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& s = *static_cast<CudaTensorState*>(tensors[i].state);
    bool on_device = false;
    for (size_t f = 0; f < s.outputs.size(); ++f) {
      ServedFormat& host = tensors[i].out->formats[f];
      on_device = on_device || !host.device.empty();
      if (AfterAmaxRound(tensors[i], s.outputs[f])) continue;  // ServeSplitPerTensor's
      if (absl::Status st = CopyOutput(s.outputs[f], host); !st.ok()) return st;
    }
    absl::MutexLock host_lock(&tensors[i].out->host_mu);
    tensors[i].out->host_stale = on_device;  // no reader holds a version being written
  }
  if (n > 0) {
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(HostScalars() + n, static_cast<float*>(step_scalars_.get()) + n,
                        n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  return absl::OkStatus();
}

// A split tensor's fp8_tensor output waits for the whole tensor's amax (TensorStep::whole_amax):
// the step's launch leaves it out, and ServeSplitPerTensor writes it after the owners' round.
// Its fp8_delayed output is cast with a scale known before the step, in the launch.
bool CudaBackend::AfterAmaxRound(const TensorStep& t, const DeviceOutput& o) {
  return t.whole_amax && o.key.recipe == v1::RECIPE_FP8_TENSOR;
}

// A served format the step wrote into the state's own buffers, on to where the version keeps
// it: its exported GPU bytes, else its host bytes (queued on stream_).
absl::Status CudaBackend::CopyOutput(const DeviceOutput& d, ServedFormat& host) {
  if (WritesInPlace(host)) return absl::OkStatus();
  if (!host.device.empty()) {
    auto* exported = static_cast<uint8_t*>(host.device.get());
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(exported, d.data.get(), d.data.bytes(), cudaMemcpyDeviceToDevice, stream_));
    if (d.scales.bytes() > 0) {
      PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(exported + host.layout.data_bytes, d.scales.get(),
                                                  d.scales.bytes(), cudaMemcpyDeviceToDevice,
                                                  stream_));
    }
    return absl::OkStatus();
  }
  PARAMD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host.data(), d.data.get(), d.data.bytes(), cudaMemcpyDeviceToHost, stream_));
  if (d.scales.bytes() > 0) {
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.scales(), d.scales.get(), d.scales.bytes(),
                                                cudaMemcpyDeviceToHost, stream_));
  }
  return absl::OkStatus();
}

// The split tensors' round between their passes (DESIGN.md §7), after the queued step: each
// offers the amax of its rows' new master (down in HostScalars() + n once the stream has run)
// and gets the whole tensor's, which replaces it there for the fp8_delayed history. Its
// fp8_tensor scale comes from that amax, as one daemon's step would make it, and its fp8_tensor
// outputs are cast with it in one serve launch. The host waits for the device here, as the
// host-decided step does at its end anyway.
absl::Status CudaBackend::ServeSplitPerTensor(std::span<TensorStep> tensors) {
  const size_t n = tensors.size();
  if (std::none_of(tensors.begin(), tensors.end(),
                   [](const TensorStep& t) { return static_cast<bool>(t.whole_amax); })) {
    return absl::OkStatus();
  }
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  float* amax = HostScalars() + n;
  std::vector<kernels::CudaServeArgs> serve;
  std::vector<std::pair<size_t, size_t>> served;  // (tensor, format) of each serve
  std::vector<float> scales(n);                   // alive until the stream has run
  for (size_t i = 0; i < n; ++i) {
    TensorStep& t = tensors[i];
    if (!t.whole_amax) continue;
    absl::StatusOr<float> whole = t.whole_amax(amax[i]);
    if (!whole.ok()) return whole.status();
    amax[i] = *whole;
    auto& s = *static_cast<CudaTensorState*>(t.state);
    for (size_t f = 0; f < s.outputs.size(); ++f) {
      DeviceOutput& o = s.outputs[f];
      if (!AfterAmaxRound(t, o)) continue;
      if (served.empty() || served.back().first != i) {
        float previous = 0;
        PARAMD_CUDA_RETURN_IF_ERROR(
            cudaMemcpy(&previous, s.scalars.get(), sizeof(float), cudaMemcpyDeviceToHost));
        scales[i] = kernels::NextFp8TensorScale(*whole, previous).scale;
        PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.scalars.get(), &scales[i], sizeof(float),
                                                    cudaMemcpyHostToDevice, stream_));
      }
      const ServedFormat& out = t.out->formats[f];
      void* data = nullptr;
      void* scale_inv = nullptr;
      if (WritesInPlace(out)) {
        data = out.device.get();
        scale_inv = static_cast<uint8_t*>(data) + o.layout.data_bytes;
      } else {
        if (absl::Status st = OwnOutput(o); !st.ok()) return st;
        data = o.data.get();
        scale_inv = o.scales.get();
      }
      serve.push_back({s.info.policy.master, s.master.get(),
                       static_cast<const int16_t*>(s.remainder.get()), s.info.rows, s.info.cols,
                       kernels::Recipe::kFp8Tensor, KernelDirection(o.key.direction),
                       static_cast<const float*>(s.scalars.get()), data, scale_inv});
      served.emplace_back(i, f);
    }
  }
  if (!serve.empty()) {
    const size_t bytes = kernels::ServeQuantizeCudaWorkspaceBytes(serve.size());
    if (serve_workspace_.bytes() < bytes) {
      serve_workspace_.Free();
      if (absl::Status st = serve_workspace_.Allocate(bytes); !st.ok()) return st;
    }
    if (absl::Status st = FromKernel(kernels::ServeQuantizeCuda(serve, serve_workspace_.get(),
                                                                serve_workspace_.bytes(), stream_));
        !st.ok()) {
      return st;
    }
    for (const auto& [i, f] : served) {
      auto& s = *static_cast<CudaTensorState*>(tensors[i].state);
      if (absl::Status st = CopyOutput(s.outputs[f], tensors[i].out->formats[f]); !st.ok()) {
        return st;
      }
    }
  }
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace paramd::cuda
