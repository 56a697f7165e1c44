// A job registered through JobRegistry on a real backend (a CpuBackend unless one is given), every
// rank registered and the initial weights uploaded, driven as the services drive it (chunked
// pushes, commits); the step a last commit hands over runs at once instead of on the step executor.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/backend/cpu_backend.h"
#include "server/job/job.h"
#include "server/registry.h"
#include "tests/unit/server/push_chunks.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/run_taken_step.h"

namespace paramd::testing {

class RegistryJobHarness {
 public:
  explicit RegistryJobHarness(const v1::RegisterRequest& spec, int threads = 2)
      : RegistryJobHarness(spec, std::make_unique<CpuBackend>(threads)) {}
  // On `backend`, with its own host memory for slots and served bytes where it has one (cuda:N's
  // page-locked buffers), as the daemon gives it.
  RegistryJobHarness(const v1::RegisterRequest& spec, std::unique_ptr<Backend> backend)
      : spec_(spec),
        backend_(std::move(backend)),
        registry_(backend_.get(), RegistryLimits{},
                  [backend = backend_.get()](const std::string&, const MemoryBytes&) {
                    HostStagingAbility* staging = backend->host_staging();
                    return staging != nullptr ? Borrowed(staging->HostAllocator()) : nullptr;
                  }) {}

  // Registers every rank through the registry (a job that a restore gives its state).
  absl::Status Register() {
    for (int r = 0; r < spec_.world_size(); ++r) {
      absl::StatusOr<v1::RegisterResponse> registered = registry_.Register(ForRank(spec_, r));
      if (!registered.ok()) return registered.status();
    }
    absl::StatusOr<std::shared_ptr<Job>> job = registry_.Find(spec_.job());
    if (!job.ok()) return job.status();
    job_ = *std::move(job);
    return absl::OkStatus();
  }
  // Registers every rank and uploads the initial weights.
  absl::Status Start(const std::vector<std::vector<float>>& initial) {
    if (absl::Status s = Register(); !s.ok()) return s;
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      const std::vector<float>& w = initial[static_cast<size_t>(i)];
      if (absl::Status s = PushTensor(0, 0, i, ToBytes(w), v1::PUSH_KIND_INITIAL_WEIGHTS);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  Job& job() { return *job_; }
  const std::shared_ptr<Job>& shared() const { return job_; }
  Backend& backend() { return *backend_; }
  JobRegistry& registry() { return registry_; }

  absl::Status PushTensor(int rank, int64_t step, int tensor, std::string_view bytes,
                          v1::PushKind kind = v1::PUSH_KIND_GRADIENT) {
    return PushInChunks(*job_, spec_, rank, step, tensor, bytes, 8192, kind);
  }

  // Every rank pushes and commits `step`; the step the last commit hands over runs.
  absl::StatusOr<StepReport> RunStep(int64_t step, const StepGradients& grads,
                                     std::optional<double> lr = std::nullopt,
                                     std::optional<double> grad_scale = std::nullopt) {
    for (int r = 0; r < spec_.world_size(); ++r) {
      for (int i = 0; i < spec_.tensors_size(); ++i) {
        if (absl::Status s = PushTensor(r, step, i, grads[static_cast<size_t>(i)][r]); !s.ok()) {
          return s;
        }
      }
    }
    // A job with early_step: its early steps run before the commits, none late whatever the
    // threads' timing (a test may count them).
    job_->AwaitEarlyIdle();
    std::optional<StepReport> report;
    for (int r = 0; r < spec_.world_size(); ++r) {
      v1::CommitRequest request;
      request.set_job(spec_.job());
      request.set_rank(r);
      request.set_step(step);
      if (lr) request.set_lr(*lr);
      if (grad_scale) request.set_grad_scale(*grad_scale);
      absl::StatusOr<CommitOutcome> outcome = job_->Commit(request);
      if (!outcome.ok()) return outcome.status();
      if (outcome->work) report = RunTakenStep(*job_, *outcome->work);
    }
    if (!report) return absl::InternalError("no commit handed the step over");
    if (!report->failed.ok()) return report->failed;
    return *report;
  }

  // The newest published version of a tensor.
  std::shared_ptr<const ServedTensor> Newest(int tensor) const { return job_->Served(tensor, 0); }

  // The newest served bytes (data, then scales) of a tensor in one format; empty when not served.
  std::vector<uint8_t> Served(int tensor, v1::Recipe recipe, v1::Direction direction) const {
    std::shared_ptr<const ServedTensor> served = Newest(tensor);
    if (served == nullptr) return {};
    // A host reader: a cuda:N step leaves the bytes on the GPU until one asks.
    HostStagingAbility* staging = backend_->host_staging();
    if (staging != nullptr && !staging->ReadyHostBytes(*served).ok()) return {};
    const ServedFormat* format = served->Find(FormatKey{recipe, direction});
    return format == nullptr ? std::vector<uint8_t>() : format->bytes.ToVector();
  }

 private:
  const v1::RegisterRequest spec_;
  std::unique_ptr<Backend> backend_;
  JobRegistry registry_;
  std::shared_ptr<Job> job_;
};

}  // namespace paramd::testing
