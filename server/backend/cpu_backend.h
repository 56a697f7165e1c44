// The `cpu` backend: master weights and moments in host memory in the job's state policy; the
// fused step runs on a pool of threads, 128-row panel by panel, quantizing the block serve formats
// of each panel right after updating it, while it is in cache.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/step_rules.h"
#include "server/backend/backend.h"

namespace paramd {

class CpuBackend : public Backend, public LandedCheckAbility, public EarlyStepAbility {
 public:
  // `name`: "cpu", or "cpu:K" for one of a daemon's several. `cpus`: where its step threads run
  // (DaemonConfig.step_cpus, common/step_cpus.h); empty: wherever the scheduler puts them.
  explicit CpuBackend(int threads, std::string name = "cpu", std::vector<int> cpus = {});
  ~CpuBackend() override;

  std::string name() const override { return name_; }
  // The CPUs its step threads run on; empty where they are not placed.
  const std::vector<int>& step_cpus() const { return pool_.cpus(); }
  absl::StatusOr<std::unique_ptr<TensorState>> CreateState(const TensorInfo& info,
                                                           std::span<const float> initial,
                                                           ServedTensor* out,
                                                           const WholeAmax& whole_amax) override;
  absl::StatusOr<GradientCheck> CheckGradients(std::span<TensorStep> tensors, float grad_scale,
                                               bool norms) override;
  absl::StatusOr<TensorCheck> CheckLanded(const TensorInfo& info,
                                          std::span<const void* const> slots,
                                          kernels::SlotType slot_type, float grad_scale,
                                          bool norms) override;
  int64_t checked_at_step() const override { return checked_at_step_.load(); }
  int64_t landed_checks_used() const override { return landed_checks_used_.load(); }
  LandedCheckAbility* landed_check() override { return this; }
  absl::StatusOr<std::unique_ptr<TensorState>> MakeShadow(const TensorState& of) override;
  absl::Status StepEarly(const TensorState& from, TensorState& into, const TensorStep& step,
                         const StepScalars& scalars) override;
  int64_t early_steps_adopted() const override { return early_steps_adopted_.load(); }
  EarlyStepAbility* early_step() override { return this; }
  absl::Status ApplyStep(std::span<TensorStep> tensors, const StepScalars& scalars,
                         const std::function<void(size_t)>& tensor_done = nullptr) override;
  absl::Status ReadStateArray(const TensorState& state, StateArray array, int64_t offset,
                              std::span<uint8_t> out) override;
  absl::StatusOr<TensorScalars> ReadStateScalars(const TensorState& state) override;
  absl::StatusOr<std::unique_ptr<TensorState>> ImportState(const TensorInfo& info,
                                                           HostTensorState state,
                                                           ServedTensor* out) override;

 private:
  // One tensor's step (ApplyStep's body): its state and every served format, in place, or from
  // `from`'s arrays into t.state's (an early step, StepEarly).
  absl::Status StepTensor(TensorStep& t, const StepScalars& scalars,
                          const TensorState* from = nullptr);
  // One tensor's check on the pool; `guest`: from a thread that is not a step's (CheckLanded).
  absl::StatusOr<TensorCheck> CheckTensor(const TensorInfo& info, const kernels::GradSlots& grad,
                                          bool norms, bool guest);

  const std::string name_;
  kernels::ThreadPool pool_;
  std::atomic<int64_t> checked_at_step_{0};
  std::atomic<int64_t> landed_checks_used_{0};
  std::atomic<int64_t> early_steps_adopted_{0};
};

}  // namespace paramd
