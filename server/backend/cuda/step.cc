// The cuda:N step (Backend::Step): the check, decision and step queued together on the device
// (StepOnDevice), or a sharded job's decided on the host (CheckGradients, ApplyStep); their
// launches are step_launch.cc's, their plans step_plan.cc's (cuda_backend.h).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/cuda_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/backend/cuda/cuda_backend.h"
#include "server/backend/kernel_status.h"

namespace paramd::cuda {

absl::StatusOr<GradientCheck> CudaBackend::CheckGradients(std::span<TensorStep> tensors,
                                                          float grad_scale, bool norms) {
  UncheckedMutexLock lock(&mu_);
  absl::StatusOr<GradientCheck> check = CheckGradientsLocked(tensors, grad_scale, norms);
  if (!check.ok()) NoticeFailure(check.status());
  return check;
}

absl::StatusOr<StepOutcome> CudaBackend::Step(const StepInput& input) {
  // A sharded job's daemons agree on the check before the decision: the host decides (and a
  // split tensor's amax round runs between the step's passes, ServeSplitPerTensor).
  if (input.agreement || input.tensors.empty()) return StepDecidedOnHost(input);
  const size_t n = input.tensors.size();
  return StepOnDevice(input.tensors, input.scalars, input.max_grad_norm,
                      [&] { input.publish(0, n, nullptr); });
}

absl::Status CudaBackend::ApplyStep(std::span<TensorStep> tensors, const StepScalars& scalars,
                                    const std::function<void(size_t)>& tensor_done) {
  UncheckedMutexLock lock(&mu_);
  absl::Status status = StepLocked(tensors, scalars, tensor_done);
  if (!status.ok()) NoticeFailure(status);
  return status;
}

// A step decided on the device does not stop between its passes: a split tensor's amax round
// (TensorStep::whole_amax) needs the step decided on the host, which a sharded job's takes.
absl::Status CudaBackend::CheckNoWholeAmax(std::span<const TensorStep> tensors) {
  for (const TensorStep& t : tensors) {
    if (t.whole_amax) {
      return absl::InternalError(
          "a split tensor's amax round needs a step decided on the host (StepDecidedOnHost)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> CudaBackend::StepOnDevice(std::span<TensorStep> tensors,
                                                      const StepScalars& scalars,
                                                      double max_grad_norm,
                                                      const std::function<void()>& queued) {
  if (absl::Status s = CheckNoWholeAmax(tensors); !s.ok()) return s;
  UncheckedMutexLock lock(&mu_);
  absl::StatusOr<StepOutcome> outcome = StepOnDeviceLocked(tensors, scalars, max_grad_norm, queued);
  if (!outcome.ok()) NoticeFailure(outcome.status());
  return outcome;
}

// The stream waits, on the device, for the events the lent gradients' marks named: the work the
// trainer queued before lending them (backward, writing them) runs before anything reads them.
absl::Status CudaBackend::WaitForLentGradients(std::span<const TensorStep> tensors) {
  std::vector<const void*> waited;
  for (const TensorStep& t : tensors) {
    for (const void* event : t.ready_events) {
      if (event == nullptr || std::find(waited.begin(), waited.end(), event) != waited.end()) {
        continue;
      }
      waited.push_back(event);
      PARAMD_CUDA_RETURN_IF_ERROR(
          cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(const_cast<void*>(event)), 0));
    }
  }
  return absl::OkStatus();
}

// The host-decided path's first reader of the gradients (a sharded job's): it waits for them as
// StepOnDeviceLocked does, and ApplyStep's launches follow it on the same stream.
absl::StatusOr<GradientCheck> CudaBackend::CheckGradientsLocked(std::span<TensorStep> tensors,
                                                                float grad_scale, bool norms) {
  PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = Upload(tensors); !s.ok()) return s;
  if (absl::Status s = Plan(tensors, /*wait=*/true); !s.ok()) return s;
  const auto planned = std::chrono::steady_clock::now();
  const size_t blocks = static_cast<size_t>(plan().num_norm_blocks());
  if (absl::Status s = CheckBuffers(norms); !s.ok()) return s;
  if (absl::Status s = WaitForLentGradients(tensors); !s.ok()) return s;
  absl::Status st = FromKernel(kernels::GradCheckCuda(
      plan(), grad_scale, norms ? static_cast<double*>(norm_sums_.get()) : nullptr,
      static_cast<int*>(finite_.get()), stream_));
  if (!st.ok()) return st;
  int all_finite = 0;
  std::vector<double> flat(norms ? blocks : 0);
  PARAMD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&all_finite, finite_.get(), sizeof(int), cudaMemcpyDeviceToHost, stream_));
  if (norms && blocks > 0) {
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        flat.data(), norm_sums_.get(), blocks * sizeof(double), cudaMemcpyDeviceToHost, stream_));
  }
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  PARAMD_LOG(DEBUG) << "cuda:" << device_ << " gradient check of " << tensors.size()
                    << " tensors: upload and plan " << Ms(start, planned) << " ms, check "
                    << Ms(planned, std::chrono::steady_clock::now()) << " ms";
  GradientCheck check;
  check.finite = all_finite != 0;
  size_t next = 0;
  for (const TensorStep& t : tensors) {
    const auto& s = *static_cast<const CudaTensorState*>(t.state);
    const size_t count = norms ? static_cast<size_t>(kernels::NumNormBlocks(s.info.rows)) : 0;
    check.block_sums.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(next),
                                  flat.begin() + static_cast<std::ptrdiff_t>(next + count));
    next += count;
  }
  return check;
}

