#include "server/job/job.h"

#include <google/protobuf/util/message_differencer.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "server/job/job_memory.h"
#include "server/job/step_runner.h"
#include "server/registration.h"
#include "server/shard/peer_exchange.h"

namespace paramd {
namespace {

// Initial weights must be finite and below 2^127 in magnitude (DESIGN.md §3).
constexpr float kMaxInitialMagnitude = 1.7014118346046923e38f;  // 2^127

absl::Status CheckInitialWeights(const std::string& tensor, int64_t offset, std::string_view data) {
  const size_t n = data.size() / sizeof(float);
  for (size_t i = 0; i < n; ++i) {
    float x;
    std::memcpy(&x, data.data() + i * sizeof(float), sizeof(float));
    if (!(std::fabs(x) < kMaxInitialMagnitude)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "initial weight ", offset / 4 + static_cast<int64_t>(i), " of tensor \"", tensor,
          "\" is ", x, "; initial weights must be finite and below 2^127 in magnitude"));
    }
  }
  return absl::OkStatus();
}

// Job `job`'s exported GPU memory, null where the backend exports none.
std::shared_ptr<ExportedMemory> ExportedMemoryOf(Backend* backend, const std::string& job) {
  ExportedMemoryAbility* exported = backend->exported_memory();
  return exported != nullptr ? exported->ExportedMemoryFor(job) : nullptr;
}

}  // namespace

Job::Job(const v1::RegisterRequest& spec, Backend* backend,
         std::shared_ptr<BufferAllocator> buffers, std::optional<v1::RegisterRequest> part,
         JobPeers peers)
    : name_(spec.job()),
      world_size_(spec.world_size()),
      pre_reduced_(spec.push_mode() == v1::PUSH_MODE_PRE_REDUCED),
      registration_(NormalizedSpec(spec)),
      spec_(part.has_value() ? NormalizedSpec(*part) : registration_),
      peers_(std::move(peers)),
      formats_(ServedFormats(spec_)),
      backend_(backend),
      buffers_(buffers != nullptr ? std::move(buffers) : Borrowed(HeapAllocator())),
      device_memory_(ExportedMemoryOf(backend, spec.job())),
      sequence_(name_, world_size_),
      slots_(static_cast<size_t>(spec_.tensors_size()), world_size_),
      served_(static_cast<size_t>(spec_.tensors_size())) {
  hyper_ = spec_.hyperparams();
  tensors_.resize(static_cast<size_t>(spec_.tensors_size()));
  for (int i = 0; i < spec_.tensors_size(); ++i) {
    Tensor& t = tensors_[static_cast<size_t>(i)];
    t.spec = spec_.tensors(i);
    t.elements = t.spec.rows() * t.spec.cols();
    t.info = TensorInfoOf(spec_, i);
    t.grad_bytes = t.elements * ElementBytes(t.spec.grad_type());
    tensor_index_.emplace(t.spec.name(), i);
  }
  if (spec_.early_step() && backend_->early_step() != nullptr) {
    early_.resize(tensors_.size());
    early_thread_ = std::thread([this] { RunEarlySteps(); });
  }
  if (!sharded()) {
    agreement_ = IdentityAgreement();
    return;
  }
  // The owners of each split tensor this daemon holds rows of: its amax rounds' daemons.
  std::vector<std::vector<int>> amax_among(tensors_.size());
  const absl::StatusOr<ShardMap> map = JobShardMap(registration_, peers_.self, kCpuDevice);
  PARAMD_CHECK(map.ok()) << map.status();  // DaemonPart computed the same map
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const v1::TensorSpec& t = spec_.tensors(static_cast<int>(i));
    if (t.whole_rows() == 0) continue;
    for (const ShardPiece& piece : map->tensors[static_cast<size_t>(t.job_index())]) {
      amax_among[i].push_back(piece.owner);  // owner i is daemon i of the sorted list
    }
    std::sort(amax_among[i].begin(), amax_among[i].end());
  }
  agreement_ = PeerAgreement(name_, spec_, std::move(amax_among), peers_.exchange);
}

Job::~Job() {
  std::vector<std::thread> threads;
  bool open = false;  // still in the Peer exchange: a job that failed (or was deleted) left it
  {
    absl::MutexLock lock(&mu_);
    threads.swap(initial_threads_);
    open = failed_.ok();
    early_stop_ = true;
  }
  // Ends once the early steps queued have ended (none runs from now on).
  if (early_thread_.joinable()) early_thread_.join();
  // A round still waiting ends now.
  if (sharded() && open && !threads.empty()) {
    peers_.exchange->CloseJob(name_, absl::CancelledError("the daemon stopped"));
  }
  for (std::thread& t : threads) t.join();
}

void Job::CreateSplitState(int index, WholeAmax whole_amax) {
  Tensor* t = nullptr;
  absl::StatusOr<std::shared_ptr<ServedTensor>> served;
  {
    absl::MutexLock lock(&mu_);
    t = &tensors_[static_cast<size_t>(index)];
    served = FreshServed(index);
  }
  // The upload stays complete and unchanged while `creating` is set: no lock is needed to read it.
  absl::StatusOr<std::unique_ptr<TensorState>> state = absl::UnknownError("not made");
  if (!served.ok()) {
    state = served.status();
  } else {
    (*served)->version = 0;
    state = backend_->CreateState(
        t->info,
        std::span<const float>(reinterpret_cast<const float*>(t->upload->data()),
                               static_cast<size_t>(t->elements)),
        served->get(), whole_amax);
  }
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    if (!state.ok()) {
      FailLocked(absl::Status(state.status().code(),
                              absl::StrCat("job ", Quoted(name_), ": version 0 of tensor ",
                                           Quoted(t->spec.name()), ": ", state.status().message())),
                 &wake);
    } else {
      t->state = std::move(*state);
      ++initialized_tensors_;
      served_.Publish(index, *std::move(served), &wake);
    }
  }
  for (auto& w : wake) w();
}

absl::StatusOr<v1::RegisterResponse> Job::Register(const v1::RegisterRequest& request,
                                                   int64_t max_chunk_bytes) {
  const v1::RegisterRequest normalized = NormalizedSpec(request);
  google::protobuf::util::MessageDifferencer differ;
  std::string diff;
  differ.ReportDifferencesToString(&diff);
  if (!differ.Compare(registration_, normalized)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", name_,
                     "\" is already registered with a different description; "
                     "every rank must register the same job (differences, registered -> this "
                     "request): ",
                     diff));
  }
  absl::MutexLock lock(&mu_);
  PARAMD_RETURN_IF_ERROR(failed_);
  registered_.insert(request.rank());
  reshapable_ = false;  // a rank took the restored job as it is
  v1::RegisterResponse response;
  response.set_next_step(sequence_.next_step());
  // The version every tensor has published: a step taken but still running has not published yet.
  response.set_version(served_.published());
  response.set_max_chunk_bytes(max_chunk_bytes);
  return response;
}

