// One training job on this daemon: its tensors and their state, and, under the job's one lock,
// the order of its steps and exports (StepSequence: the ranks' commits, the steps taken, run and
// held), the gradient slots of its steps (SlotSets), and its served versions with the pulls
// waiting for them (ServedVersions). Plain C++ (no gRPC): the services validate, count and
// dispatch here. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/host_buffer.h"
#include "kernels/fused_step.h"
#include "paramd/v1/control.pb.h"
#include "paramd/v1/data.pb.h"
#include "server/backend/backend.h"
#include "server/job/chunk_buffer.h"
#include "server/job/served_versions.h"
#include "server/job/slot_sets.h"
#include "server/job/step_sequence.h"
#include "server/memory_budget.h"
#include "server/shard/shard_agreement.h"
#include "server/state/exported_job.h"

namespace paramd {

struct StagedState;
class PeerExchange;

// How the part of a job one daemon of several holds (DESIGN.md §7) agrees with the other parts:
// the daemon's Peer exchange and the address it advertises. Empty for a job on one daemon.
struct JobPeers {
  PeerExchange* exchange = nullptr;
  std::string self;
};

// Facts about one finished step, for metrics and logs.
struct StepReport {
  int64_t step = 0;
  double seconds = 0;
  int64_t elements = 0;
  bool skipped = false;  // a gradient was not finite: the state stayed, the version advanced
  float clip = 1.0f;     // the global-norm clip factor applied
  absl::Status failed;   // the backend failed the step: the job failed with this status
  // Tensors whose early step (RegisterRequest.early_step) this step adopted, whose early result
  // it discarded, and whose early step had not begun when the step was taken (the step stepped
  // them itself, in forward order).
  int64_t early_adopted = 0;
  int64_t early_discarded = 0;
  int64_t early_late = 0;
};

class Job {
 public:
  // `spec` is a validated registration (server/registration.h); its rank is ignored. Gradient
  // slots and served bytes come from `buffers` (memory a transport exposes to the job's trainers,
  // kept while the job lives), or from the heap where it has no room or is null.
  //
  // A job whose daemon list names several daemons is sharded over them: `part` (DaemonPart) is
  // what this daemon holds, and its steps agree with the other daemons' through `peers` (found-inf
  // and the global-norm clip before each step; a split tensor's amax for its per-tensor scales,
  // between the passes and at version 0), so each part steps as the one-daemon job would.
  Job(const v1::RegisterRequest& spec, Backend* backend,
      std::shared_ptr<BufferAllocator> buffers = nullptr,
      std::optional<v1::RegisterRequest> part = std::nullopt, JobPeers peers = {});
  ~Job();

  const std::string& name() const { return name_; }
  int world_size() const { return world_size_; }
  // PUSH_MODE_PRE_REDUCED: this daemon's part of the job is owner `index` of the job's owners, so
  // rank index mod world_size pushes it (0 until set).
  void SetOwnerIndex(int index);

  // The job's share of the daemon's memory budget (JobRegistry), given back when the job goes.
  void set_reservation(MemoryBudget::Reservation reservation) {
    reservation_ = std::move(reservation);
  }
  const MemoryBytes& reserved() const { return reservation_.bytes(); }

  // A failed or deleted job: every later call on it gets `why` (the first one given stays), its
  // waiting pulls end with it, and no step of it runs again. Status still reports it.
  void Fail(const absl::Status& why);
  // OK, or the status a failed or deleted job answers with.
  absl::Status CheckUsable() const;

  // Registers one rank. A description that differs from the job's is FAILED_PRECONDITION.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request,
                                                int64_t max_chunk_bytes);
  // The job's state was restored from a checkpoint: until a rank registers, a registration may
  // change its world size and serve formats (Daemon::Register re-creates the job with them).
  void MarkRestored();
  bool reshapable() const;

  // Stores one pushed chunk (gradient or initial weights); see data.proto for the rules.
  absl::StatusOr<ChunkBuffer::Stored> Push(const v1::PushChunk& chunk);

