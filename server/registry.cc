#include "server/registry.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/quoted.h"
#include "server/job/job_memory.h"
#include "server/registration.h"
#include "server/shard/peer_exchange.h"

namespace paramd {

int64_t JobRegistry::JobBytes(const v1::RegisterRequest& spec) {
  const v1::RegisterRequest normalized = NormalizedSpec(spec);
  const std::vector<FormatKey> formats = ServedFormats(normalized);
  // A validated job may still describe more bytes than an int64 holds: sum wide, then saturate.
  unsigned __int128 bytes = 0;
  const int64_t world = spec.world_size();
  for (int i = 0; i < normalized.tensors_size(); ++i) {
    const v1::TensorSpec& t = normalized.tensors(i);
    const TensorInfo info = TensorInfoOf(normalized, i);
    // The state, and the FP32 values the cpu backend keeps beside a 16-bit master where the job
    // serves no FP32 (CpuWorkingBytes; a cuda:N backend reads the master instead: an upper bound).
    bytes += static_cast<unsigned __int128>(PolicyStateBytes(info).total()) +
             static_cast<unsigned __int128>(CpuWorkingBytes(info, formats));
    for (const FormatKey& f : formats) {
      const kernels::ServeBufferLayout layout = kernels::ServeLayout(
          KernelRecipe(f.recipe), KernelDirection(f.direction), t.rows(), t.cols());
      bytes += 2 * static_cast<unsigned __int128>(layout.data_bytes + layout.scale_bytes);
    }
    // Slots of the step being collected and of the running step.
    bytes += 2 * static_cast<unsigned __int128>(world) *
             static_cast<unsigned __int128>(t.rows() * t.cols() * ElementBytes(t.grad_type()));
  }
  constexpr auto kMax = static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max());
  return static_cast<int64_t>(bytes > kMax ? kMax : bytes);
}

absl::StatusOr<v1::RegisterResponse> JobRegistry::Register(const v1::RegisterRequest& request,
                                                           const JobPeers& peers) {
  if (absl::Status s = ValidateRegistration(request); !s.ok()) return s;
  if (absl::Status health = backend_->Health(); !health.ok()) {
    return WithReason(health, v1::ERROR_REASON_BACKEND_UNUSABLE);
  }
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request.job());
    if (it != jobs_.end()) {
      job = it->second;
    } else {
      if (static_cast<int>(jobs_.size()) >= limits_.max_jobs) {
        return absl::ResourceExhaustedError(
            absl::StrCat("this daemon holds ", jobs_.size(),
                         " jobs, its max_jobs limit; raise max_jobs or "
                         "run the job on another daemon"));
      }
      if (request.tensors_size() > limits_.max_tensors_per_job) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "job ", Quoted(request.job()), " has ", request.tensors_size(),
            " tensors; this daemon's max_tensors_per_job is ", limits_.max_tensors_per_job));
      }
      // Every rank keeps a slot record per tensor from the start, whatever the tensors' sizes.
      constexpr int64_t kMaxSlotRecords = int64_t{1} << 22;
      if (int64_t{request.tensors_size()} * request.world_size() > kMaxSlotRecords) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "job ", Quoted(request.job()), " has ", request.tensors_size(), " tensors x ",
            request.world_size(), " ranks; a daemon holds at most ", kMaxSlotRecords,
            " (tensor, rank) slots per job: split the job's tensors over several daemons"));
      }
      // What this daemon holds of the job: the whole job, or its part of a sharded one.
      const bool sharded = peers.exchange != nullptr && request.daemons_size() > 1;
      std::optional<v1::RegisterRequest> part;
      if (sharded) {
        absl::StatusOr<v1::RegisterRequest> held = DaemonPart(NormalizedSpec(request), peers.self);
        if (!held.ok()) return held.status();
        part = *std::move(held);
      }
      const v1::RegisterRequest& holds = part.has_value() ? *part : request;
      const int64_t bytes = JobBytes(holds);
      if (limits_.max_job_bytes > 0 && bytes > limits_.max_job_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "job ", Quoted(request.job()), " needs up to ", bytes,
            " bytes of state, served formats and slots; this daemon's max_job_bytes is ",
            limits_.max_job_bytes));
      }
      const MemoryBytes footprint =
          JobFootprint(holds, BackendPlacement{backend_->device_memory() != nullptr});
      MemoryBudget::Reservation reservation;
      if (budget_ != nullptr) {
        absl::StatusOr<MemoryBudget::Reservation> reserved =
            budget_->Reserve(Quoted(request.job()), footprint);
        if (!reserved.ok() && EarlyStepBytes(holds) > 0 && backend_->device_memory() == nullptr) {
          return WithReason(
              absl::Status(reserved.status().code(),
                           absl::StrCat(reserved.status().message(), "; early_step counts ",
                                        EarlyStepBytes(holds),
                                        " bytes of it (a second copy of the state): register "
                                        "without early_step, or raise the daemon's memory budget")),
              v1::ERROR_REASON_MEMORY_BUDGET);
        }
        if (!reserved.ok()) return reserved.status();
        reservation = *std::move(reserved);
      }
      if (sharded) {
        std::vector<std::string> daemons(request.daemons().begin(), request.daemons().end());
        if (absl::Status s = peers.exchange->OpenJob(request.job(), daemons); !s.ok()) return s;
      }
      job = std::make_shared<Job>(request, backend_,
                                  buffers_ ? buffers_(request.job(), footprint) : nullptr,
                                  std::move(part), sharded ? peers : JobPeers{});
      job->set_reservation(std::move(reservation));
      jobs_.emplace(request.job(), job);
    }
  }
  return job->Register(request, limits_.max_chunk_bytes);
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Find(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no job ", Quoted(name), " on this daemon; trainers call Register first"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Delete(const std::string& name) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(name);
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("no job ", Quoted(name), " on this daemon"));
    }
    job = std::move(it->second);
    jobs_.erase(it);
  }
  job->Fail(WithReason(
      absl::NotFoundError(absl::StrCat(
          "job ", Quoted(name), " was deleted from this daemon; register it again to start over")),
      v1::ERROR_REASON_JOB_FAILED));
  return job;
}

std::vector<std::shared_ptr<Job>> JobRegistry::Jobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Job>> jobs;
  for (const auto& entry : jobs_) jobs.push_back(entry.second);
  return jobs;
}

int JobRegistry::trainers() const {
  int total = 0;
  for (const auto& job : Jobs()) total += job->registered_ranks();
  return total;
}

}  // namespace paramd