void Job::SetOwnerIndex(int index) {
  absl::MutexLock lock(&mu_);
  pusher_ = index % world_size_;
}

void Job::MarkRestored() {
  absl::MutexLock lock(&mu_);
  reshapable_ = true;
}

bool Job::reshapable() const {
  absl::MutexLock lock(&mu_);
  return reshapable_ && failed_.ok();
}

absl::StatusOr<int> Job::TensorIndex(const std::string& name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) {
    return absl::NotFoundError(
        absl::StrCat("job ", Quoted(name_), " has no tensor ", Quoted(name)));
  }
  return it->second;
}

absl::Status Job::CheckServes(const v1::ServeFormat& format) const {
  if (!v1::Recipe_IsValid(format.recipe()) || !v1::Direction_IsValid(format.direction())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format recipe ", format.recipe(), " direction ", format.direction(),
        " is not a Recipe and a Direction of paramd.v1 (RECIPE_FP32 ..., DIRECTION_ROWWISE ...)"));
  }
  const FormatKey key = FormatKeyOf(format);
  for (const FormatKey& f : formats_) {
    if (f == key) return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (const FormatKey& f : formats_) names.push_back(FormatName(f));
  return absl::InvalidArgumentError(
      absl::StrCat("job \"", name_, "\" does not serve ", FormatName(key), "; it serves ",
                   absl::StrJoin(names, ", "), " (formats are chosen at Register)"));
}

absl::Status Job::CheckRank(int32_t rank) const {
  if (rank < 0 || rank >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside [0, ", world_size_, ") of job \"", name_, "\""));
  }
  if (!registered_.contains(rank)) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " has not registered job \"",
                                                      name_, "\"; call Register first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChunkBuffer::Stored> Job::Push(const v1::PushChunk& chunk) {
  std::vector<std::function<void()>> wake;
  absl::StatusOr<ChunkBuffer::Stored> stored;
  {
    absl::MutexLock lock(&mu_);
    stored = PushLocked(chunk, &wake);
  }
  for (auto& w : wake) w();
  return stored;
}

absl::StatusOr<ChunkBuffer::Stored> Job::PushLocked(const v1::PushChunk& chunk,
                                                    std::vector<std::function<void()>>* wake) {
  PARAMD_RETURN_IF_ERROR(failed_);
  if (!v1::PushKind_IsValid(chunk.kind())) {
    return absl::InvalidArgumentError(
        absl::StrCat("push kind ", chunk.kind(),
                     " is not a PushKind (PUSH_KIND_GRADIENT or PUSH_KIND_INITIAL_WEIGHTS)"));
  }
  absl::StatusOr<int> index = TensorIndex(chunk.tensor());
  if (!index.ok()) return index.status();
  if (absl::Status s = CheckRank(chunk.rank()); !s.ok()) return s;
  Tensor& t = tensors_[static_cast<size_t>(*index)];
  const bool weights = chunk.kind() == v1::PUSH_KIND_INITIAL_WEIGHTS;
  const int64_t total = weights ? t.elements * 4 : t.grad_bytes;
  const int64_t element = weights ? 4 : ElementBytes(t.spec.grad_type());
  const bool in_place = chunk.has_in_place();
  if (in_place && (weights || chunk.in_place().bytes() <= 0 ||
                   chunk.in_place().memory() == v1::PLACE_MEMORY_UNSPECIFIED)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "in-place mark of ", chunk.in_place().bytes(), " bytes in ",
        v1::PlaceMemory_Name(chunk.in_place().memory()), " for tensor \"", t.spec.name(),
        "\": a mark names > 0 gradient bytes written in PLACE_MEMORY_HOST or PLACE_MEMORY_DEVICE "
        "(initial weights travel in data chunks)"));
  }
  const int64_t length =
      in_place ? chunk.in_place().bytes() : static_cast<int64_t>(chunk.data().size());
  if (length == 0 || chunk.offset() < 0 || chunk.offset() % element != 0 || length % element != 0 ||
      chunk.offset() > total - length) {
    // A client's offset can be anything: its end, only printed here, saturates (no overflow).
    int64_t end;
    if (__builtin_add_overflow(chunk.offset(), length, &end)) {
      end = std::numeric_limits<int64_t>::max();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk [", chunk.offset(), ", ", end, ") does not fit tensor \"", t.spec.name(), "\" of ",
        total, " bytes (", t.spec.rows(), "x", t.spec.cols(), " ",
        weights ? "fp32 weights" : v1::ElementType_Name(t.spec.grad_type()),
        "); offsets and sizes must be multiples of ", element, " bytes inside the tensor"));
  }
  if (weights) return PushWeights(t, chunk, wake);
  absl::StatusOr<ChunkBuffer::Stored> stored = PushGradient(t, chunk);
  if (stored.ok()) NoteLandedLocked(static_cast<size_t>(*index), chunk, *stored, wake);
  return stored;
}

