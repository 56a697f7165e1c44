#include "server/daemon.h"

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "common/token_file.h"
#include "common/version.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/backend/backends.h"
#include "server/registration.h"
#include "server/state/state_fields.h"
#include "server/state/state_transfer.h"

namespace paramd {

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// The budget as configured, or its default from what the machine has now (server/memory_budget.h).
absl::StatusOr<MemoryBytes> ResolveBudget(const v1::DaemonConfig& config, Backend& backend) {
  MemoryBytes budget;
  PARAMD_ASSIGN_OR_RETURN(budget.host, HostBudget(config.memory_budget_bytes()));
  if (DeviceMemoryAbility* device = backend.device_memory(); device != nullptr) {
    budget.device = config.device_memory_budget_bytes();
    if (budget.device == 0) {
      PARAMD_ASSIGN_OR_RETURN(const int64_t free, device->FreeDeviceMemory());
      // The exported allocations come in 256 MiB granules.
      budget.device = std::max<int64_t>(
          0, static_cast<int64_t>(kDefaultBudgetShare * static_cast<double>(free)) - 256 * kMiB);
    }
  }
  return budget;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const v1::DaemonConfig& config) {
  PARAMD_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeBackend(config));
  return CreateWithBackend(config, std::move(backend));
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::CreateWithBackend(const v1::DaemonConfig& config,
                                                                  std::unique_ptr<Backend> made) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = std::move(made);
  PARAMD_ASSIGN_OR_RETURN(const MemoryBytes budget, ResolveBudget(config, **backend));
  PARAMD_LOG(INFO) << "memory budget: " << budget.host / kMiB << " MiB of host memory"
                   << (budget.device > 0
                           ? absl::StrCat(", ", budget.device / kMiB, " MiB of GPU memory")
                           : std::string());
  // This start's identity (the transports' ends tag what they hand out with it).
  std::random_device random;
  const uint64_t instance = (uint64_t{random()} << 32) | random();
  PARAMD_ASSIGN_OR_RETURN(std::string peer_token, PeerToken(config.token_file()));
  auto daemon = std::unique_ptr<Daemon>(new Daemon(config, *std::move(backend), instance, budget));
  daemon->peers_->set_token(std::move(peer_token));
  return daemon;
}

Daemon::Daemon(const v1::DaemonConfig& config, std::unique_ptr<Backend> backend, uint64_t instance,
               MemoryBytes budget)
    : config_(config),
      instance_(instance),
      backend_(std::move(backend)),
      backend_name_(backend_->name()),
      metrics_(std::make_unique<Metrics>()),
      budget_(std::make_unique<MemoryBudget>(budget)),
      leases_(std::make_unique<LeaseTable>(config.max_leases())),
      open_streams_(config.max_open_streams()),
      waiting_pulls_(config.max_waiting_pulls()) {
  RegistryLimits limits;
  limits.max_jobs = config.max_jobs();
  limits.max_tensors_per_job = config.max_tensors_per_job();
  limits.max_job_bytes = config.max_job_bytes();
  limits.max_chunk_bytes = config.max_chunk_bytes();
  transports_ = DaemonEnds::Make(*this);
  // The backend's own host memory first (cuda:N: page-locked), else a transport's of the job's
  // own, else the heap.
  JobBufferSource buffers = [this](const std::string& job, const MemoryBytes& footprint) {
    HostStagingAbility* staging = backend_->host_staging();
    BufferAllocator* backends = staging != nullptr ? staging->HostAllocator() : nullptr;
    return backends != nullptr ? Borrowed(backends) : transports_.JobBuffers(job, footprint.host);
  };
  registry_ =
      std::make_unique<JobRegistry>(backend_.get(), limits, std::move(buffers), budget_.get());
  peers_ = std::make_unique<PeerExchange>(std::chrono::milliseconds(config_.peer_timeout_ms()));
  peers_->set_round_observer(
      [metrics = metrics_.get()](const std::string& job, double seconds, bool ok) {
        metrics->PeerRound(job, seconds, ok);
      });
}

Daemon::~Daemon() { executor_.WaitIdle(); }

absl::StatusOr<SlotPlaces> Daemon::SlotsForStep(const std::string& job, int32_t rank, int64_t step,
                                                Memory memory) {
  PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<Job> found, registry_->Find(job));
  return found->SlotsForStep(rank, step, memory);
}

absl::Status Daemon::DeclareTransport(const v1::AttachRequest& request) {
  PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(request.job()));
  PARAMD_RETURN_IF_ERROR(job->CheckUsable());
  if (request.rank() < 0 || request.rank() >= job->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", request.rank(), " is outside [0, ",
                                                   job->world_size(), ") of job ",
                                                   Quoted(job->name())));
  }
  job->SetTrainerTransport(request.rank(), request.transport(), request.declare().reason());
  UpdateGauges();
  return absl::OkStatus();
}

