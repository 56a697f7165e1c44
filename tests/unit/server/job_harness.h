// A Job on a real CpuBackend, driven the way the services drive it (pushes and commits), with the
// step run directly when the last commit hands it over instead of on the step executor.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/backend/cpu_backend.h"
#include "server/job/job.h"
#include "tests/unit/server/push_chunks.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/run_taken_step.h"

namespace paramd::testing {

class JobHarness {
 public:
  explicit JobHarness(const v1::RegisterRequest& spec)
      : spec_(spec), backend_(2), job_(spec, &backend_) {}

  Job& job() { return job_; }
  const v1::RegisterRequest& spec() const { return spec_; }

  absl::Status Register(int rank) { return job_.Register(ForRank(spec_, rank), 4096).status(); }
  absl::Status RegisterAll() {
    for (int r = 0; r < spec_.world_size(); ++r) {
      if (absl::Status s = Register(r); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ChunkBuffer::Stored> Push(int rank, int64_t step, const std::string& tensor,
                                           int64_t offset, std::string_view data,
                                           v1::PushKind kind = v1::PUSH_KIND_GRADIENT) {
    return job_.Push(ChunkOf(spec_.job(), rank, step, tensor, offset, data, kind));
  }

  // Pushes `bytes` of one tensor in chunks of at most `chunk_bytes`, in order.
  absl::Status PushTensor(int rank, int64_t step, int tensor, std::string_view bytes,
                          int64_t chunk_bytes, v1::PushKind kind = v1::PUSH_KIND_GRADIENT) {
    const int64_t size = static_cast<int64_t>(bytes.size());
    for (int64_t offset = 0; offset < size; offset += chunk_bytes) {
      const int64_t length = std::min(chunk_bytes, size - offset);
      absl::StatusOr<ChunkBuffer::Stored> stored =
          Push(rank, step, spec_.tensors(tensor).name(), offset,
               bytes.substr(static_cast<size_t>(offset), static_cast<size_t>(length)), kind);
      if (!stored.ok()) return stored.status();
    }
    return absl::OkStatus();
  }

  absl::Status UploadWeights(const std::vector<std::vector<float>>& weights,
                             int64_t chunk_bytes = 256) {
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      if (absl::Status s = PushTensor(0, 0, i, ToBytes(weights[static_cast<size_t>(i)]),
                                      chunk_bytes, v1::PUSH_KIND_INITIAL_WEIGHTS);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  absl::Status PushGradients(int rank, int64_t step, const StepGradients& grads,
                             int64_t chunk_bytes = 256) {
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      if (absl::Status s =
              PushTensor(rank, step, i, grads[static_cast<size_t>(i)][rank], chunk_bytes);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<CommitOutcome> Commit(int rank, int64_t step,
                                       std::optional<double> lr = std::nullopt,
                                       std::optional<double> grad_scale = std::nullopt) {
    v1::CommitRequest request;
    request.set_job(spec_.job());
    request.set_rank(rank);
    request.set_step(step);
    if (lr) request.set_lr(*lr);
    if (grad_scale) request.set_grad_scale(*grad_scale);
    return job_.Commit(request);
  }

  // Every rank pushes and commits `step`; the step the last commit hands over runs.
  absl::Status RunFullStep(int64_t step, const StepGradients& grads,
                           std::optional<double> lr = std::nullopt,
                           std::optional<double> grad_scale = std::nullopt) {
    for (int r = 0; r < spec_.world_size(); ++r) {
      if (absl::Status s = PushGradients(r, step, grads); !s.ok()) return s;
    }
    for (int r = 0; r < spec_.world_size(); ++r) {
      absl::StatusOr<CommitOutcome> outcome = Commit(r, step, lr, grad_scale);
      if (!outcome.ok()) return outcome.status();
      if (outcome->work) RunTakenStep(job_, *outcome->work);
    }
    return absl::OkStatus();
  }

  // The newest published bytes of a tensor in a format (empty before the initial weights).
  template <typename T>
  std::vector<T> Served(int tensor, v1::Recipe recipe) const {
    std::shared_ptr<const ServedTensor> served = job_.Served(tensor, 0);
    if (served == nullptr) return {};
    const ServedFormat* format = served->Find(FormatKey{recipe, v1::DIRECTION_ROWWISE});
    if (format == nullptr) return {};
    const HostBuffer* bytes = &format->bytes;
    return FromBytes<T>(
        std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  }
  std::vector<float> Master(int tensor) const { return Served<float>(tensor, v1::RECIPE_FP32); }
  std::vector<uint16_t> Bf16(int tensor) const { return Served<uint16_t>(tensor, v1::RECIPE_BF16); }

  // The job's status without its timing, for before/after comparisons.
  v1::JobStatus Snapshot() const {
    v1::JobStatus status = job_.Status();
    status.clear_last_step_seconds();
    return status;
  }

 private:
  const v1::RegisterRequest spec_;
  CpuBackend backend_;
  Job job_;
};

}  // namespace paramd::testing
