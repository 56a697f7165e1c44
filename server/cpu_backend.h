// The `cpu` backend: FP32 master and moments in host memory; the fused step runs on a pool of
// threads over cache-sized blocks of each tensor.
#pragma once

#include <memory>

#include "kernels/cpu/thread_pool.h"
#include "server/backend.h"

namespace paramd {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(int threads);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  absl::StatusOr<std::unique_ptr<TensorState>> CreateState(std::span<const float> initial,
                                                           ServedTensor* out) override;
  absl::Status Step(std::span<TensorStep> tensors, const kernels::AdamwScalars& scalars,
                    float grad_scale) override;

 private:
  kernels::ThreadPool pool_;
};

}  // namespace paramd