void Job::NoteLandedLocked(size_t index, const v1::PushChunk& chunk, ChunkBuffer::Stored stored,
                           std::vector<std::function<void()>>* after) {
  SlotSet& set = slots_.collecting();
  LandedCheck& landed = set.landed[index];
  if (stored == ChunkBuffer::Stored::kDuplicate) {
    // A data chunk acknowledged again has the stored bytes (ChunkBuffer compared them); an
    // in-place range marked again may have been written anew before the mark.
    if (chunk.has_in_place() && landed.state != LandedCheck::State::kNone) {
      landed.state = LandedCheck::State::kStale;
    }
    return;
  }
  LandedCheckAbility* ability = backend_->landed_check();
  if (ability == nullptr || landed.state != LandedCheck::State::kNone) return;
  // Most chunks leave their own slot incomplete: nothing more to look at.
  if (!set[index][static_cast<size_t>(chunk.rank())].complete()) return;
  const Tensor& t = tensors_[index];
  // The step's slots of the tensor, in the step's order (StepRunner::PrepareLocked): complete,
  // and in host memory.
  const size_t first = pre_reduced_ ? static_cast<size_t>(pusher_) : 0;
  const size_t count = pre_reduced_ ? 1 : set[index].size();
  std::vector<const void*> slots;
  for (size_t r = first; r < first + count; ++r) {
    const ChunkBuffer& slot = set[index][r];
    if (!slot.holds_memory() || slot.size() != t.grad_bytes || !slot.complete()) return;
    const DeviceSlot* device = set.FindDevice(index, static_cast<int32_t>(r));
    if (device != nullptr && device->written) return;  // the step reads it in GPU memory
    slots.push_back(slot.data());
  }
  // The scale the step will run with: a rank's commit says it; before any, the last step's.
  const std::map<int32_t, RankCommit>& commits = sequence_.commits();
  const float grad_scale =
      static_cast<float>(commits.empty() ? last_grad_scale_ : commits.begin()->second.grad_scale);
  const bool norms = spec_.max_grad_norm() > 0;
  const kernels::SlotType slot_type = t.spec.grad_type() == v1::ELEMENT_TYPE_BF16
                                          ? kernels::SlotType::kBf16
                                          : kernels::SlotType::kFp32;
  landed.state = LandedCheck::State::kRunning;
  ++set.landed_running;
  // The slots stay: the set is neither cleared nor dropped while the check runs.
  auto check = [this, ability, index, step = sequence_.next_step(), info = t.info, slots, slot_type,
                grad_scale, norms](bool cancelled) {
    EndLandedCheck(step, index,
                   cancelled ? absl::StatusOr<TensorCheck>(absl::CancelledError("the job goes"))
                             : ability->CheckLanded(info, slots, slot_type, grad_scale, norms));
  };
  if (early_.empty()) {
    after->push_back([check = std::move(check)] { check(/*cancelled=*/false); });
    return;
  }
  // A job that steps early checks on its early-step thread too, the checks ahead of the early
  // steps: the thread that delivered the chunk only queues them.
  early_checks_.push_back(std::move(check));
  QueueEarlyLocked(index, std::move(slots), slot_type);
}

void Job::QueueEarlyLocked(size_t index, std::vector<const void*> slots,
                           kernels::SlotType slot_type) {
  if (!StepsEarly(tensors_[index])) return;
  const int64_t step = sequence_.next_step();
  if (slots_.any_taken()) {
    // A step taken or running reads and writes the state (in staleness mode trainers push the
    // next step meanwhile), and its tensors' records are its own: once it ran.
    early_deferred_.push_back(DeferredEarly{index, step, std::move(slots), slot_type});
    return;
  }
  EarlyStep& early = early_[index];
  // No step is taken: every record of an earlier step that ran was handed to it. One left is of a
  // step that never ran (the job failed): let go.
  if (early.step != step) early = EarlyStep{};
  if (early.state != EarlyStep::State::kNone) return;
  early.step = step;
  early.slots = std::move(slots);
  early.slot_type = slot_type;
  if (!QueueRecordLocked(index)) early = EarlyStep{};
}

bool Job::QueueRecordLocked(size_t index) {
  EarlyStep& early = early_[index];
  if (early.served == nullptr) {
    // The next version's buffers, only where one is free now: a landing never waits for readers.
    absl::StatusOr<std::shared_ptr<ServedTensor>> served = FreshServed(static_cast<int>(index));
    if (!served.ok() || *served == nullptr) return false;
    early.served = *std::move(served);
  }
  // Predicted now, as the landed check's scale is: what the job knows when its state is free and
  // the gradients landed.
  early.scalars = PredictedScalarsLocked();
  early.state = EarlyStep::State::kQueued;
  if (!early_times_.first_queued) early_times_.first_queued = std::chrono::steady_clock::now();
  // The set's slots stay (neither cleared nor dropped) until it ran: a step waits for it.
  ++slots_.collecting().landed_running;
  early_queue_.insert(index);
  return true;
}

int Job::WithdrawEarlyLocked(int64_t step) {
  SlotSet& set = slots_.Taken(step);
  const size_t queued = early_queue_.size();
  std::erase_if(early_queue_, [this, step, &set](size_t index) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    // mu_ held
    EarlyStep& early = early_[index];
    if (early.step != step || early.state != EarlyStep::State::kQueued) return false;
    // Its served buffers stay with the record: the step writes this tensor's version into them.
    early.state = EarlyStep::State::kLate;
    --set.landed_running;
    return true;
  });
  return static_cast<int>(queued - early_queue_.size());
}

void Job::EarlyTimes::Add(const std::string& tensor, int64_t tensor_elements,
                          double tensor_seconds) {
  step_seconds += tensor_seconds;
  ++stepped;
  elements += tensor_elements;
  if (tensor_elements < kRatedElements) return;
  const Rated rated{tensor, tensor_elements, tensor_seconds};
  if (!slowest || rated.rate() < slowest->rate()) slowest = rated;
  if (!fastest || rated.rate() > fastest->rate()) fastest = rated;
}

std::string Job::EarlyTimes::Text(const char* what, const std::optional<Rated>& r) {
  if (!r) return "";
  return absl::StrCat(", ", what, " ", Quoted(r->tensor), " (", r->elements, " elements, ",
                      r->seconds * 1e3, " ms, ", r->rate() * 1e-9, " G elements/s)");
}

void Job::LogEarlyTimesLocked(int64_t step, int late) {
  if (early_times_.first_queued) {
    const EarlyTimes& t = early_times_;
    const double window =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - *t.first_queued).count();
    PARAMD_LOG(DEBUG) << "job " << name_ << " step " << step << " taken " << window * 1e3
                      << " ms after its first early step was queued: " << t.stepped
                      << " early steps ran (" << t.elements << " elements, " << t.step_seconds * 1e3
                      << " ms, " << EarlyTimes::Rated{{}, t.elements, t.step_seconds}.rate() * 1e-9
                      << " G elements/s), checks " << t.check_seconds * 1e3 << " ms, " << late
                      << " late" << EarlyTimes::Text("slowest", t.slowest)
                      << EarlyTimes::Text("fastest", t.fastest);
  }
  early_times_ = EarlyTimes{};
}

void Job::AwaitEarlyIdle() {
  absl::MutexLock lock(&mu_);
  const auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ held
    return early_checks_.empty() && early_queue_.empty() && !early_busy_;
  };
  mu_.Await(absl::Condition(&idle));
}