  // The places of a rank's gradient slots for `step` in `memory`, allocated now where missing,
  // with the bytes already received in each: in host memory, the job's host slots (a place of
  // region -1 is private memory); in device memory, slots in the backend's exported GPU memory
  // (region -1 where that memory ran out). A trainer writes a slot of region -1 in data chunks
  // instead. `step` is the step being collected, or the one after it: its slots are then set aside
  // now (none received), so a trainer learns them before its commit and its next push needs no
  // Attach first. Other steps are FAILED_PRECONDITION. A job holds at most kSlotSets slot sets
  // (server/job/job_memory.h): while two steps wait to run, the next one's slots are UNAVAILABLE
  // (retry once a step ran).
  absl::StatusOr<SlotPlaces> SlotsForStep(int32_t rank, int64_t step,
                                          Memory memory = Memory::kHost);
  bool shared_memory() const { return buffers_->shared(); }
  // Records the transport a rank uses (Status reports it).
  void SetTrainerTransport(int32_t rank, const std::string& transport, const std::string& reason);
  // The transport rank `rank` declared (empty before it did).
  std::string TrainerTransportOf(int32_t rank) const;

  // Records a rank's commit of a step; the last one returns the step's work.
  absl::StatusOr<CommitOutcome> Commit(const v1::CommitRequest& request);

  // The step executor's tick for a step taken by Commit (every taken step gets one): runs every
  // step held back up to `work`, then `work`, one step of the job at a time in step order, and
  // returns their reports. A step runs on the backend and publishes each tensor's new version as
  // soon as it is stepped, in registration order (= forward order). While an export streams (or
  // waits to start) it holds `work` back and returns none, so an export never blocks the executor;
  // the export's end hands the newest held step back to the executor (StateExport). A step whose
  // tensor's retired version is still leased waits for the lease to end (DESIGN.md §2: a step
  // never overwrites leased bytes, and a job keeps kServedVersions of each tensor). A backend
  // error fails the job (Fail) and is the report's `failed`; a job that failed runs no step.
  std::vector<StepReport> RunOrHoldStep(const StepWork& work);

  // What this daemon holds of the job: its normalized registration, or where the job is sharded
  // over several daemons this daemon's part of it (DaemonPart). Immutable.
  const v1::RegisterRequest& spec() const { return spec_; }
  // The job as its ranks registered it (normalized), whole. Equal to spec() unless sharded.
  const v1::RegisterRequest& registration() const { return registration_; }
  bool sharded() const { return peers_.exchange != nullptr; }
  // Replaces the job's state with a staged import (checked against spec() by StateImport, see
  // server/state/state_transfer.h), then re-publishes every tensor's served bytes, computed from
  // the imported master, at version staged.header.next_step. FAILED_PRECONDITION, changing nothing,
  // while the job collects pushes or commits, has a step taken or running, streams an export, or
  // receives initial weights.
  absl::StatusOr<v1::ImportStateResponse> Import(StagedState staged);

  // The newest served bytes when their version is >= min_version, else null (always null once the
  // job failed or was deleted: CheckUsable says why).
  std::shared_ptr<const ServedTensor> Served(int tensor, int64_t min_version) const;
  // Calls `wake` once (outside the job's lock) when `tensor` reaches `min_version` or the job
  // fails, unless removed first. Returns 0 when the version is already there or the job failed
  // (then `wake` is not kept).
  uint64_t AddWaiter(int tensor, int64_t min_version, std::function<void()> wake);
  // True when the waiter was removed before it fired.
  bool RemoveWaiter(uint64_t id);
  // The daemon drains and no step of the job will run: wakes every waiting pull (each finds its
  // version published or ends), and AddWaiter keeps no new one.
  void StopWaiting();

  // Waits until the job's early-step thread has run everything queued (early_step): a step
  // committed after it adopts every early step whose scalars it matches, none late. For tests and
  // benchmarks that want that regardless of the threads' timing; training never waits here.
  void AwaitEarlyIdle();