void Daemon::Drain() {
  if (draining_.exchange(true)) return;
  PARAMD_LOG(INFO) << "draining: new work is refused from now on";
  if (drain_listener_) drain_listener_();
}

absl::Status Daemon::CheckServing() const {
  if (draining()) {
    return WithReason(absl::UnavailableError("the daemon is draining (Drain or a shutdown "
                                             "signal); no new work is accepted"),
                      v1::ERROR_REASON_DRAINING);
  }
  return absl::OkStatus();
}

std::string Daemon::advertised_address() const {
  absl::MutexLock lock(&advertised_mu_);
  return advertised_address_;
}

void Daemon::set_advertised_address(std::string address) {
  peers_->SetSelf(address);
  absl::MutexLock lock(&advertised_mu_);
  advertised_address_ = std::move(address);
}

std::vector<std::string> Daemon::backend_addresses() const {
  absl::MutexLock lock(&advertised_mu_);
  if (backend_addresses_.empty()) return {advertised_address_};
  return backend_addresses_;
}

void Daemon::set_backend_addresses(std::vector<std::string> addresses) {
  absl::MutexLock lock(&advertised_mu_);
  backend_addresses_ = std::move(addresses);
}

absl::StatusOr<v1::RegisterResponse> Daemon::Register(const v1::RegisterRequest& request) {
  // One at a time: a job being remade is not found by another rank's registration meanwhile.
  absl::MutexLock lock(&register_mu_);
  PARAMD_RETURN_IF_ERROR(CheckDaemonList(request, advertised_address()));
  // The list is compared before the rest of the description, to show both lists whole.
  if (absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(request.job()); job.ok()) {
    PARAMD_RETURN_IF_ERROR(CheckSameDaemons((*job)->registration(), request));
  }
  return RegisterLocked(request);
}

absl::StatusOr<v1::RegisterResponse> Daemon::RegisterFromManifest(
    const v1::RegisterRequest& request) {
  absl::MutexLock lock(&register_mu_);
  return RegisterLocked(request);
}

absl::StatusOr<v1::RegisterResponse> Daemon::RegisterLocked(const v1::RegisterRequest& request) {
  absl::StatusOr<v1::RegisterResponse> response = registry_->Register(request, job_peers());
  if (absl::IsFailedPrecondition(response.status())) {
    if (auto reshaped = RegisterReshaped(request)) response = *std::move(reshaped);
  }
  if (response.ok()) {
    response->set_instance(instance_);
    if (request.push_mode() == v1::PUSH_MODE_PRE_REDUCED) {
      // This daemon's part is owner i of the job's owners: one per daemon of its sorted list.
      const auto& daemons = request.daemons();
      const auto it = std::find(daemons.begin(), daemons.end(), advertised_address());
      const int index = it == daemons.end() ? 0 : static_cast<int>(it - daemons.begin());
      if (absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(request.job()); job.ok()) {
        (*job)->SetOwnerIndex(index);
      }
    }
    PARAMD_LOG(INFO) << "job " << request.job() << ": rank " << request.rank() << " of "
                     << request.world_size() << " registered (" << request.tensors_size()
                     << " tensors)";
    UpdateGauges();
  }
  return response;
}