void Job::QueueDeferredEarlyLocked() {
  if (early_deferred_.empty() || slots_.any_taken()) return;
  const int64_t step = sequence_.next_step();
  for (DeferredEarly& deferred : early_deferred_) {
    // Of the step collected (a later step's never waits here: its step came first).
    if (deferred.step != step) continue;
    EarlyStep& early = early_[deferred.index];
    if (early.step != step) early = EarlyStep{};
    if (early.state != EarlyStep::State::kNone) continue;
    early.step = step;
    early.slots = std::move(deferred.slots);
    early.slot_type = deferred.slot_type;
    if (!QueueRecordLocked(deferred.index)) early = EarlyStep{};
  }
  early_deferred_.clear();
}

StepScalars Job::PredictedScalarsLocked() const {
  // A rank's commit of the step says its lr and grad_scale; before any, the last step's.
  const std::map<int32_t, RankCommit>& commits = sequence_.commits();
  const std::optional<double> lr = commits.empty() ? last_commit_lr_ : commits.begin()->second.lr;
  const double grad_scale = commits.empty() ? last_grad_scale_ : commits.begin()->second.grad_scale;
  return StepScalarsOf(hyper_, lr.value_or(hyper_.lr()), hyper_.weight_decay(), applied_steps_ + 1,
                       grad_scale, spec_.seed());
}

void Job::RunEarlySteps() {
  EarlyStepAbility* ability = backend_->early_step();
  mu_.Lock();
  for (;;) {
    const auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ held
      return early_stop_ || !early_checks_.empty() || !early_queue_.empty();
    };
    mu_.Await(absl::Condition(&ready));
    if (!early_checks_.empty()) {
      // A landed check (EndLandedCheck records it, under the lock).
      std::function<void(bool)> check = std::move(early_checks_.front());
      early_checks_.pop_front();
      const bool cancelled = early_stop_;
      early_busy_ = true;
      mu_.Unlock();
      const auto started = std::chrono::steady_clock::now();
      check(cancelled);
      const auto ended = std::chrono::steady_clock::now();
      mu_.Lock();
      early_busy_ = false;
      early_times_.check_seconds += std::chrono::duration<double>(ended - started).count();
      continue;
    }
    if (early_queue_.empty()) break;  // the job goes
    // Of the tensors queued, the first the next forward reads.
    const size_t index = *early_queue_.begin();
    early_queue_.erase(early_queue_.begin());
    EarlyStep& early = early_[index];
    absl::Status status = failed_;
    if (status.ok() && early_stop_) status = absl::CancelledError("the job goes");
    if (status.ok()) {
      early.state = EarlyStep::State::kRunning;
      TensorStep step;
      step.slots = early.slots;
      step.slot_type = early.slot_type;
      step.out = early.served.get();
      const StepScalars scalars = early.scalars;
      Tensor& t = tensors_[index];
      // The tensor's state, shadow and buffers are this early step's alone while it runs: no step
      // of the job was taken when it was queued, and the step of `early.step` waits for it.
      const TensorState& from = *t.state;
      PARAMD_CHECK(t.shadow != nullptr) << "job " << name_ << ": tensor " << Quoted(t.spec.name())
                                        << " has a state but no shadow";
      TensorState& into = *t.shadow;
      early_busy_ = true;
      mu_.Unlock();
      const auto started = std::chrono::steady_clock::now();
      status = ability->StepEarly(from, into, step, scalars);
      const auto ended = std::chrono::steady_clock::now();
      mu_.Lock();
      early_busy_ = false;
      early_times_.Add(t.spec.name(), t.elements,
                       std::chrono::duration<double>(ended - started).count());
      if (!status.ok()) {
        PARAMD_LOG(WARNING) << "job " << name_ << ": the early step of tensor "
                            << Quoted(t.spec.name()) << " failed (the step steps it): " << status;
      }
    }
    early.state = status.ok() ? EarlyStep::State::kDone : EarlyStep::State::kFailed;
    SlotSet* set = SetOfStepLocked(early.step);
    PARAMD_CHECK(set != nullptr) << "job " << name_ << ": the slots of step " << early.step
                                 << " went while an early step read them";
    --set->landed_running;
  }
  mu_.Unlock();
}

void Job::EndLandedCheck(int64_t step, size_t index, absl::StatusOr<TensorCheck> check) {
  absl::MutexLock lock(&mu_);
  SlotSet* set = SetOfStepLocked(step);
  PARAMD_CHECK(set != nullptr) << "job " << name_ << ": the slots of step " << step
                               << " went while a landed check read them";
  --set->landed_running;
  LandedCheck& landed = set->landed[index];
  if (landed.state != LandedCheck::State::kRunning) return;  // stale: the step checks itself
  if (!check.ok()) {
    // The step's own check meets the same failure, and fails the step with it.
    landed.state = LandedCheck::State::kStale;
    return;
  }
  landed.check = *std::move(check);
  landed.state = LandedCheck::State::kDone;
}

SlotSet* Job::SetOfStepLocked(int64_t step) {
  if (step == sequence_.next_step() && slots_.collecting().made()) return &slots_.collecting();
  return slots_.IsTaken(step) ? &slots_.Taken(step) : nullptr;
}

void Job::AwaitLandedChecksLocked(int64_t step) {
  const auto idle = [this, step]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ held
    return !slots_.IsTaken(step) || slots_.Taken(step).landed_running == 0;
  };
  mu_.Await(absl::Condition(&idle));
}

void Job::DropSlotsLocked(int64_t step) {
  AwaitLandedChecksLocked(step);
  slots_.Drop(step);
}