  // A tensor's registered description (immutable), by index.
  const v1::TensorSpec& Spec(int tensor) const { return spec_.tensors(tensor); }
  // Index of a tensor by name, or NOT_FOUND.
  absl::StatusOr<int> TensorIndex(const std::string& name) const;
  // INVALID_ARGUMENT when the job does not serve `format`.
  absl::Status CheckServes(const v1::ServeFormat& format) const;

  absl::StatusOr<v1::AdamwHyperparams> SetHyperparams(const v1::SetHyperparamsRequest& request);
  v1::JobStatus Status() const;
  int registered_ranks() const;

 private:
  friend class JobExport;
  friend class StepRunner;
  struct Tensor {
    v1::TensorSpec spec;
    TensorInfo info;  // shape, index and policy, for the backend
    int64_t elements = 0;
    int64_t grad_bytes = 0;
    std::unique_ptr<TensorState> state;   // null until the initial weights arrived
    std::unique_ptr<ChunkBuffer> upload;  // initial weights while they arrive
    // A split tensor's version 0, made on a thread of its own (its amax round waits for the other
    // owners, which no RPC thread may do) once its upload is complete.
    bool creating = false;
    // early_step: the second state an early step writes (EarlyStepAbility::StepEarly), made with
    // `state` (MakeShadow); the step adopts it by trading buffers with `state`.
    std::unique_ptr<TensorState> shadow;
  };
  // A tensor's early step of the step collected (RegisterRequest.early_step): queued when its
  // gradients landed, run on early_thread_, and handed to the step, which adopts its result where
  // it answers the step (StepRunner::PrepareLocked).
  struct EarlyStep {
    enum class State {
      kNone,     // none for `step`
      kQueued,   // waits in early_queue_; the set's slots are read (SlotSet::landed_running)
      kRunning,  // being computed into the tensor's shadow and `served`
      kDone,     // the shadow and `served` hold the step with `scalars`
      kFailed,   // the job failed meanwhile, or the backend failed it: the step steps the tensor
      kLate,     // the step was taken before it began: the step steps the tensor (WithdrawLocked)
    };
    State state = State::kNone;
    int64_t step = -1;
    std::vector<const void*> slots;  // the step's, in its order
    kernels::SlotType slot_type = kernels::SlotType::kFp32;
    StepScalars scalars;  // predicted when it was queued (PredictedScalarsLocked)
    // The next version's buffers, taken at landing; the step of `step` writes this tensor's
    // version into them, whether it adopts the early result or not.
    std::shared_ptr<ServedTensor> served;
  };