namespace {

// Feeds `chunks` (a job's exported state) to `import`, leaving out the fields its job does not
// keep (those of serve formats it no longer has).
absl::Status ImportKeptFields(const std::vector<v1::StateChunk>& chunks,
                              const v1::RegisterRequest& spec, StateImport& import) {
  const std::vector<FormatKey> formats = ServedFormats(spec);
  std::map<std::string, std::vector<std::string>> kept;  // tensor -> its fields
  for (int i = 0; i < spec.tensors_size(); ++i) {
    for (const StateFieldSpec& f : TensorStateFields(TensorInfoOf(spec, i), formats)) {
      kept[spec.tensors(i).name()].push_back(f.name);
    }
  }
  bool skipping = false;
  for (const v1::StateChunk& chunk : chunks) {
    if (chunk.has_field()) {
      const std::vector<std::string>& fields = kept[chunk.field().tensor()];
      skipping = std::find(fields.begin(), fields.end(), chunk.field().field()) == fields.end();
    }
    if (!skipping) {
      PARAMD_RETURN_IF_ERROR(import.Add(chunk));
    } else if (chunk.has_header()) {
      v1::StateChunk header;
      *header.mutable_header() = chunk.header();
      PARAMD_RETURN_IF_ERROR(import.Add(header));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<absl::StatusOr<v1::RegisterResponse>> Daemon::RegisterReshaped(
    const v1::RegisterRequest& request) {
  absl::StatusOr<std::shared_ptr<Job>> found = registry_->Find(request.job());
  if (!found.ok() || !(*found)->reshapable()) return std::nullopt;
  const std::shared_ptr<Job> old = *std::move(found);
  const v1::RegisterRequest wanted = NormalizedSpec(request);
  v1::RegisterRequest reshaped = old->registration();
  reshaped.set_world_size(wanted.world_size());
  *reshaped.mutable_serve() = wanted.serve();
  if (!google::protobuf::util::MessageDifferencer::Equals(reshaped, wanted)) return std::nullopt;
  const std::string& name = request.job();
  // The restored state, whole (the job is idle: nothing was pushed since the restore).
  std::vector<v1::StateChunk> chunks;
  {
    absl::StatusOr<std::unique_ptr<StateExport>> exported = StateExport::BeginAndWait(
        ExportOf(old, [this, old](const StepWork& held) { StartStep(old, held); }),
        config_.max_chunk_bytes());
    if (!exported.ok()) return exported.status();
    while (true) {
      v1::StateChunk chunk;
      absl::StatusOr<bool> more = (*exported)->Next(&chunk);
      if (!more.ok()) return more.status();
      if (!*more) break;
      chunks.push_back(std::move(chunk));
    }
  }
  const v1::RegisterRequest previous = old->registration();
  // Puts `spec`'s job back with the state (the new one, or the old one where the new one fails).
  const auto remake =
      [&](const v1::RegisterRequest& spec, bool new_serve_formats,
          const v1::RegisterRequest& registration) -> absl::StatusOr<v1::RegisterResponse> {
    PARAMD_RETURN_IF_ERROR(registry_->Register(registration, job_peers()).status());
    PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Find(name));
    StateImport import(job->spec(), config_.max_chunk_bytes());
    PARAMD_RETURN_IF_ERROR(ImportKeptFields(chunks, spec, import));
    PARAMD_ASSIGN_OR_RETURN(StagedState staged, import.Finish(new_serve_formats));
    PARAMD_RETURN_IF_ERROR(job->Import(std::move(staged)).status());
    return registry_->Register(registration,
                               job_peers());  // the restored version, as the trainer needs it
  };
  (void)DeleteJob(name);
  absl::StatusOr<v1::RegisterResponse> response = remake(wanted, true, request);
  if (response.ok()) {
    PARAMD_LOG(INFO) << "job " << name << ": restored state registered again with world size "
                     << wanted.world_size() << " (was " << previous.world_size() << ") and "
                     << wanted.serve_size() << " serve formats (was " << previous.serve_size()
                     << ")";
    return response;
  }
  // The new shape does not fit (the memory budget, say): the restored job as it was, and why.
  (void)DeleteJob(name);
  // (A job's spec is its registration with the rank cleared: rank 0's.)
  if (absl::StatusOr<v1::RegisterResponse> back = remake(previous, false, previous); !back.ok()) {
    PARAMD_LOG(ERROR) << "job " << name << ": the restored state could not be put back ("
                      << back.status().message() << "); restore it from its checkpoint again";
  } else if (absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(name); job.ok()) {
    (*job)->MarkRestored();
  }
  return response.status();
}

absl::StatusOr<MemoryBytes> Daemon::DeleteJob(const std::string& name) {
  PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, registry_->Delete(name));
  const int leases = leases_->ReleaseJob(name);
  const MemoryBytes released = job->reserved();
  PARAMD_LOG(INFO) << "job " << name << ": deleted (" << leases << " leases ended, "
                   << released.host / kMiB << " MiB of host memory"
                   << (released.device > 0
                           ? absl::StrCat(", ", released.device / kMiB, " MiB of GPU memory")
                           : std::string())
                   << " back in the budget once its running step ends)";
  job.reset();
  UpdateGauges();
  return released;
}

absl::StatusOr<CountedLimit::Ticket> Daemon::OpenStream(const char* method) {
  std::optional<CountedLimit::Ticket> ticket = open_streams_.TryTake();
  if (!ticket.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        method, " refused: ", open_streams_.limit(),
        " streams are open, this daemon's max_open_streams; finish or cancel streams, or raise "
        "max_open_streams"));
  }
  return *std::move(ticket);
}

void Daemon::EndWaitingPulls() {
  for (const auto& job : registry_->Jobs()) job->StopWaiting();
}

void Daemon::FailJobsOfUnusableBackend() {
  const absl::Status health = backend_->Health();
  if (health.ok()) return;
  PARAMD_LOG(ERROR) << "backend " << backend_name_
                    << " is unusable, every job of it fails: " << health;
  const absl::Status why = WithReason(health, v1::ERROR_REASON_BACKEND_UNUSABLE);
  for (const auto& job : registry_->Jobs()) job->Fail(why);
}