absl::StatusOr<ChunkBuffer::Stored> Job::PushWeights(Tensor& t, const v1::PushChunk& chunk,
                                                     std::vector<std::function<void()>>* wake) {
  const int index = static_cast<int>(&t - tensors_.data());
  if (chunk.rank() != 0 || chunk.step() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial weights come from rank 0 at step 0; got rank ", chunk.rank(),
                     " step ", chunk.step()));
  }
  if (t.state != nullptr) {
    // Identical bytes before the first step are a retry of the upload: compared with the bytes as
    // uploaded, not with the served FP32 (the master, which a narrower master type rounds).
    // Anything else would overwrite the state.
    if (t.upload != nullptr && sequence_.next_step() == 0 &&
        std::memcmp(t.upload->data() + chunk.offset(), chunk.data().data(), chunk.data().size()) ==
            0) {
      return ChunkBuffer::Stored::kDuplicate;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "initial weights of tensor \"", t.spec.name(),
        "\" were already uploaded (published version ", served_.newest(index)->version,
        "); the daemon keeps its state, restart the job under a new name to reset it"));
  }
  if (absl::Status s = CheckInitialWeights(t.spec.name(), chunk.offset(), chunk.data()); !s.ok()) {
    return s;
  }
  if (t.upload == nullptr) {
    // Arrives in data chunks: no transport reads it in place.
    absl::StatusOr<HostBuffer> buffer = HeapAllocator()->Allocate(t.elements * 4);
    if (!buffer.ok()) return buffer.status();
    t.upload = std::make_unique<ChunkBuffer>();
    t.upload->Reset(*std::move(buffer));
  }
  if (t.creating) {
    // Its version 0 is being made: the same bytes again are a retry.
    if (std::memcmp(t.upload->data() + chunk.offset(), chunk.data().data(), chunk.data().size()) ==
        0) {
      return ChunkBuffer::Stored::kDuplicate;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "initial weights of tensor \"", t.spec.name(),
        "\" were already uploaded; the daemon keeps its state, restart the job under a new name "
        "to reset it"));
  }
  absl::StatusOr<ChunkBuffer::Stored> stored = t.upload->Store(chunk.offset(), chunk.data());
  if (!stored.ok() || !t.upload->complete()) return stored;
  if (WholeAmax whole_amax =
          agreement_->WholeAmaxOf(static_cast<size_t>(index), 0, "initial-amax")) {
    // A split tensor's version 0 waits for its other owners' amax: not on this RPC's thread.
    t.creating = true;
    initial_threads_.emplace_back(
        [this, index, whole_amax = std::move(whole_amax)] { CreateSplitState(index, whole_amax); });
    return stored;
  }

  PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<ServedTensor> served, FreshServed(index));
  served->version = 0;
  absl::StatusOr<std::unique_ptr<TensorState>> state =
      backend_->CreateState(t.info,
                            std::span<const float>(reinterpret_cast<const float*>(t.upload->data()),
                                                   static_cast<size_t>(t.elements)),
                            served.get(), /*whole_amax=*/nullptr);
  if (!state.ok()) return state.status();
  if (StepsEarly(t)) {
    // The early steps' second state, made with the tensor's (EarlyStepAbility::MakeShadow).
    PARAMD_ASSIGN_OR_RETURN(t.shadow, backend_->early_step()->MakeShadow(**state));
  }
  t.state = std::move(*state);  // the upload stays until the first step, for retries
  ++initialized_tensors_;
  served_.Publish(index, std::move(served), wake);
  return stored;
}

namespace {

// UNAVAILABLE while `t`'s version 0 is being made (Job::CreateSplitState), else OK.
absl::Status MakingVersionZero(const v1::TensorSpec& spec, bool creating, bool made) {
  if (!creating || made) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "tensor \"", spec.name(),
      "\" is making version 0 from its initial weights with the job's other daemons; call again "
      "once it is published (a pull of version 0 waits for it)"));
}

}  // namespace

absl::Status Job::MakingVersionZeroLocked() const {
  for (const Tensor& t : tensors_) {
    PARAMD_RETURN_IF_ERROR(MakingVersionZero(t.spec, t.creating, t.state != nullptr));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChunkBuffer::Stored> Job::PushGradient(Tensor& t, const v1::PushChunk& chunk) {
  PARAMD_RETURN_IF_ERROR(MakingVersionZero(t.spec, t.creating, t.state != nullptr));
  if (t.state == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor \"", t.spec.name(),
        "\" has no initial weights yet; rank 0 uploads them (PUSH_KIND_INITIAL_WEIGHTS) first"));
  }
  if (pre_reduced_ && chunk.rank() != pusher_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", Quoted(name_), " takes pre-reduced gradients (PUSH_MODE_PRE_REDUCED): rank ",
        pusher_, " pushes this daemon's part, reduced over the ranks; rank ", chunk.rank(),
        " pushes nothing here and only commits"));
  }
  PARAMD_RETURN_IF_ERROR(CheckCollects(chunk.step(), /*or_next=*/false));
  const bool committed = sequence_.committed(chunk.rank());
  const size_t index = static_cast<size_t>(&t - tensors_.data());
  PARAMD_RETURN_IF_ERROR(MakeCollectingLocked());
  ChunkBuffer& slot = slots_.collecting()[index][static_cast<size_t>(chunk.rank())];
  DeviceSlot* device = slots_.collecting().FindDevice(index, chunk.rank());
  // Marks were checked by Push: bytes > 0, a known memory.
  const bool marked = chunk.has_in_place();
  const int64_t marked_bytes = chunk.in_place().bytes();
  if (marked && chunk.in_place().has_lent()) return MarkLent(t, index, chunk, slot);
  if (device != nullptr && device->lent_this_step) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor \"", t.spec.name(), "\" of step ", chunk.step(),
                     " was lent in the trainer's GPU memory; a gradient is pushed one way"));
  }
  if (marked && chunk.in_place().memory() == v1::PLACE_MEMORY_DEVICE && !committed) {
    // A slot's bytes lie wholly in host memory or wholly in GPU memory: the step reads one.
    if (device == nullptr || device->bytes.size() != t.grad_bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "an in-place device push of tensor \"", t.spec.name(),
          "\" names a GPU slot the daemon did not hand out; ask Attach for the step's slot places "
          "in GPU memory first, or push its bytes in data chunks"));
    }
    PARAMD_RETURN_IF_ERROR(SizeSlot(slot, index));
    if (slot.received() > 0 && !device->written) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor \"", t.spec.name(), "\" has ", slot.received(), " bytes of step ",
                       chunk.step(), " pushed in data chunks; finish it in data chunks"));
    }
    absl::StatusOr<ChunkBuffer::Stored> stored = slot.MarkWritten(chunk.offset(), marked_bytes);
    if (stored.ok()) device->written = true;
    return stored;
  }
  if (device != nullptr && device->written && !committed && !marked) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor \"", t.spec.name(), "\" has ", slot.received(), " bytes of step ",
                     chunk.step(), " written in GPU memory; finish it in place"));
  }
  if (committed) {
    // The rank's slots are complete, so a chunk is either an identical re-send (a retry, or a
    // restarted trainer pushing again: acknowledged) or a change to committed gradients.
    absl::StatusOr<ChunkBuffer::Stored> stored =
        marked ? slot.MarkWritten(chunk.offset(), marked_bytes)
               : slot.Store(chunk.offset(), chunk.data());
    if (stored.ok()) {
      PARAMD_CHECK(*stored == ChunkBuffer::Stored::kDuplicate);
      return stored;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", chunk.rank(), " already committed step ", chunk.step(),
                     "; its gradients are final: ", stored.status().message()));
  }
  if (marked) {
    // Checked before the slot is sized: a slot Attach did not place has no place yet, and a mark
    // for it is refused without allocating one.
    if (slot.place() == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("an in-place push of tensor \"", t.spec.name(),
                       "\" names a slot that is not in shared memory; push its bytes in data "
                       "chunks, or ask Attach "
                       "for the step's slot places first"));
    }
    return slot.MarkWritten(chunk.offset(), marked_bytes);
  }
  PARAMD_RETURN_IF_ERROR(SizeSlot(slot, index));
  return slot.Store(chunk.offset(), chunk.data());
}

