// The cuda:N backend's served bytes outside a step (cuda_backend.h): its page-locked host memory,
// a version's bytes copied down for a host reader once (its outcome resolved where it was
// pending), and a skipped step's bytes re-served on the device.
#include <cuda_runtime_api.h>

#include <cstring>

#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "server/backend/cuda/cuda_backend.h"
#include "server/backend/cuda/pinned_allocator.h"

namespace paramd::cuda {

BufferAllocator* CudaBackend::HostAllocator() { return PinnedAllocatorOf(device_); }

absl::Status CudaBackend::ReadyHostBytes(const ServedTensor& served) {
  absl::MutexLock host_lock(&served.host_mu);
  const bool pending = served.outcome_pending();
  if (!served.host_stale && !pending) return absl::OkStatus();
  const DeviceScope scope(device_);
  PARAMD_RETURN_IF_ERROR(scope.status());
  // Its own stream, which waits for the steps queued so far (a version is published once its
  // step is queued: step_done_), but not for later ones. Its host bytes are written only here,
  // under host_mu, before any host reader reads them.
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, step_done_, 0));
  if (!served.host_stale) {
    // Only the outcome: its flag came down before the step's event.
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
    ResolveFromFlag(served);
    return absl::OkStatus();
  }
  for (const ServedFormat& f : served.formats) {
    if (f.device.empty()) continue;
    auto* host = const_cast<uint8_t*>(f.bytes.data());
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, f.device.get(),
                                                static_cast<size_t>(f.bytes.size()),
                                                cudaMemcpyDeviceToHost, copy_stream_));
  }
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
  served.host_stale = false;
  host_copies_.fetch_add(1);
  ResolveFromFlag(served);
  return absl::OkStatus();
}

// A version whose step has run (the caller synchronized with step_done_ after it was
// published): its outcome from the flag the step copied down, where it is still pending. The
// job resolves it to the same when the step returns; a host reader woken on the step's own
// thread cannot wait for that.
void CudaBackend::ResolveFromFlag(const ServedTensor& served) {
  if (served.decision_flag == nullptr || !served.outcome_pending()) return;
  const int all_finite = *reinterpret_cast<const volatile int*>(served.decision_flag);
  const_cast<ServedTensor&>(served).ResolveOutcome(all_finite == 0);
}

absl::Status CudaBackend::ServePrevious(std::span<TensorStep> tensors,
                                        const std::function<void(size_t)>& tensor_done) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ServedTensor& previous = *tensors[i].previous;
    ServedTensor& out = *tensors[i].out;
    // The previous version's host bytes, where its step left them in GPU memory.
    PARAMD_RETURN_IF_ERROR(ReadyHostBytes(previous));
    {
      absl::MutexLock host_lock(&out.host_mu);
      out.host_stale = false;
    }
    for (size_t f = 0; f < out.formats.size(); ++f) {
      std::memcpy(out.formats[f].bytes.data(), previous.formats[f].bytes.data(),
                  static_cast<size_t>(previous.formats[f].bytes.size()));
    }
    PARAMD_RETURN_IF_ERROR(CopyServedOnDevice(previous, &out));
    if (tensor_done) tensor_done(i);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyServedOnDevice(const ServedTensor& from, ServedTensor* to) {
  UncheckedMutexLock lock(&mu_);
  const absl::Status status = [&]() -> absl::Status {
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    for (size_t f = 0; f < from.formats.size() && f < to->formats.size(); ++f) {
      const DeviceBytes& src = from.formats[f].device;
      const DeviceBytes& dst = to->formats[f].device;
      if (src.empty() || dst.empty()) continue;
      PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.get(), src.get(),
                                                  static_cast<size_t>(dst.size()),
                                                  cudaMemcpyDeviceToDevice, stream_));
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }();
  if (!status.ok()) NoticeFailure(status);
  return status;
}

}  // namespace paramd::cuda