// One launch over all tensors (kernels/cuda_step.h). Every tensor is reported done as soon as the
// step's work is queued, with step_done_ recorded after it: a trainer's pull of the new version
// answers then, and its stream waits for the event (cuda_ipc), so its next forward is queued
// behind the step on the GPU while the step runs. The state is final when this returns.
absl::Status CudaBackend::StepLocked(std::span<TensorStep> tensors, const StepScalars& scalars,
                                     const std::function<void(size_t)>& tensor_done) {
  PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const auto start = std::chrono::steady_clock::now();
  // The slots went up and the plan was made in CheckGradients, which StepDecidedOnHost calls first
  // with the same tensors; the check's launches used its counters.
  if (absl::Status s = FromKernel(plan().ResetCounters(stream_)); !s.ok()) return s;
  if (absl::Status s = QueueStep(tensors, KernelScalars(scalars)); !s.ok()) return s;
  if (absl::Status s = ServeSplitPerTensor(tensors); !s.ok()) return s;
  auto each_done = [&] {
    if (!tensor_done) return;
    for (size_t i = 0; i < tensors.size(); ++i) tensor_done(i);
  };
  if (absl::Status s = Publish(tensors, start, each_done); !s.ok()) return s;
  const float* amax = HostScalars() + tensors.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    static_cast<CudaTensorState*>(tensors[i].state)->history.Append(amax[i]);
  }
  return absl::OkStatus();
}

