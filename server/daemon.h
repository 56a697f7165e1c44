// The daemon's core without gRPC: backend, jobs, step executor and metrics, the daemon ends of the
// transports (made from the transport table, and reached only through it), and the few rules that
// span jobs (draining). The gRPC services are thin wrappers over it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "paramd/v1/config.pb.h"
#include "paramd/v1/control.pb.h"
#include "server/backend/backend.h"
#include "server/counted_limit.h"
#include "server/lease_table.h"
#include "server/memory_budget.h"
#include "server/metrics.h"
#include "server/registry.h"
#include "server/shard/peer_exchange.h"
#include "server/state/checkpoint_progress.h"
#include "server/step_executor.h"
#include "transport/daemon_end.h"

namespace paramd {

class Daemon final : public TransportHost {
 public:
  // `config` has defaults applied and is valid.
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(const v1::DaemonConfig& config);
  // The same on a backend made by the caller (a test's fault-injecting one, say).
  static absl::StatusOr<std::unique_ptr<Daemon>> CreateWithBackend(
      const v1::DaemonConfig& config, std::unique_ptr<Backend> backend);
  ~Daemon() override;

  const v1::DaemonConfig& config() const override { return config_; }
  JobRegistry& registry() { return *registry_; }
  // The agreement of the jobs sharded over this daemon and others (the Peer service).
  PeerExchange& peers() { return *peers_; }
  // What a job sharded over several daemons needs of this one to agree with the others.
  JobPeers job_peers() { return JobPeers{peers_.get(), advertised_address()}; }
  Metrics& metrics() { return *metrics_; }
  LeaseTable& leases() { return *leases_; }
  // The checkpoints being written or restored, which Status reports per job.
  CheckpointProgress& checkpoint_progress() { return checkpoint_progress_; }
  // The daemon ends of every transport, in the table's order.
  const DaemonEnds& transports() const { return transports_; }
  // A random value drawn at start: places handed out by another start of the daemon (at the same
  // address) are told apart by it (AttachResponse.instance).
  uint64_t instance() const override { return instance_; }
  const std::string& backend_name() const override { return backend_name_; }
  bool host_memory_backend() const override { return backend_->device_memory() == nullptr; }
  // The backend's exported GPU memory; none on the cpu backend.
  std::optional<DeviceExports> device_exports(const std::string& job) const override {
    const ExportedMemoryAbility* exported = backend_->exported_memory();
    if (exported == nullptr) return std::nullopt;
    return exported->Exports(job);
  }
  absl::StatusOr<SlotPlaces> SlotsForStep(const std::string& job, int32_t rank, int64_t step,
                                          Memory memory) override;
  // Checks that the job is usable and the rank is one of it.
  absl::Status DeclareTransport(const v1::AttachRequest& request) override;
  // Makes a served version's host bytes current for a host reader
  // (HostStagingAbility::ReadyHostBytes; OK at once on a backend without host staging).
  absl::Status ReadyHostBytes(const ServedTensor& served) {
    HostStagingAbility* staging = backend_->host_staging();
    return staging != nullptr ? staging->ReadyHostBytes(served) : absl::OkStatus();
  }
  // OK while the backend can step (Backend::Health).
  absl::Status backend_health() const { return backend_->Health(); }

  // UNAVAILABLE once draining, else OK. Every RPC asks first.
  absl::Status CheckServing() const;
  // Refuses new work from now on; the first call runs the drain listener (health goes
  // NOT_SERVING).
  void Drain();
  void set_drain_listener(std::function<void()> listener) { drain_listener_ = std::move(listener); }
  // Called on the step's thread after each step a job ran (applied or skipped) with the job's name
  // and the step it collects next. Set before the daemon serves, cleared once no step runs.
  void set_step_listener(std::function<void(const std::string&, int64_t)> listener) {
    step_listener_ = std::move(listener);
  }
  bool draining() const { return draining_.load(); }

  // The address this daemon is known by in jobs' daemon lists (DaemonConfig.advertise_address,
  // its default resolved once the port is bound).
  std::string advertised_address() const;
  // The token this daemon calls other daemons with where they take tokens (PeerToken of its
  // token_file), else "".
  const std::string& peer_token() const { return peers_->token(); }
  void set_advertised_address(std::string address);
  // The addresses of every backend of this daemon's process (StatusResponse.backend_addresses):
  // this one's alone unless the server holds several.
  std::vector<std::string> backend_addresses() const;
  void set_backend_addresses(std::vector<std::string> addresses);