void Daemon::StartStep(std::shared_ptr<Job> job, StepWork work) {
  executor_.Submit([this, job = std::move(job), work] {
    // None while an export of the job holds its steps back (its end submits the step again);
    // several when this one ran steps held back before it.
    const std::vector<StepReport> reports = job->RunOrHoldStep(work);
    for (const StepReport& report : reports) {
      if (!report.failed.ok()) {
        // The failure stays in its job, unless the backend itself broke.
        metrics_->StepFailed(job->name());
        PARAMD_LOG(ERROR) << report.failed;
        FailJobsOfUnusableBackend();
        continue;
      }
      metrics_->StepDone(job->name(), report.seconds, report.elements, report.skipped);
      metrics_->EarlySteps(job->name(), report.early_adopted, report.early_discarded,
                           report.early_late);
      if (report.skipped) {
        PARAMD_LOG(WARNING) << "job " << job->name() << ": step " << report.step
                            << " skipped: a gradient is not finite (weights re-served unchanged)";
      }
      PARAMD_LOG(DEBUG) << "job " << job->name() << ": step " << report.step << " took "
                        << report.seconds * 1e3 << " ms, clip " << report.clip;
      if (step_listener_) step_listener_(job->name(), report.step + 1);
    }
    if (!reports.empty()) UpdateGauges();
  });
}

void Daemon::UpdateGauges() {
  int64_t state = 0, served = 0, slots = 0, leases = 0;
  std::map<std::string, int> by_transport;
  for (const DaemonEnds::End& t : transports_.all()) {
    if (t.end->offered()) by_transport[t.name] = 0;
  }
  const auto jobs = registry_->Jobs();
  std::map<std::string, int64_t> versions;
  for (const auto& job : jobs) {
    const v1::JobStatus s = job->Status();
    versions[job->name()] = s.next_step();
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
  for (const DaemonEnds::End& t : transports_.all()) {
    if (std::optional<DaemonEnd::Bytes> own = t.end->own_bytes()) {
      metrics_->SetTransportBytes(t.name, own->reserved, own->used);
    }
  }
  metrics_->SetJobVersions(versions);
  int failed = 0;
  for (const auto& job : jobs) failed += job->CheckUsable().ok() ? 0 : 1;
  metrics_->SetFailedJobs(failed);
  metrics_->SetStreams(open_streams_.count(), waiting_pulls_.count());
  const MemoryBytes limit = budget_->limit();
  const MemoryBytes used = budget_->used();
  metrics_->SetMemoryBudget("host", limit.host, used.host);
  if (limit.device > 0) metrics_->SetMemoryBudget("device", limit.device, used.device);
}

v1::StatusResponse Daemon::Status(const std::string& job, bool jobs) const {
  v1::StatusResponse response;
  response.set_daemon_version(std::string(Version()));
  response.set_backend(backend_name_);
  // The table's order (DESIGN.md §6): those this daemon offers.
  for (const DaemonEnds::End& t : transports_.all()) {
    if (!t.end->offered()) continue;
    response.add_transports(t.name);
    t.end->AddStatus(&response);
  }
  response.set_draining(draining());
  const MemoryBytes limit = budget_->limit();
  const MemoryBytes used = budget_->used();
  response.set_memory_budget_bytes(limit.host);
  response.set_memory_reserved_bytes(used.host);
  response.set_device_memory_budget_bytes(limit.device);
  response.set_device_memory_reserved_bytes(used.device);
  response.set_open_streams(static_cast<int32_t>(open_streams_.count()));
  response.set_waiting_pulls(static_cast<int32_t>(waiting_pulls_.count()));
  response.set_leases(leases_->held());
  if (absl::Status health = backend_->Health(); !health.ok()) {
    response.mutable_backend_failure()->set_code(static_cast<int32_t>(health.code()));
    response.mutable_backend_failure()->set_message(std::string(health.message()));
  }
  response.set_instance(instance_);
  response.set_advertise_address(advertised_address());
  for (std::string& address : backend_addresses())
    response.add_backend_addresses(std::move(address));
  response.set_uptime_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
  for (const auto& j : registry_->Jobs()) {
    if (jobs && (job.empty() || j->name() == job)) {
      v1::JobStatus* status = response.add_jobs();
      *status = j->Status();
      status->set_leases(leases_->Held(j->name()));
      if (std::optional<v1::CheckpointProgress> progress = checkpoint_progress_.Of(j->name())) {
        *status->mutable_checkpoint_progress() = *std::move(progress);
      }
    }
  }
  return response;
}

}  // namespace paramd
