// The `cuda:N` backend: master weights, moments and served formats live in GPU memory; a step is
// the kernels' multi-tensor launches (kernels/cuda_step.h) over all tensors of the job. Gradients
// pushed in data chunks arrive in host slots and are copied up; served bytes are copied down into
// the host buffers the transports read. Both host sides are allocated page-locked (its host
// staging, pinned_allocator.h), so the copies run at the link's speed. For trainers on its node
// (DESIGN.md §6) the backend also exports GPU memory (exported_memory.h): each job's few
// allocations, carved into its gradient slots and served bytes, whose IPC handles the job's
// trainers open once; a slot a trainer wrote there is read in place, and the step writes each
// version's served bytes there (besides the host copy).
//
// It has every ability of backend.h. Its files, by responsibility:
//   cuda_backend.cc   the device, its streams and events, health, exported and lent memory
//   state.cc          a tensor's state: created, imported, read
//   step.cc           the step: decided on the device, or on the host (check, then ApplyStep)
//   step_launch.cc    the step's launch: slots up, the kernel, served bytes on, split tensors'
//   round step_plan.cc      the kernels' descriptors and the plans kept across steps
//   served_bytes.cc   served bytes copied down for host readers, or a skipped step's re-served
//
// Only this folder includes this header; the rest of the daemon sees MakeCudaBackend
// (server/backend/backends.h).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unchecked_mutex.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda_step.h"
#include "kernels/step_rules.h"
#include "server/backend/backend.h"
#include "server/backend/cuda/device_buffer.h"
#include "server/backend/cuda/exported_memory.h"
#include "server/backend/cuda/lent_memory.h"