absl::StatusOr<ChunkBuffer::Stored> Job::MarkLent(Tensor& t, size_t index,
                                                  const v1::PushChunk& chunk, ChunkBuffer& slot) {
  const v1::InPlaceMark& mark = chunk.in_place();
  if (mark.memory() != v1::PLACE_MEMORY_DEVICE || chunk.offset() != 0 ||
      mark.bytes() != t.grad_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a lent gradient is marked whole, in PLACE_MEMORY_DEVICE: offset 0 and ", t.grad_bytes,
        " bytes for tensor \"", t.spec.name(), "\"; got offset ", chunk.offset(), ", ",
        mark.bytes(), " bytes in ", v1::PlaceMemory_Name(mark.memory())));
  }
  // Where the bytes lie: the same memory lent again is a retry.
  const std::string from =
      mark.lent().pid() == 0 || mark.lent().ipc_handle().empty()
          ? absl::StrCat("address ", mark.lent().address(), " of process ", mark.lent().pid())
          : absl::StrCat(mark.lent().ipc_handle(), "+", mark.lent().offset());
  DeviceSlot& device = slots_.collecting().Device(index, chunk.rank());
  if (slot.received() > 0) {
    if (device.lent_this_step && device.lent_from == from) return ChunkBuffer::Stored::kDuplicate;
    return absl::FailedPreconditionError(
        absl::StrCat("tensor \"", t.spec.name(), "\" already has ", slot.received(),
                     " bytes of step ", chunk.step(), " from rank ", chunk.rank(),
                     device.lent_this_step ? " lent in other GPU memory" : " pushed another way",
                     "; pushes are idempotent only for identical bytes"));
  }
  ExportedMemoryAbility* exported = backend_->exported_memory();
  if (exported == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend ", backend_->name(), " reads no trainer's GPU memory; push the gradient's bytes"));
  }
  absl::StatusOr<std::shared_ptr<const void>> lent = exported->MapLent(mark.lent(), t.grad_bytes);
  if (!lent.ok()) return lent.status();
  absl::StatusOr<const void*> ready = exported->LentReadyEvent(mark.lent());
  if (!ready.ok()) return ready.status();
  if (slot.holds_memory() || slot.size() != t.grad_bytes) slot.ResetCounting(t.grad_bytes);
  absl::StatusOr<ChunkBuffer::Stored> stored = slot.MarkWritten(0, t.grad_bytes);
  if (!stored.ok()) return stored;
  device.lent = *std::move(lent);
  device.lent_from = from;
  device.lent_this_step = true;
  device.ready = *ready;
  device.written = true;
  return stored;
}

absl::StatusOr<CommitOutcome> Job::Commit(const v1::CommitRequest& request) {
  if (request.has_lr() && !(std::isfinite(request.lr()) && request.lr() > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr = ", request.lr(), " must be finite and > 0"));
  }
  if (request.has_grad_scale() &&
      !(std::isfinite(request.grad_scale()) && request.grad_scale() > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_scale = ", request.grad_scale(), " must be finite and > 0"));
  }
  RankCommit mine;
  if (request.has_lr()) mine.lr = request.lr();
  mine.grad_scale = request.has_grad_scale() ? request.grad_scale() : 1.0;

  absl::MutexLock lock(&mu_);
  PARAMD_RETURN_IF_ERROR(failed_);
  const int32_t rank = request.rank();
  if (absl::Status s = CheckRank(rank); !s.ok()) return s;
  PARAMD_ASSIGN_OR_RETURN(const StepSequence::CommitKind kind,
                          sequence_.CheckCommitStep(rank, request.step()));
  if (kind == StepSequence::CommitKind::kRetry) {
    return CommitOutcome{world_size_, false, std::nullopt};  // a retry of a commit that landed
  }
  if (initialized_tensors_ != static_cast<int64_t>(tensors_.size())) {
    PARAMD_RETURN_IF_ERROR(MakingVersionZeroLocked());
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", name_, "\" has initial weights for ", initialized_tensors_, " of ",
        tensors_.size(), " tensors; rank 0 uploads all of them before the first commit"));
  }
  const SlotSet& collecting = slots_.collecting();
  // Pre-reduced: the other ranks push nothing, and their commits only count.
  for (size_t i = 0; i < tensors_.size() && !(pre_reduced_ && rank != pusher_); ++i) {
    const ChunkBuffer* slot =
        collecting.made() ? &collecting[i][static_cast<size_t>(rank)] : nullptr;
    const int64_t received =
        slot != nullptr && slot->size() == tensors_[i].grad_bytes ? slot->received() : 0;
    if (received != tensors_[i].grad_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " commits step ", request.step(), " but tensor \"",
                       tensors_[i].spec.name(), "\" has ", received, " of ", tensors_[i].grad_bytes,
                       " gradient bytes; push every chunk of every tensor before committing"));
    }
  }
  PARAMD_ASSIGN_OR_RETURN(CommitOutcome outcome, sequence_.Commit(rank, mine));
  if (!outcome.work.has_value()) return outcome;
  // The last rank: the step's slots are handed over with it, and the hyperparameters it runs with.
  slots_.Take(outcome.work->step);
  if (!early_.empty()) {
    LogEarlyTimesLocked(outcome.work->step, WithdrawEarlyLocked(outcome.work->step));
  }
  last_grad_scale_ = outcome.work->grad_scale;
  last_commit_lr_ = outcome.work->lr;
  if (!outcome.work->lr.has_value()) outcome.work->lr = hyper_.lr();
  outcome.work->weight_decay = hyper_.weight_decay();
  if (outcome.work->step == 0) {
    for (Tensor& t : tensors_) t.upload.reset();  // no retry of the initial weights from now on
  }
  return outcome;
}

absl::StatusOr<HostBuffer> Job::NewBuffer(int64_t bytes) const {
  absl::StatusOr<HostBuffer> buffer = buffers_->Allocate(bytes);
  if (buffer.ok()) return buffer;
  if (!warned_heap_fallback_.exchange(true)) {
    PARAMD_LOG(WARNING)
        << "job " << name_ << ": " << buffer.status() << "; buffers that do not fit go to the heap"
        << (buffers_->shared()
                ? ", and trainers move their bytes in data chunks (raise /dev/shm's size "
                  "to keep them in shared memory)"
                : " (pageable memory: slower copies to and from the GPU)");
  }
  return HeapAllocator()->Allocate(bytes);
}