  absl::Status CheckRank(int32_t rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION for a step the job does not collect: stale (before the step it collects)
  // or ahead of it (after it; after the step after it where `or_next`, a trainer's lookahead).
  absl::Status CheckCollects(int64_t step, bool or_next) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<ChunkBuffer::Stored> PushLocked(const v1::PushChunk& chunk,
                                                 std::vector<std::function<void()>>* wake)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<ChunkBuffer::Stored> PushWeights(Tensor& t, const v1::PushChunk& chunk,
                                                  std::vector<std::function<void()>>* wake)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<ChunkBuffer::Stored> PushGradient(Tensor& t, const v1::PushChunk& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a gradient chunk of tensor `index` was stored (DESIGN.md §2: the check accumulated as
  // gradients land): where it completed the tensor's slots of the step collected (every rank's, or
  // the pusher's when pre-reduced, all in host memory) and the backend has a LandedCheckAbility,
  // the tensor's check is started, to run from `after` once the lock is let go (EndLandedCheck
  // records it), or for a job with early_step queued for early_thread_ with its early step. An
  // in-place range marked again (its bytes cannot be told from a retry's) makes a check started
  // before it stale.
  void NoteLandedLocked(size_t index, const v1::PushChunk& chunk, ChunkBuffer::Stored stored,
                        std::vector<std::function<void()>>* after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `t` is stepped early: the job steps early (and the backend can) and `t` is whole here
  // (a tensor split over daemons needs its owners' amax). Such a tensor has a shadow with its
  // state.
  bool StepsEarly(const Tensor& t) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !early_.empty() && t.spec.whole_rows() == 0;
  }
  // Queues tensor `index`'s early step of the step collected where the job steps early, the
  // backend can, no step of the job is taken or running (its state is then free) and a served
  // buffer of the next version is free now; `slots` are the step's, complete, in host memory.
  // While a step is taken or running (staleness: trainers push the next step meanwhile) it is
  // deferred until that step ran (QueueDeferredEarlyLocked).
  void QueueEarlyLocked(size_t index, std::vector<const void*> slots, kernels::SlotType slot_type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues tensor `index`'s early step (its record holds the step's slots) where a served buffer
  // is free now; false, leaving no early step for it, where none is.
  bool QueueRecordLocked(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A step ran: the early steps deferred meanwhile are queued, in landing order, where no step is
  // taken now (else the step collected runs next, and steps its tensors itself).
  void QueueDeferredEarlyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // early_thread_'s loop until the job goes: the queued landed checks first (a step needs every
  // tensor's, and each is a read of the gradients alone), then the early steps, the queued tensor
  // the next forward reads first first (early_queue_).
  void RunEarlySteps();
  // Step `step` was taken: its early steps not begun are withdrawn (kLate). They are the layers the
  // next forward reads last (early_queue_'s order); the step steps them in forward order and
  // publishes each, after the early results before them.
  // Returns how many were withdrawn.
  int WithdrawEarlyLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs where the early thread's time went for step `step` (--log_level=debug), `late` of its
  // early steps withdrawn, and starts the next step's account.
  void LogEarlyTimesLocked(int64_t step, int late) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The scalars a step of the step collected is expected to run with (EarlyStep::scalars).
  StepScalars PredictedScalarsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A landed check of step `step`'s tensor `index` ended: kept where nothing made it stale.
  void EndLandedCheck(int64_t step, size_t index, absl::StatusOr<TensorCheck> check);
  // The slot set of `step`: the collecting one, or a taken one; null when neither.
  SlotSet* SetOfStepLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until no landed check reads the slots of taken step `step` (none starts on a taken set).
  void AwaitLandedChecksLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives up taken step `step`'s slots (the job failed), once no landed check reads them.
  void DropSlotsLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A gradient the trainer lent in its own GPU memory (InPlaceMark.lent): mapped by the backend
  // and read there by the step.
  absl::StatusOr<ChunkBuffer::Stored> MarkLent(Tensor& t, size_t index, const v1::PushChunk& chunk,
                                               ChunkBuffer& slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<SlotPlaces> SlotPlacesLocked(int32_t rank, int64_t step, Memory memory)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The place of (tensor, rank)'s device slot in `set` (made), allocated now where missing;
  // segment -1 when the backend's exported memory has no room.
  Place DeviceSlotPlace(SlotSet& set, size_t tensor, int32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends every tensor's slot of `rank` in `set` (sized now) to `out`: its place in host or
  // device memory, its bytes, what it received (0 unless `received`) and its tensor's name.
  absl::StatusOr<SlotPlaces> PlacesOfLocked(SlotSet& set, int32_t rank, bool device, bool received,
                                            SlotPlaces out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE: the job holds kSlotSets, none for the step a push or slot place asked for.
  absl::Status SlotSetsFull() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the set that collects the step collected where it is not made yet.
  absl::Status MakeCollectingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Buffers for a tensor's next version (ServedVersions::Fresh): the retired version's once no
  // reader holds it, else new ones while the tensor has fewer than kServedVersions; null when the
  // retired version is still leased (the caller waits, or refuses).
  absl::StatusOr<std::shared_ptr<ServedTensor>> FreshServed(int tensor)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // New buffers for a version of a tensor, in every served format.
  absl::StatusOr<std::shared_ptr<ServedTensor>> NewServed(int tensor) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A buffer from `buffers_`, or from the heap when that fails (logged once); RESOURCE_EXHAUSTED
  // when the heap has none either.
  absl::StatusOr<HostBuffer> NewBuffer(int64_t bytes) const;
  // Makes a slot the size of tensor i's gradient (a no-op when it is).
  absl::Status SizeSlot(ChunkBuffer& slot, size_t i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one step that RunOrHoldStep claimed from the sequence (server/job/step_runner.h).
  StepReport StepNow(const StepWork& work);
  // UNAVAILABLE while a tensor's version 0 is being made (CreateSplitState), naming it: a push,
  // slot place or commit that needs every version 0 is retried.
  absl::Status MakingVersionZeroLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes tensor `index`'s state and version 0 from its complete upload (`whole_amax` set: the
  // amax round of a split tensor), then publishes it; a failure fails the job. Runs on
  // initial_threads_, without the job's lock.
  void CreateSplitState(int index, WholeAmax whole_amax);
  // Fails the job at `work`'s step with `why` (a step's state may be half-updated).
  StepReport FailStep(const StepWork& work, const absl::Status& why);
  // The served buffers of every tensor's next version, waiting while a retired version is leased.
  absl::Status FreshServedForStep(int64_t step, std::vector<std::shared_ptr<ServedTensor>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the job's failure (the first one stays) and wakes its waiters (into `wake`).
  void FailLocked(const absl::Status& why, std::vector<std::function<void()>>* wake)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the steps claimed from the sequence and starts the exports that waited for them.
  void EndStepsRunning();

  // Export (StateExport): starts once every step committed before it ran, then holds later steps
  // back until EndExport, which returns the newest step held meanwhile when any can run. `start`
  // gets the snapshot the export reads (or why there is none): at once when no committed step is
  // queued or running, else from the thread that finishes the last of them. It is called
  // without the job's lock, and nothing waits for it.
  using ExportSnapshot = ExportedJob::Snapshot;
  using ExportStart = ExportedJob::Start;
  void BeginExport(ExportStart start);
  std::optional<StepWork> EndExport();
  // Starts the waiting exports whose steps have run; what to call once the lock is let go.
  std::vector<std::function<void()>> StartCaughtUpExportsLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ExportSnapshot SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const int world_size_;
  const bool pre_reduced_;  // PUSH_MODE_PRE_REDUCED: one rank pushes, pusher_
  int pusher_ ABSL_GUARDED_BY(mu_) = 0;
  const v1::RegisterRequest registration_;  // what every rank must repeat (rank cleared)
  const v1::RegisterRequest spec_;          // this daemon's part of it (registration_ unsharded)
  const JobPeers peers_;                    // set where the job is sharded
  // The check and amax rounds of the job's daemons; the identity for a job on this daemon alone.
  std::unique_ptr<ShardAgreement> agreement_;
  const std::vector<FormatKey> formats_;  // served formats (ServedFormats)
  Backend* const backend_;
  // Outlives the buffers below, which return their memory to it.
  const std::shared_ptr<BufferAllocator> buffers_;
  // The job's exported GPU memory (cuda:N), where its device slots and served bytes lie; null on
  // a backend without it. Outlives the buffers below, too.
  const std::shared_ptr<ExportedMemory> device_memory_;
  MemoryBudget::Reservation reservation_;
  mutable std::atomic<bool> warned_heap_fallback_{false};
  mutable std::atomic<bool> warned_device_fallback_{false};

  mutable absl::Mutex mu_;
  std::vector<Tensor> tensors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> tensor_index_;  // immutable after construction
  std::set<int32_t> registered_ ABSL_GUARDED_BY(mu_);
  v1::AdamwHyperparams hyper_ ABSL_GUARDED_BY(mu_);
  int64_t applied_steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t initialized_tensors_ ABSL_GUARDED_BY(mu_) = 0;
  // The step collected and its commits, the steps taken and run, the exports waiting and streaming.
  StepSequence sequence_ ABSL_GUARDED_BY(mu_);
  // The gradient slots of the step collected, of the step after it, and of the steps taken.
  SlotSets slots_ ABSL_GUARDED_BY(mu_);
  // Every tensor's served versions, and the pulls waiting for one.
  ServedVersions served_ ABSL_GUARDED_BY(mu_);
  // The grad_scale of the last step taken: the scale a landed check expects the step collected
  // to run with until a rank's commit of it says (1, the default, before the first).
  double last_grad_scale_ ABSL_GUARDED_BY(mu_) = 1.0;
  double last_step_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t skipped_steps_ ABSL_GUARDED_BY(mu_) = 0;
  double last_clip_ ABSL_GUARDED_BY(mu_) = 1.0;
  std::map<int32_t, v1::TrainerTransport> trainer_transports_ ABSL_GUARDED_BY(mu_);
  // The starts of the exports waiting in sequence_.
  std::map<StepSequence::ExportId, ExportStart> export_starts_ ABSL_GUARDED_BY(mu_);
  absl::Status failed_ ABSL_GUARDED_BY(mu_);  // not OK once the job failed or was deleted
  std::vector<std::thread> initial_threads_ ABSL_GUARDED_BY(mu_);  // CreateSplitState's
  bool reshapable_ ABSL_GUARDED_BY(mu_) = false;  // MarkRestored, until a rank registers
  // early_step: each tensor's early step (empty where the job does not step early), the tensors
  // queued, the lr of the last step taken's commits (none: the job's), the tensor-steps adopted
  // and discarded, and the thread that runs them (until early_stop_).
  std::vector<EarlyStep> early_ ABSL_GUARDED_BY(mu_);
  // What early_thread_ runs: the tensors' landed checks in landing order (each ended by
  // EndLandedCheck; cancelled once the job goes), before the tensors' early steps, the queued
  // tensor the next forward reads first (the lowest index) first: backward lands the last layers
  // first, so what is still queued at the commit (late) is what the forward reads last, and the
  // forward runs the early layers while the step steps those.
  std::deque<std::function<void(bool cancelled)>> early_checks_ ABSL_GUARDED_BY(mu_);
  std::set<size_t> early_queue_ ABSL_GUARDED_BY(mu_);
  // Tensors of the step collected that landed while a step was taken or running, in landing
  // order, with the step's slots: queued once no step is (QueueDeferredEarlyLocked).
  struct DeferredEarly {
    size_t index = 0;
    int64_t step = 0;
    std::vector<const void*> slots;
    kernels::SlotType slot_type = kernels::SlotType::kFp32;
  };
  std::vector<DeferredEarly> early_deferred_ ABSL_GUARDED_BY(mu_);
  std::optional<double> last_commit_lr_ ABSL_GUARDED_BY(mu_);
  int64_t early_adopted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t early_discarded_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t early_late_ ABSL_GUARDED_BY(mu_) = 0;
  // Where the early thread's time went for the step collected, logged when it is taken
  // (--log_level=debug): from the first early step queued, the early steps' and checks' seconds
  // and the elements stepped early, and the slowest and fastest early step of a tensor of at least
  // kRatedElements (so the log tells whether every tensor ran slowly or a few held the rest).
  struct EarlyTimes {
    static constexpr int64_t kRatedElements = int64_t{1} << 20;
    struct Rated {
      std::string tensor;
      int64_t elements = 0;
      double seconds = 0;
      double rate() const { return seconds > 0 ? elements / seconds : 0; }
    };
    void Add(const std::string& tensor, int64_t tensor_elements, double tensor_seconds);
    // ", <what> <tensor> (<elements> elements, <ms> ms, <rate> G elements/s)", or "" without one.
    static std::string Text(const char* what, const std::optional<Rated>& r);

    std::optional<std::chrono::steady_clock::time_point> first_queued;
    double step_seconds = 0;
    double check_seconds = 0;
    int64_t stepped = 0;
    int64_t elements = 0;
    std::optional<Rated> slowest, fastest;
  };
  EarlyTimes early_times_ ABSL_GUARDED_BY(mu_);
  bool early_stop_ ABSL_GUARDED_BY(mu_) = false;
  bool early_busy_ ABSL_GUARDED_BY(mu_) = false;  // the early thread runs a check or a step
  std::thread early_thread_;
};

// The job as its state's export reads it (server/state/state_transfer.h's StateExport): when the
// export ends, the newest step it held back goes to `resume` (the step executor's; may be empty).
std::shared_ptr<ExportedJob> ExportOf(std::shared_ptr<Job> job,
                                      std::function<void(const StepWork&)> resume);

}  // namespace paramd