  // Registers a rank of a job (JobRegistry::Register). Its daemon list must name this daemon and
  // be the job's (CheckDaemonList, CheckSameDaemons). The first registration after a job was
  // restored from a checkpoint may change its world size and serve formats: the job is made again
  // with them and given the restored state (any other difference stays FAILED_PRECONDITION).
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  // Registers a job from a checkpoint's manifest (rank 0), whose daemon list is the job's as it
  // was: whether it names this daemon is for the trainers' registrations to find.
  absl::StatusOr<v1::RegisterResponse> RegisterFromManifest(const v1::RegisterRequest& request);
  // Removes a job and frees its memory (its leases end now); returns the budget it held.
  absl::StatusOr<MemoryBytes> DeleteJob(const std::string& job);
  // The budget every job's footprint is reserved from.
  const MemoryBudget& memory_budget() const { return *budget_; }
  // The same, for what is held a while besides the jobs (a checkpoint's buffer).
  MemoryBudget& mutable_memory_budget() { return *budget_; }

  // A stream's place among max_open_streams, held while it is open; RESOURCE_EXHAUSTED naming
  // the limit when none is left.
  absl::StatusOr<CountedLimit::Ticket> OpenStream(const char* method);
  // Pulls waiting for a version (max_waiting_pulls).
  CountedLimit& waiting_pulls() { return waiting_pulls_; }
  // Ends the pulls that wait for a version no step will publish (the daemon drained and its
  // steps ran): they get UNAVAILABLE, saying the daemon drains.
  void EndWaitingPulls();
  // Queues a step a commit completed; it runs after the job's earlier steps.
  void StartStep(std::shared_ptr<Job> job, StepWork work);
  // Steps queued or running.
  int pending_steps() const { return executor_.pending(); }
  // Blocks until no step is queued or running.
  void WaitForSteps() { executor_.WaitIdle(); }

  // The daemon's figures, and those of `job` (every job where empty) unless `jobs` is false.
  v1::StatusResponse Status(const std::string& job, bool jobs = true) const;
  // Refreshes the gauges that follow the jobs (memory, trainers and their transports, leases).
  void UpdateGauges();

 private:
  // Register's remake of a restored job under `request`'s world size and serve formats; nullopt
  // where the job is not such a job or `request` differs in more than those.
  std::optional<absl::StatusOr<v1::RegisterResponse>> RegisterReshaped(
      const v1::RegisterRequest& request);
  // Register's work once its daemon list is checked.
  absl::StatusOr<v1::RegisterResponse> RegisterLocked(const v1::RegisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(register_mu_);
  absl::Mutex register_mu_;  // Register, one at a time
  Daemon(const v1::DaemonConfig& config, std::unique_ptr<Backend> backend, uint64_t instance,
         MemoryBytes budget);
  // After a job's step failed: when the backend itself is unusable, every job of it fails too.
  void FailJobsOfUnusableBackend();

  const v1::DaemonConfig config_;
  const uint64_t instance_;
  mutable absl::Mutex advertised_mu_;
  std::string advertised_address_ ABSL_GUARDED_BY(advertised_mu_);
  std::vector<std::string> backend_addresses_ ABSL_GUARDED_BY(advertised_mu_);  // empty: this one
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  // The transports' ends (their memory) outlive every buffer carved from it: destroyed last.
  // Made once the members they ask for are (the constructor's body).
  DaemonEnds transports_;
  std::unique_ptr<Backend> backend_;
  std::string backend_name_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<MemoryBudget> budget_;
  // Outlives the jobs, whose sharded ones take part in its rounds until they go.
  std::unique_ptr<PeerExchange> peers_;
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<LeaseTable> leases_;
  CountedLimit open_streams_;
  CountedLimit waiting_pulls_;
  std::atomic<bool> draining_{false};
  std::function<void()> drain_listener_;
  std::function<void(const std::string&, int64_t)> step_listener_;
  CheckpointProgress checkpoint_progress_;
  StepExecutor executor_;  // last: joins its thread before the jobs and backend go away
};

}  // namespace paramd