absl::Status Job::SizeSlot(ChunkBuffer& slot, size_t i) const {
  if (slot.holds_memory() && slot.size() == tensors_[i].grad_bytes) return absl::OkStatus();
  PARAMD_ASSIGN_OR_RETURN(HostBuffer buffer, NewBuffer(tensors_[i].grad_bytes));
  slot.Reset(std::move(buffer));
  return absl::OkStatus();
}

absl::StatusOr<SlotPlaces> Job::SlotsForStep(int32_t rank, int64_t step, Memory memory) {
  absl::MutexLock lock(&mu_);
  return SlotPlacesLocked(rank, step, memory);
}

absl::Status Job::SlotSetsFull() const {
  const int64_t steps_run = sequence_.steps_run();
  const int64_t next_step = sequence_.next_step();
  return WithReason(
      absl::UnavailableError(absl::StrCat(
          "job ", Quoted(name_), " holds ", slots_.held(), " gradient slot sets (steps ", steps_run,
          " to ", next_step - 1, " wait to run, and the step collected): its slots for step ",
          next_step + (slots_.collecting().made() ? 1 : 0), " come free once step ", steps_run,
          " has run; pull its weights first, or retry")),
      v1::ERROR_REASON_SLOT_SETS_FULL);
}

absl::Status Job::MakeCollectingLocked() {
  return slots_.MakeCollecting() ? absl::OkStatus() : SlotSetsFull();
}

Place Job::DeviceSlotPlace(SlotSet& set, size_t tensor, int32_t rank) {
  const int64_t bytes = tensors_[tensor].grad_bytes;
  DeviceSlot& slot = set.Device(tensor, rank);
  if (slot.bytes.size() != bytes) {
    slot = DeviceSlot();
    absl::StatusOr<DeviceBytes> allocated =
        device_memory_ != nullptr ? device_memory_->Allocate(bytes)
                                  : absl::FailedPreconditionError("backend " + backend_->name() +
                                                                  " exports no GPU memory");
    if (!allocated.ok()) {
      if (!warned_device_fallback_.exchange(true)) {
        PARAMD_LOG(WARNING)
            << "job " << name_ << ": " << allocated.status()
            << "; gradients that do not fit in GPU memory are pushed in data chunks";
      }
      return Place{};
    }
    slot.bytes = *std::move(allocated);
  }
  return slot.bytes.place();
}

absl::Status Job::CheckCollects(int64_t step, bool or_next) const {
  const int64_t next_step = sequence_.next_step();
  if (step < next_step) {
    return absl::FailedPreconditionError(absl::StrCat("step ", step, " of job \"", name_,
                                                      "\" is stale: the job collects step ",
                                                      next_step, " now"));
  }
  if (step > next_step + (or_next ? 1 : 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " of job \"", name_, "\" is ahead of the step it collects (",
                     next_step, "); every rank commits step ", next_step, " first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SlotPlaces> Job::SlotPlacesLocked(int32_t rank, int64_t step, Memory memory) {
  const bool device = memory == Memory::kDevice;
  PARAMD_RETURN_IF_ERROR(failed_);
  PARAMD_RETURN_IF_ERROR(CheckRank(rank));
  PARAMD_RETURN_IF_ERROR(CheckCollects(step, /*or_next=*/true));
  const bool lookahead = step == sequence_.next_step() + 1;
  if (initialized_tensors_ != static_cast<int64_t>(tensors_.size())) {
    PARAMD_RETURN_IF_ERROR(MakingVersionZeroLocked());
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", name_, "\" has initial weights for ", initialized_tensors_, " of ",
        tensors_.size(), " tensors; rank 0 uploads all of them before gradients are pushed"));
  }
  if (lookahead) {
    // No step reads this set (a spare one's step has run), so the trainer may write it already;
    // its pushes are accepted once the job collects `step`.
    SlotSet* next = slots_.Lookahead();
    if (next == nullptr) return SlotSetsFull();
    // The set is cleared when it starts collecting: nothing of it counts as received.
    return PlacesOfLocked(*next, rank, device, /*received=*/false, SlotPlaces{});
  }
  PARAMD_RETURN_IF_ERROR(MakeCollectingLocked());
  SlotPlaces out;
  out.committed = sequence_.committed(rank);
  return PlacesOfLocked(slots_.collecting(), rank, device, /*received=*/true, std::move(out));
}

absl::StatusOr<SlotPlaces> Job::PlacesOfLocked(SlotSet& set, int32_t rank, bool device,
                                               bool received, SlotPlaces out) {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    ChunkBuffer& slot = set[i][static_cast<size_t>(rank)];
    PARAMD_RETURN_IF_ERROR(SizeSlot(slot, i));
    if (device) {
      out.places.push_back(DeviceSlotPlace(set, i, rank));
    } else {
      out.places.push_back(slot.place() != nullptr ? *slot.place() : Place{});
    }
    out.bytes.push_back(tensors_[i].grad_bytes);
    out.received.push_back(received ? slot.received() : 0);
    out.tensors.push_back(tensors_[i].spec.name());
  }
  return out;
}

void Job::SetTrainerTransport(int32_t rank, const std::string& transport,
                              const std::string& reason) {
  absl::MutexLock lock(&mu_);
  v1::TrainerTransport& t = trainer_transports_[rank];
  t.set_rank(rank);
  t.set_transport(transport);
  t.set_reason(reason);
}

std::string Job::TrainerTransportOf(int32_t rank) const {
  absl::MutexLock lock(&mu_);
  auto it = trainer_transports_.find(rank);
  return it == trainer_transports_.end() ? std::string() : it->second.transport();
}

absl::StatusOr<std::shared_ptr<ServedTensor>> Job::FreshServed(int tensor) {
  return served_.Fresh(tensor, [this, tensor]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ held
    return NewServed(tensor);
  });
}

