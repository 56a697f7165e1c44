#include "server/daemon.h"

#include <unistd.h>

#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/backends.h"

namespace paramd {

inline constexpr char kDaemonVersion[] = "0.1.0";

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const v1::DaemonConfig& config) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(config);
  if (!backend.ok()) return backend.status();
  // This start's identity (also the shm probe, and the tag in the segment names: two daemons'
  // names stay apart even where process ids repeat, in containers).
  std::random_device random;
  const uint64_t instance = (uint64_t{random()} << 32) | random();
  std::unique_ptr<ShmArena> shm;
  // `shm` serves the cpu backend (DESIGN.md §6); a cuda:N job's host buffers are page-locked
  // staging for the GPU, and same-node GPU trainers use cuda_ipc.
  if (config.shared_memory() && (*backend)->name() == "cpu") {
    if (const int removed = ReclaimStaleShmSegments(getuid()); removed > 0) {
      PARAMD_LOG(WARNING) << "removed " << removed
                          << " shared-memory segments left by a daemon of this user that was "
                             "killed";
    }
    absl::StatusOr<std::unique_ptr<ShmArena>> arena = ShmArena::Create(
        ShmSegmentPrefix(getuid(), getpid(), absl::StrCat(absl::Hex(instance, absl::kZeroPad16))),
        config.shm_segment_bytes(), instance);
    if (arena.ok()) {
      shm = *std::move(arena);
    } else {
      PARAMD_LOG(WARNING) << "no shared memory (" << arena.status()
                          << "); jobs keep their buffers on the heap and the shm transport is off";
    }
  }
  return std::unique_ptr<Daemon>(new Daemon(config, *std::move(backend), std::move(shm), instance));
}

Daemon::Daemon(const v1::DaemonConfig& config, std::unique_ptr<Backend> backend,
               std::unique_ptr<ShmArena> shm, uint64_t instance)
    : config_(config),
      instance_(instance),
      shm_(std::move(shm)),
      backend_(std::move(backend)),
      backend_name_(backend_->name()),
      metrics_(std::make_unique<Metrics>()) {
  RegistryLimits limits;
  limits.max_jobs = config.max_jobs();
  limits.max_tensors_per_job = config.max_tensors_per_job();
  limits.max_job_bytes = config.max_job_bytes();
  limits.max_chunk_bytes = config.max_chunk_bytes();
  BufferAllocator* buffers = backend_->HostAllocator();
  if (buffers == nullptr) buffers = shm_ != nullptr ? shm_.get() : HeapAllocator();
  registry_ = std::make_unique<JobRegistry>(backend_.get(), limits, buffers);
}

Daemon::~Daemon() { executor_.WaitIdle(); }

void Daemon::Drain() {
  if (draining_.exchange(true)) return;
  PARAMD_LOG(INFO) << "draining: new work is refused from now on";
  if (drain_listener_) drain_listener_();
}

absl::Status Daemon::CheckServing() const {
  if (draining()) {
    return absl::UnavailableError(
        "the daemon is draining (Drain or a shutdown signal); no new work is accepted");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterResponse> Daemon::Register(const v1::RegisterRequest& request) {
  absl::StatusOr<v1::RegisterResponse> response = registry_->Register(request);
  if (response.ok()) {
    PARAMD_LOG(INFO) << "job " << request.job() << ": rank " << request.rank() << " of "
                     << request.world_size() << " registered (" << request.tensors_size()
                     << " tensors)";
    UpdateGauges();
  }
  return response;
}

void Daemon::StartStep(std::shared_ptr<Job> job, StepWork work) {
  executor_.Submit([this, job = std::move(job), work] {
    // None while an export of the job holds its steps back (its end submits the step again);
    // several when this one ran steps held back before it.
    const std::vector<StepReport> reports = job->RunOrHoldStep(work);
    for (const StepReport& report : reports) {
      metrics_->StepDone(job->name(), report.seconds, report.elements, report.skipped);
      if (report.skipped) {
        PARAMD_LOG(WARNING) << "job " << job->name() << ": step " << report.step
                            << " skipped: a gradient is not finite (weights re-served unchanged)";
      }
      PARAMD_LOG(DEBUG) << "job " << job->name() << ": step " << report.step << " took "
                        << report.seconds * 1e3 << " ms, clip " << report.clip;
    }
    if (!reports.empty()) UpdateGauges();
  });
}

void Daemon::UpdateGauges() {
  int64_t state = 0, served = 0, slots = 0, leases = 0;
  std::map<std::string, int> by_transport = {{"inline", 0}};
  if (shm_ != nullptr) by_transport["shm"] = 0;
  if (backend_->Exports().has_value()) by_transport["cuda_ipc"] = 0;
  const auto jobs = registry_->Jobs();
  for (const auto& job : jobs) {
    const v1::JobStatus s = job->Status();
    state += s.state_bytes();
    served += s.served_bytes();
    slots += s.slot_bytes();
    for (const v1::TrainerTransport& t : s.trainers()) ++by_transport[t.transport()];
    leases += leases_->Held(job->name());
  }
  metrics_->SetJobs(static_cast<int>(jobs.size()));
  metrics_->SetTrainers(registry_->trainers());
  metrics_->SetStateBytes("state", state);
  metrics_->SetStateBytes("served", served);
  metrics_->SetStateBytes("slots", slots);
  metrics_->SetTrainersByTransport(by_transport);
  metrics_->SetLeases(leases, leases_->expired());
  if (shm_ != nullptr) metrics_->SetShmBytes(shm_->reserved_bytes(), shm_->used_bytes());
}

v1::StatusResponse Daemon::Status(const std::string& job) const {
  v1::StatusResponse response;
  response.set_daemon_version(kDaemonVersion);
  response.set_backend(backend_name_);
  // DESIGN.md §6's order: same node first (by backend), then the rest.
  if (backend_->Exports().has_value()) response.add_transports("cuda_ipc");
  if (shm_ != nullptr) {
    response.add_transports("shm");
    response.set_shm_segments(static_cast<int32_t>(shm_->segment_names().size()));
    response.set_shm_reserved_bytes(shm_->reserved_bytes());
    response.set_shm_used_bytes(shm_->used_bytes());
  }
  response.add_transports("inline");
  response.set_draining(draining());
  response.set_uptime_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
  for (const auto& j : registry_->Jobs()) {
    if (job.empty() || j->name() == job) {
      v1::JobStatus* status = response.add_jobs();
      *status = j->Status();
      status->set_leases(leases_->Held(j->name()));
    }
  }
  return response;
}

}  // namespace paramd