// The step rules and the step queued together, the host waiting for nothing before the step is
// published (StepOnDevice): the reads wait for the lent gradients' ready events
// on the device, the kernels read the clip and the found-inf flag the check and StepDecisionCuda
// wrote there, and a skipped step's copies put the previous version's bytes into the new one.
absl::StatusOr<StepOutcome> CudaBackend::StepOnDeviceLocked(std::span<TensorStep> tensors,
                                                            const StepScalars& scalars,
                                                            double max_grad_norm,
                                                            const std::function<void()>& queued) {
  PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = Upload(tensors); !s.ok()) return s;
  if (absl::Status s = Plan(tensors, /*wait=*/false); !s.ok()) return s;
  const bool clipping = max_grad_norm > 0;
  if (absl::Status s = CheckBuffers(clipping); !s.ok()) return s;
  if (clip_.get() == nullptr) {
    if (absl::Status s = clip_.Allocate(sizeof(float)); !s.ok()) return s;
  }
  if (decision_flags_.data() == nullptr) {
    absl::StatusOr<HostBuffer> pinned = HostAllocator()->Allocate(kDecisionFlags * sizeof(int));
    if (!pinned.ok()) return pinned.status();
    decision_flags_ = *std::move(pinned);
  }
  // Only now, every allocation made (freeing device memory synchronizes the device, which would
  // make this host wait for backward), the stream waits for the lent gradients' events.
  if (absl::Status s = WaitForLentGradients(tensors); !s.ok()) return s;
  auto* finite = static_cast<int*>(finite_.get());
  auto* sums = static_cast<double*>(norm_sums_.get());
  auto* clip = static_cast<float*>(clip_.get());
  if (absl::Status s = FromKernel(kernels::GradCheckCuda(
          plan(), scalars.grad_scale, clipping ? sums : nullptr, finite, stream_));
      !s.ok()) {
    return s;
  }
  if (clipping) {
    if (absl::Status s = FromKernel(kernels::StepDecisionCuda(sums, plan().num_norm_blocks(),
                                                              max_grad_norm, clip, stream_));
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = FromKernel(plan().ResetCounters(stream_)); !s.ok()) return s;
  std::vector<float> delayed_before;
  for (const TensorStep& t : tensors) {
    delayed_before.push_back(static_cast<const CudaTensorState*>(t.state)->delayed_scale);
  }
  kernels::CudaStepScalars k = KernelScalars(scalars);
  k.d_clip = clipping ? clip : nullptr;
  k.d_all_finite = finite;
  if (absl::Status s = QueueStep(tensors, k); !s.ok()) return s;
  std::vector<kernels::CudaSkipCopy> copies;
  for (const TensorStep& t : tensors) {
    if (t.previous == nullptr) continue;
    for (size_t f = 0; f < t.out->formats.size() && f < t.previous->formats.size(); ++f) {
      const DeviceBytes& from = t.previous->formats[f].device;
      const DeviceBytes& to = t.out->formats[f].device;
      if (from.empty() || to.empty()) continue;
      copies.push_back({to.get(), from.get(), to.size()});
    }
  }
  if (absl::Status s = FromKernel(kernels::CopyIfSkippedCuda(copies, finite, stream_)); !s.ok()) {
    return s;
  }
  // The outcome comes down behind the step: the flag, into a slot of a ring that host readers
  // of this step's versions resolve their outcome from (ReadyHostBytes; a slot comes round
  // again only steps after the job resolved them), then the clip.
  int* flag = reinterpret_cast<int*>(decision_flags_.data()) + decided_steps_++ % kDecisionFlags;
  PARAMD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(flag, finite, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  auto* clip_bytes = reinterpret_cast<uint8_t*>(HostScalars() + 2 * tensors.size());
  if (clipping) {
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(clip_bytes, clip, sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  for (TensorStep& t : tensors) t.out->decision_flag = flag;
  if (absl::Status s = Publish(tensors, start, queued); !s.ok()) return s;
  StepOutcome outcome;
  outcome.skipped = *reinterpret_cast<const volatile int*>(flag) == 0;
  if (clipping) std::memcpy(&outcome.clip, clip_bytes, sizeof(float));
  const float* amax = HostScalars() + tensors.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& st = *static_cast<CudaTensorState*>(tensors[i].state);
    if (!outcome.skipped) {
      st.history.Append(amax[i]);
      continue;
    }
    // Skipped: the served scale stays the previous version's, and so do the host bytes of the
    // formats that lie in host memory alone.
    st.delayed_scale = delayed_before[i];
    ServedTensor& out = *tensors[i].out;
    if (tensors[i].previous == nullptr) continue;
    for (size_t f = 0; f < out.formats.size() && f < tensors[i].previous->formats.size(); ++f) {
      if (!out.formats[f].device.empty()) continue;
      const HostBuffer& from = tensors[i].previous->formats[f].bytes;
      std::memcpy(out.formats[f].bytes.data(), from.data(), static_cast<size_t>(from.size()));
    }
  }
  return outcome;
}

kernels::CudaStepScalars CudaBackend::KernelScalars(const StepScalars& scalars) {
  kernels::CudaStepScalars k;
  k.adamw = scalars.adamw;
  k.grad_scale = scalars.grad_scale;
  k.clip = scalars.clip;
  k.seed = scalars.seed;
  k.k = static_cast<uint32_t>(scalars.k);
  return k;
}

// The check's flag and (with norms) block sums, kept from step to step (grown for a bigger job
// only), so a step of a job whose buffers exist allocates nothing and still runs when another
// job filled the GPU.
absl::Status CudaBackend::CheckBuffers(bool norms) {
  if (finite_.get() == nullptr) {
    if (absl::Status s = finite_.Allocate(sizeof(int)); !s.ok()) return s;
  }
  const size_t blocks = static_cast<size_t>(plan().num_norm_blocks());
  if (norms && norm_sums_.bytes() < blocks * sizeof(double)) {
    norm_sums_.Free();
    if (absl::Status s = norm_sums_.Allocate(blocks * sizeof(double)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Records step_done_ after the queued step, reports it queued (every tensor done), and waits for
// the step.
absl::Status CudaBackend::Publish(std::span<TensorStep> tensors,
                                  std::chrono::steady_clock::time_point start,
                                  const std::function<void()>& queued) {
  PARAMD_CUDA_RETURN_IF_ERROR(cudaEventRecord(step_done_, stream_));
  const auto enqueued = std::chrono::steady_clock::now();
  if (queued) queued();
  const auto published = std::chrono::steady_clock::now();
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (GetLogLevel() == LogLevel::kDebug) {
    float kernel_ms = 0;
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&kernel_ms, kernel_timing_[0], kernel_timing_[1]));
    PARAMD_LOG(DEBUG) << "cuda:" << device_ << " step of " << tensors.size() << " tensors: enqueue "
                      << Ms(start, enqueued) << " ms, publish " << Ms(enqueued, published)
                      << " ms, then the device " << Ms(published, std::chrono::steady_clock::now())
                      << " ms (the kernel " << kernel_ms << " ms); plans made "
                      << plans_made_.load() << " for " << plan_uses_ << " uses";
  }
  return absl::OkStatus();
}

}  // namespace paramd::cuda