absl::StatusOr<std::shared_ptr<ServedTensor>> Job::NewServed(int tensor) const {
  const Tensor& t = tensors_[static_cast<size_t>(tensor)];
  auto served = std::make_shared<ServedTensor>();
  for (const FormatKey& f : formats_) {
    ServedFormat& format = served->formats.emplace_back();
    format.key = f;
    format.layout = kernels::ServeLayout(KernelRecipe(f.recipe), KernelDirection(f.direction),
                                         t.spec.rows(), t.spec.cols());
    PARAMD_ASSIGN_OR_RETURN(format.bytes,
                            NewBuffer(format.layout.data_bytes + format.layout.scale_bytes));
    if (device_memory_ != nullptr) {
      absl::StatusOr<DeviceBytes> device = device_memory_->Allocate(format.bytes.size());
      if (device.ok()) {
        format.device = *std::move(device);
      } else if (!warned_device_fallback_.exchange(true)) {
        PARAMD_LOG(WARNING) << "job " << name_ << ": " << device.status()
                            << "; served bytes that do not fit are pulled from host memory";
      }
    }
  }
  return served;
}

std::vector<StepReport> Job::RunOrHoldStep(const StepWork& work) {
  std::vector<StepWork> run;
  {
    absl::MutexLock lock(&mu_);
    // A failed job runs no step again; its taken slots go.
    if (!failed_.ok()) {
      DropSlotsLocked(work.step);
      sequence_.DropHeld();
      return {};
    }
    // A step an import discarded; one that already ran is the sequence's to ignore.
    if (!slots_.IsTaken(work.step)) return {};
    run = sequence_.ClaimRunnable(work);
    if (run.empty()) return {};
  }
  std::vector<StepReport> reports;
  for (const StepWork& w : run) {
    reports.push_back(StepNow(w));
    if (!reports.back().failed.ok()) break;  // the job failed: the later steps do not run
  }
  EndStepsRunning();
  return reports;
}

void Job::EndStepsRunning() {
  std::vector<std::function<void()>> started;
  {
    absl::MutexLock lock(&mu_);
    sequence_.EndRunning();
    started = StartCaughtUpExportsLocked();
  }
  for (auto& s : started) s();
}

void Job::Fail(const absl::Status& why) {
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    FailLocked(why, &wake);
  }
  for (auto& w : wake) w();
}

void Job::FailLocked(const absl::Status& why, std::vector<std::function<void()>>* wake) {
  if (!failed_.ok()) return;
  failed_ = why;
  // A round waiting on the other daemons ends with it; theirs end at their deadline, failing the
  // job there too.
  if (sharded()) peers_.exchange->CloseJob(name_, why);
  // Their pulls ask again, find no version (Served) and end with the job's status.
  served_.TakeAllWaiters(wake);
}

absl::Status Job::CheckUsable() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

absl::Status Job::FreshServedForStep(int64_t step,
                                     std::vector<std::shared_ptr<ServedTensor>>* out) {
  const auto started = std::chrono::steady_clock::now();
  bool warned = false;
  for (int i = 0; i < static_cast<int>(tensors_.size()); ++i) {
    const Tensor& t = tensors_[static_cast<size_t>(i)];
    if (!early_.empty() && early_[static_cast<size_t>(i)].step == step &&
        early_[static_cast<size_t>(i)].served != nullptr) {
      // Taken when the tensor's gradients landed: its early step (if it ran) wrote them.
      out->push_back(early_[static_cast<size_t>(i)].served);
      continue;
    }
    for (;;) {
      PARAMD_RETURN_IF_ERROR(failed_);  // deleted while it waited
      PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<ServedTensor> served, FreshServed(i));
      if (served != nullptr) {
        out->push_back(std::move(served));
        break;
      }
      // A reader still leases the retired version: its lease ends with Release or at its expiry.
      const auto free = [this, i]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ held
        return served_.AnyFree(i);
      };
      mu_.AwaitWithTimeout(absl::Condition(&free), absl::Milliseconds(20));
      if (!warned && std::chrono::steady_clock::now() - started > std::chrono::seconds(1)) {
        warned = true;
        PARAMD_LOG(WARNING) << "job " << name_ << ": step " << step << " waits for readers of "
                            << "tensor " << t.spec.name() << " to release one of its "
                            << kServedVersions << " served versions (or for a lease to expire)";
      }
    }
  }
  return absl::OkStatus();
}

StepReport Job::FailStep(const StepWork& work, const absl::Status& why) {
  // A step that fails fails the job: its state may be half-updated, which no retry could repair.
  StepReport report{work.step, 0, 0, false, 1.0f, absl::OkStatus()};
  report.failed = WithReason(
      absl::Status(
          why.code(),
          absl::StrCat("job ", Quoted(name_), " failed at step ", work.step, ": ", why.message(),
                       "; it runs no more steps: delete it (DeleteJob, paramctl delete) "
                       "and register it again from an export or checkpoint")),
      v1::ERROR_REASON_JOB_FAILED);
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    FailLocked(report.failed, &wake);
    DropSlotsLocked(work.step);
  }
  for (auto& w : wake) w();
  return report;
}

StepReport Job::StepNow(const StepWork& work) { return StepRunner(*this, work).Run(); }

std::shared_ptr<const ServedTensor> Job::Served(int tensor, int64_t min_version) const {
  absl::MutexLock lock(&mu_);
  const auto& served = served_.newest(tensor);
  if (failed_.ok() && served != nullptr && served->version >= min_version) return served;
  return nullptr;
}

uint64_t Job::AddWaiter(int tensor, int64_t min_version, std::function<void()> wake) {
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return 0;
  return served_.AddWaiter(tensor, min_version, std::move(wake));
}

bool Job::RemoveWaiter(uint64_t id) {
  absl::MutexLock lock(&mu_);
  return served_.RemoveWaiter(id);
}

void Job::StopWaiting() {
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    served_.StopWaiting(&wake);
  }
  for (auto& w : wake) w();
}

absl::StatusOr<v1::AdamwHyperparams> Job::SetHyperparams(const v1::SetHyperparamsRequest& request) {
  if (request.has_lr() && !(std::isfinite(request.lr()) && request.lr() > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr = ", request.lr(), " must be finite and > 0"));
  }
  if (request.has_weight_decay() &&
      !(std::isfinite(request.weight_decay()) && request.weight_decay() >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay = ", request.weight_decay(), " must be finite and >= 0"));
  }
  absl::MutexLock lock(&mu_);
  PARAMD_RETURN_IF_ERROR(failed_);
  if (request.has_lr()) {
    hyper_.set_lr(request.lr());
    // The lr set now is the one the next early steps predict (a schedule announced before the
    // step's gradients land), not the last commit's.
    last_commit_lr_.reset();
  }
  if (request.has_weight_decay()) hyper_.set_weight_decay(request.weight_decay());
  return hyper_;
}

int Job::registered_ranks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(registered_.size());
}

}  // namespace paramd