namespace paramd::cuda {

// Milliseconds from `from` to `to` (the debug log's timings).
inline double Ms(std::chrono::steady_clock::time_point from,
                 std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// Where the step writes a served format straight into the version's exported bytes: there when
// its scales (which follow the data) stay 16-byte aligned for the kernels' vector stores.
inline bool WritesInPlace(const ServedFormat& f) {
  return !f.device.empty() && f.layout.data_bytes % 16 == 0;
}

struct DeviceOutput {
  FormatKey key;
  kernels::ServeBufferLayout layout;
  DeviceBuffer data;
  DeviceBuffer scales;
};

class CudaTensorState : public TensorState {
 public:
  explicit CudaTensorState(const TensorInfo& info) : info(info), n(info.rows * info.cols) {}
  StateBytes state_bytes() const override { return PolicyStateBytes(info); }

  const TensorInfo info;
  const int64_t n;
  DeviceBuffer master, remainder, exp_avg, exp_avg_scale_inv, exp_avg_sq, exp_avg_sq_scale_inv;
  DeviceBuffer scalars;  // [fp8_tensor scale, fp8_delayed scale, master amax]
  // In the served tensor's format order; a format the step writes in place (WritesInPlace) gets
  // these buffers only when a version has no exported bytes.
  std::vector<DeviceOutput> outputs;
  std::vector<DeviceBuffer> slots;  // host slots' copies, one per rank, allocated when first used
  kernels::AmaxHistory history{16};
  float delayed_scale = 1.0f;
};

class CudaBackend final : public Backend,
                          public ExportedMemoryAbility,
                          public HostStagingAbility,
                          public DeviceMemoryAbility {
 public:
  CudaBackend(int device, int host_threads) : device_(device), pool_(host_threads) {}
  ~CudaBackend() override;
  absl::Status Init();

  // The core (state.cc, step.cc).
  std::string name() const override;
  absl::StatusOr<std::unique_ptr<TensorState>> CreateState(const TensorInfo& info,
                                                           std::span<const float> initial,
                                                           ServedTensor* out,
                                                           const WholeAmax& whole_amax) override;
  // A job on one daemon: decided on the device (StepOnDevice); a sharded one on the host.
  absl::StatusOr<StepOutcome> Step(const StepInput& input) override;
  absl::StatusOr<GradientCheck> CheckGradients(std::span<TensorStep> tensors, float grad_scale,
                                               bool norms) override;
  absl::Status ApplyStep(std::span<TensorStep> tensors, const StepScalars& scalars,
                         const std::function<void(size_t)>& tensor_done) override;
  // served_bytes.cc: the host bytes, and the device bytes where the version has exported ones.
  absl::Status ServePrevious(std::span<TensorStep> tensors,
                             const std::function<void(size_t)>& tensor_done) override;
  absl::Status ReadStateArray(const TensorState& state, StateArray array, int64_t offset,
                              std::span<uint8_t> out) override;
  absl::StatusOr<TensorScalars> ReadStateScalars(const TensorState& state) override;
  absl::StatusOr<std::unique_ptr<TensorState>> ImportState(const TensorInfo& info,
                                                           HostTensorState host,
                                                           ServedTensor* out) override;
  absl::Status Health() override;

  ExportedMemoryAbility* exported_memory() override { return this; }
  HostStagingAbility* host_staging() override { return this; }
  DeviceMemoryAbility* device_memory() override { return this; }

  // ExportedMemoryAbility (cuda_backend.cc).
  DeviceExports Exports(const std::string& job) const override;
  std::shared_ptr<ExportedMemory> ExportedMemoryFor(const std::string& job) override;
  absl::StatusOr<std::shared_ptr<const void>> MapLent(const v1::LentMemory& lent,
                                                      int64_t bytes) override;
  absl::StatusOr<const void*> LentReadyEvent(const v1::LentMemory& lent) override;

  // HostStagingAbility (served_bytes.cc).
  BufferAllocator* HostAllocator() override;
  absl::Status ReadyHostBytes(const ServedTensor& served) override;
  int64_t host_copies() const override { return host_copies_.load(); }

  // DeviceMemoryAbility (cuda_backend.cc).
  absl::StatusOr<int64_t> FreeDeviceMemory() override;
  int64_t plans_made() const override { return plans_made_.load(); }

 private:
  // A step's plan kept across steps, with the workspace its descriptors are bound in.
  struct KeptPlan {
    std::vector<kernels::CudaStepTensor> descs;  // what it was made from
    kernels::CudaStepPlan plan;
    bool bound = false;  // its descriptors are in `workspace`
    DeviceBuffer workspace;
    HostBuffer staging;  // page-locked: the descriptors on their way up (BindAsync)
    uint64_t used = 0;   // the plan_uses_ count of its last step (the least recent is replaced)
  };

  void NoticeFailure(const absl::Status& failed);

  // state.cc
  absl::StatusOr<std::unique_ptr<CudaTensorState>> Allocate(const TensorInfo& info,
                                                            const ServedTensor& out);
  static absl::Status OwnOutput(DeviceOutput& o);
  absl::Status UploadServed(const ServedTensor& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // step.cc
  // The gradient check, the decision (skip where a gradient is not finite; the clip from the block
  // sums when max_grad_norm > 0) and the step, queued together: `queued()` is called once, when
  // every tensor's work is queued, before the outcome is known, and the outcome is returned once
  // the step has run. `scalars.clip` is not read and `scalars.k` counts this step as applied. A
  // skipped step leaves the state as it is and re-serves each tensor's `previous` bytes.
  absl::StatusOr<StepOutcome> StepOnDevice(std::span<TensorStep> tensors,
                                           const StepScalars& scalars, double max_grad_norm,
                                           const std::function<void()>& queued);
  static absl::Status CheckNoWholeAmax(std::span<const TensorStep> tensors);
  absl::Status WaitForLentGradients(std::span<const TensorStep> tensors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<GradientCheck> CheckGradientsLocked(std::span<TensorStep> tensors,
                                                     float grad_scale, bool norms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StepLocked(std::span<TensorStep> tensors, const StepScalars& scalars,
                          const std::function<void(size_t)>& tensor_done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<StepOutcome> StepOnDeviceLocked(std::span<TensorStep> tensors,
                                                 const StepScalars& scalars, double max_grad_norm,
                                                 const std::function<void()>& queued)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static kernels::CudaStepScalars KernelScalars(const StepScalars& scalars);
  absl::Status CheckBuffers(bool norms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Publish(std::span<TensorStep> tensors, std::chrono::steady_clock::time_point start,
                       const std::function<void()>& queued) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // step_launch.cc
  absl::Status Upload(std::span<TensorStep> tensors) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status QueueStep(std::span<TensorStep> tensors, const kernels::CudaStepScalars& k)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool AfterAmaxRound(const TensorStep& t, const DeviceOutput& o);
  absl::Status CopyOutput(const DeviceOutput& d, ServedFormat& host)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ServeSplitPerTensor(std::span<TensorStep> tensors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // step_plan.cc
  absl::Status Plan(std::span<TensorStep> tensors, bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UsePlan(std::vector<kernels::CudaStepTensor> descs, bool wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  kernels::CudaStepPlan& plan() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return plan_->plan; }

  // served_bytes.cc
  static void ResolveFromFlag(const ServedTensor& served);
  // Copies the device bytes of `from`'s formats into `to`'s (a skipped step's).
  absl::Status CopyServedOnDevice(const ServedTensor& from, ServedTensor* to);

  float* HostScalars() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return reinterpret_cast<float*>(host_scalars_.data());
  }

  const int device_;
  kernels::ThreadPool pool_;  // version 0 on the host
  // One step (or state creation, import or read) at a time on the stream. A step holds it while
  // it publishes (the job's publish takes the job's lock), and a job holds its lock while it makes
  // version 0 or imports (which take this one): the inverse orders never meet, as a job starts no
  // step while it makes version 0 or imports, and imports only between steps. absl::Mutex's
  // lock-order detector would abort on them all the same (common/unchecked_mutex.h).
  UncheckedMutex mu_;
  // Made in Init, then used under mu_ (stream_) or by host readers (copy_stream_, step_done_).
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;  // host readers' copies down (ReadyHostBytes)
  // Recorded on stream_ after each step's work (interprocess: cuda_ipc trainers wait for it).
  cudaEvent_t step_done_ = nullptr;
  cudaEvent_t kernel_timing_[2] = {nullptr, nullptr};  // around the fused kernel (debug log)
  std::string step_event_;                             // its cudaIpcEventHandle_t bytes
  std::atomic<int64_t> host_copies_{0};
  // Steps' plans, kept: a job's steps cycle through a few sets of buffers (its served versions, its
  // slot sets or the trainers' lent gradients: 6 combinations at most for a job of kSlotSets slot
  // sets and 2 served versions in use), so a step's descriptors are most often a step's of a few
  // steps back, and its plan is reused instead of made and sent up again.
  static constexpr size_t kKeptPlans = 8;
  std::array<KeptPlan, kKeptPlans> plans_ ABSL_GUARDED_BY(mu_);
  KeptPlan* plan_ ABSL_GUARDED_BY(mu_) = nullptr;  // the step's (UsePlan)
  uint64_t plan_uses_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> plans_made_{0};  // plans made, not kept ones reused (plans_made())
  static constexpr int kDecisionFlags = 16;
  // Page-locked ring: steps decided on the device, their flags.
  HostBuffer decision_flags_ ABSL_GUARDED_BY(mu_);
  uint64_t decided_steps_ ABSL_GUARDED_BY(mu_) = 0;
  DeviceBuffer finite_ ABSL_GUARDED_BY(mu_);  // the gradient check's flag
  // A step decided on the device: its clip (StepDecisionCuda).
  DeviceBuffer clip_ ABSL_GUARDED_BY(mu_);
  // The gradient check's block sums, as many as the biggest job's.
  DeviceBuffer norm_sums_ ABSL_GUARDED_BY(mu_);
  // A step's fp8_delayed scales, then its masters' amaxes.
  DeviceBuffer step_scalars_ ABSL_GUARDED_BY(mu_);
  // Split tensors' fp8_tensor serve (ServeSplitPerTensor).
  DeviceBuffer serve_workspace_ ABSL_GUARDED_BY(mu_);
  // The same on the host, page-locked: one asynchronous copy each way, where pageable memory would
  // make every copy wait for the device. Grown for a bigger job only.
  HostBuffer host_scalars_ ABSL_GUARDED_BY(mu_);
  absl::Mutex health_mu_;
  absl::Status unusable_ ABSL_GUARDED_BY(health_mu_);  // not OK once the context failed (Health)
  std::string uuid_;  // the GPU's UUID bytes (trainers mapping its memory match it)
  std::unique_ptr<ExportedMemories> exported_;  // each job's exported GPU memory
  LentMemory lent_{device_};                    // trainers' lent gradients, opened here
};

}  // namespace paramd::cuda
