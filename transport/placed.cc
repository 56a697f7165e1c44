#include "transport/placed.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/daemon_instance.h"
#include "common/grpc_status.h"
#include "transport/inline/inline.h"

namespace paramd {

// Unary calls started without waiting for their answers (a lease's release, a look-ahead), made
// with gRPC's callback API. Each call's objects live until its callback has run; the owner waits
// for the calls still in flight before it goes away.
class AsyncCalls {
 public:
  struct CallBase {
    virtual ~CallBase() = default;
    grpc::ClientContext context;
  };
  template <typename Request, typename Response>
  struct Call : CallBase {
    Request request;
    Response response;
  };

  ~AsyncCalls() { WaitIdle(); }

  // Keeps a new call alive until Finished(call); returns it for the stub's async method.
  template <typename Request, typename Response>
  Call<Request, Response>* Start() {
    auto call = std::make_unique<Call<Request, Response>>();
    Call<Request, Response>* raw = call.get();
    std::lock_guard<std::mutex> lock(mu_);
    finished_.clear();  // calls whose callbacks have returned
    calls_.emplace(raw, std::move(call));
    return raw;
  }

  // Called last by a call's callback. Its objects are freed later (by the next Start or the
  // destructor), not while gRPC may still be returning from the callback.
  void Finished(CallBase* call) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(call);
    finished_.push_back(std::move(it->second));
    calls_.erase(it);
    idle_.notify_all();
  }

  // Blocks until every started call has finished (their deadlines bound the wait).
  void WaitIdle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return calls_.empty(); });
  }

 private:
  std::mutex mu_;
  std::condition_variable idle_;
  std::map<CallBase*, std::unique_ptr<CallBase>> calls_;
  std::vector<std::unique_ptr<CallBase>> finished_;
};

namespace {

// A copy-out pull holds its lease only while it copies, then releases it without waiting for the
// answer; the lease expires after this long if the trainer dies first.
constexpr std::chrono::milliseconds kCopyLease{10000};

absl::Status AttachCall(v1::Data::Stub& stub, const v1::AttachRequest& request, Deadline deadline,
                        v1::AttachResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(deadline);
  return FromGrpcStatus(stub.Attach(&context, request, response));
}

// The Attach request for the slot places of `target`'s rank and step over `transport`.
v1::AttachRequest SlotRequest(const PushTarget& target, const std::string& transport) {
  v1::AttachRequest request;
  request.set_job(target.job);
  request.set_rank(target.rank);
  request.set_transport(transport);
  request.mutable_slots()->set_step(target.step);
  return request;
}

// Sends a release of `leases` without waiting for the answer (there is nothing to report: unknown
// and expired leases are ignored), with a deadline of its own; `calls` waits for it at its end.
void ReleaseSoon(v1::Data::Stub& stub, AsyncCalls& calls, std::span<const uint64_t> leases) {
  auto* call = calls.Start<v1::ReleaseRequest, v1::ReleaseResponse>();
  call->context.set_deadline(Soon());
  for (uint64_t lease : leases) call->request.add_leases(lease);
  stub.async()->Release(&call->context, &call->request, &call->response,
                        [&calls, call](grpc::Status) { calls.Finished(call); });
}

// One Pull call of `transport` (PullRequest.transport: what the daemon counts the bytes under) for
// the places of several tensors (PullRequest.tensors, PULL_DELIVERY_PLACE, leases
// of `lease`): `each` gets every answer with its index in `target.tensors`, as it arrives (with
// streamed bytes where the daemon had no place for them).
absl::Status PullPlacesEach(v1::Data::Stub& stub, const std::string& transport,
                            const PullManyTarget& target, std::chrono::milliseconds lease,
                            Deadline deadline,
                            const std::function<absl::Status(size_t, Pulled&&)>& each) {
  v1::PullRequest request;
  request.set_transport(transport);
  request.set_job(target.job);
  for (const std::string& tensor : target.tensors) request.add_tensors(tensor);
  *request.mutable_format() = target.format;
  request.set_min_version(target.min_version);
  request.set_delivery(v1::PULL_DELIVERY_PLACE);
  request.set_lease_ms(lease.count());
  request.set_batch_headers(true);
  std::map<std::string, size_t> order;
  for (size_t i = 0; i < target.tensors.size(); ++i) order.emplace(target.tensors[i], i);
  return PullStreamEach(stub, request, deadline, [&](Pulled&& pulled) -> absl::Status {
    auto it = order.find(pulled.header.tensor());
    if (it == order.end()) {
      return absl::DataLossError(absl::StrCat("the daemon answered with tensor \"",
                                              pulled.header.tensor(),
                                              "\", which this pull did not ask for"));
    }
    const size_t index = it->second;
    order.erase(it);  // once each
    return each(index, std::move(pulled));
  });
}

PullManyTarget OneTensor(const PullTarget& target) {
  return {target.job, {target.tensor}, target.format, target.min_version};
}

}  // namespace

Deadline Soon() { return std::chrono::system_clock::now() + std::chrono::seconds(10); }

uint64_t DaemonStarts::current() const { return current_; }

DaemonStarts::Seen DaemonStarts::See(uint64_t instance) {
  if (instance == 0 || instance == current_) return Seen::kCurrent;  // 0: not told
  if (past_.contains(instance)) return Seen::kPast;
  if (current_ != 0) past_.insert(current_);
  const bool first = current_ == 0;
  current_ = instance;
  return first ? Seen::kCurrent : Seen::kNew;
}

// A rank's slot places for one step, indexed by tensor, with the bytes this process knows the
// daemon has received in each.
struct PlacedTransport::SlotCache {
  std::string job;
  int32_t rank = 0;
  int64_t step = -1;
  uint64_t instance = 0;  // the daemon start that handed the places out (AttachResponse.instance)
  v1::AttachResponse places;
  std::map<std::string, int> index;  // tensor -> slot
  std::vector<int64_t> received;     // written under its StepSlots' mutex

  static std::shared_ptr<SlotCache> Of(const v1::AttachRequest& request,
                                       v1::AttachResponse response) {
    auto cache = std::make_shared<SlotCache>();
    cache->job = request.job();
    cache->rank = request.rank();
    cache->step = request.slots().step();
    cache->instance = response.instance();
    cache->places = std::move(response);
    for (int i = 0; i < cache->places.slots_size(); ++i) {
      cache->index.emplace(cache->places.slots(i).tensor(), i);
      cache->received.push_back(cache->places.slots(i).received());
    }
    return cache;
  }
  bool Serves(const PushTarget& target) const {
    return job == target.job && rank == target.rank && step == target.step;
  }
};

// A rank's slot places per step: the last step's, and the next step's, asked ahead without waiting
// once a push is done (the daemon sets a step's slots aside one step early). Places of another
// daemon start than the newest seen are never handed out. `remember` sees every Attach answer
// (regions may have grown, or belong to a new start) before this object uses it; it runs on a gRPC
// thread for the look-ahead, and must not call back into this object.
class PlacedTransport::StepSlots {
 public:
  StepSlots(v1::Data::Stub* stub, std::string transport,
            std::function<void(const std::string& job, const v1::AttachResponse&)> remember)
      : stub_(stub), transport_(std::move(transport)), remember_(std::move(remember)) {}
  ~StepSlots() { WaitIdle(); }

  // The places of `target`'s step: cached, asked ahead, or asked now.
  absl::StatusOr<std::shared_ptr<SlotCache>> For(const PushTarget& target, Deadline deadline) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (last_ != nullptr && last_->Serves(target)) return last_;
      ahead_done_.wait(lock, [this] { return !ahead_pending_; });
      if (ahead_ != nullptr && ahead_->Serves(target)) {
        last_ = std::move(ahead_);
        ahead_.reset();
        return last_;
      }
    }
    const v1::AttachRequest request = SlotRequest(target, transport_);
    v1::AttachResponse response;
    if (absl::Status s = AttachCall(*stub_, request, deadline, &response); !s.ok()) return s;
    remember_(request.job(), response);
    std::shared_ptr<SlotCache> cache = SlotCache::Of(request, std::move(response));
    std::lock_guard<std::mutex> lock(mu_);
    ObserveLocked(cache->instance);
    if (cache->instance == starts_.current()) last_ = cache;
    return cache;
  }

  // For a push of `items`: as For, but asked anew when the cache says an item was received whole
  // (a retry), since reading those bytes back through a cached place is only safe in memory of
  // the daemon's current start (a restarted daemon's old GPU memory may be freed).
  absl::StatusOr<std::shared_ptr<SlotCache>> ForPush(const PushTarget& target,
                                                     std::span<const PushItem> items,
                                                     Deadline deadline) {
    absl::StatusOr<std::shared_ptr<SlotCache>> slots = For(target, deadline);
    if (!slots.ok()) return slots;
    const SlotCache& cache = **slots;
    const bool retried = std::any_of(items.begin(), items.end(), [&](const PushItem& item) {
      auto it = cache.index.find(item.tensor);
      return it != cache.index.end() && cache.received[static_cast<size_t>(it->second)] ==
                                            static_cast<int64_t>(item.data.size());
    });
    if (!retried) return slots;
    Forget();
    return For(target, deadline);
  }

  // Asks for the places of the step after `target`'s, unless asked already. A refusal (the job
  // has not reached `target.step`, say) only leaves the next push to ask itself.
  void LookAhead(const PushTarget& target) {
    PushTarget next = target;
    ++next.step;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ahead_pending_ || (ahead_ != nullptr && ahead_->Serves(next))) return;
      ahead_pending_ = true;
      ahead_.reset();
    }
    auto* call = async_.Start<v1::AttachRequest, v1::AttachResponse>();
    call->context.set_deadline(Soon());
    call->request = SlotRequest(next, transport_);
    stub_->async()->Attach(&call->context, &call->request, &call->response,
                           [this, call](grpc::Status status) {
                             std::shared_ptr<SlotCache> cache;
                             if (status.ok()) {
                               remember_(call->request.job(), call->response);
                               cache = SlotCache::Of(call->request, call->response);
                             }
                             {
                               std::lock_guard<std::mutex> lock(mu_);
                               if (cache != nullptr) ObserveLocked(cache->instance);
                               if (cache != nullptr && cache->instance != starts_.current()) {
                                 cache.reset();
                               }
                               ahead_ = std::move(cache);
                               ahead_pending_ = false;
                             }
                             ahead_done_.notify_all();
                             async_.Finished(call);
                           });
  }

  // Records the placed items as received whole in `slots`.
  void MarkReceived(SlotCache& slots, std::span<const PushItem* const> placed) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const PushItem* item : placed) {
      const int i = slots.index.at(item->tensor);
      slots.received[static_cast<size_t>(i)] = slots.places.slots(i).bytes();
    }
  }

  // The daemon's start seen in an answer (a pull's, say): places of other starts are dropped.
  void Observe(uint64_t instance) {
    std::lock_guard<std::mutex> lock(mu_);
    ObserveLocked(instance);
  }

  // Runs `push` (which asks For its places); when the daemon refused them as a past start's (it
  // restarted since), forgets every place and runs it once more: asked anew, written anew.
  absl::Status PushFollowingRestarts(const std::function<absl::Status()>& push) {
    absl::Status status = push();
    if (!FromAnotherDaemonStart(status)) return status;
    Forget();
    return push();
  }

  // Waits for a look-ahead in flight (its deadline bounds the wait).
  void WaitIdle() { async_.WaitIdle(); }

 private:
  void Forget() {
    std::lock_guard<std::mutex> lock(mu_);
    last_.reset();
    ahead_.reset();
  }
  void ObserveLocked(uint64_t instance) {
    starts_.See(instance);
    const uint64_t current = starts_.current();
    if (last_ != nullptr && last_->instance != current) last_.reset();
    if (ahead_ != nullptr && ahead_->instance != current) ahead_.reset();
  }

  v1::Data::Stub* const stub_;
  const std::string transport_;
  const std::function<void(const std::string&, const v1::AttachResponse&)> remember_;
  std::mutex mu_;
  std::condition_variable ahead_done_;  // signalled when a look-ahead is back
  bool ahead_pending_ = false;
  std::shared_ptr<SlotCache> ahead_;  // the step after the last one pushed
  std::shared_ptr<SlotCache> last_;   // the last step pushed
  DaemonStarts starts_;
  AsyncCalls async_;  // the look-ahead in flight (last: it waits first)
};

namespace {

// Bytes of marks sent in one message at most (and at most the daemon's max_chunk_bytes): a lent
// mark is about 200 bytes, so thousands of tensors fit one.
constexpr int64_t kMarkMessageBytes = 1 << 20;

}  // namespace

Marks::Marks(v1::Data::Stub& stub, const PushTarget& target, uint64_t instance, Memory memory,
             Deadline deadline, int64_t max_bytes)
    : stub_(stub),
      deadline_(deadline),
      max_bytes_(std::min(kMarkMessageBytes, std::max<int64_t>(max_bytes, 1024))) {
  chunk_.set_job(target.job);
  chunk_.set_rank(target.rank);
  chunk_.set_step(target.step);
  chunk_.set_kind(target.kind);
  mark_.set_memory(memory == Memory::kDevice ? v1::PLACE_MEMORY_DEVICE : v1::PLACE_MEMORY_HOST);
  mark_.set_instance(instance);
}

bool Marks::Mark(const std::string& tensor, int64_t offset, int64_t bytes, bool last,
                 const v1::LentMemory* lent) {
  v1::InPlaceMarks::Entry* entry = chunk_.mutable_marks()->add_entries();
  entry->set_tensor(tensor);
  entry->set_offset(offset);
  v1::InPlaceMark* mark = entry->mutable_mark();
  *mark = mark_;
  mark->set_bytes(bytes);
  if (lent != nullptr) *mark->mutable_lent() = *lent;
  held_bytes_ += static_cast<int64_t>(entry->ByteSizeLong()) + 8;  // with its framing
  if (last || held_bytes_ >= max_bytes_ - 1024) return Send(last);
  return true;
}

bool Marks::Send(bool last) {
  if (writer_ == nullptr) {
    context_.set_deadline(deadline_);
    context_.set_initial_metadata_corked(true);  // sent with the first write: one batch less
    writer_ = stub_.Push(&context_, &response_);
  }
  held_bytes_ = 0;
  bool open = true;
  if (last) {
    chunk_.set_last(true);
    writer_->WriteLast(chunk_, grpc::WriteOptions());  // also closes the stream: one write less
    open = false;
  } else {
    open = writer_->Write(chunk_, grpc::WriteOptions().set_buffer_hint());
  }
  chunk_.mutable_marks()->clear_entries();
  return open;
}

absl::Status Marks::MarkWhole(std::span<const PushItem* const> items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (!Mark(items[i]->tensor, 0, static_cast<int64_t>(items[i]->data.size()),
              i + 1 == items.size())) {
      break;  // the daemon ended the stream (or it was the last): Finish says why
    }
  }
  return Finish();
}

absl::Status Marks::Finish() {
  if (!chunk_.marks().entries().empty())
    Send(/*last=*/true);                            // the stream's status says how it went
  if (writer_ == nullptr) return absl::OkStatus();  // nothing was marked
  absl::Status status = FromGrpcStatus(writer_->Finish());
  writer_.reset();
  return status;
}

PlacedTransport::PlacedTransport(const TransportContext& context, std::string name, Memory memory,
                                 std::string region_noun)
    : context_(context),
      name_(std::move(name)),
      memory_(memory),
      region_noun_(std::move(region_noun)),
      stub_(v1::Data::NewStub(context.channel)),
      inline_(MakeInlineTransport(context)),
      slots_(std::make_unique<StepSlots>(
          stub_.get(), name_,
          [this](const std::string& job, const v1::AttachResponse& r) { Remember(job, r); })),
      async_(std::make_unique<AsyncCalls>()) {}

PlacedTransport::~PlacedTransport() { Stop(); }

absl::Status PlacedTransport::BeforePush(uintptr_t) { return absl::OkStatus(); }
absl::StatusOr<std::vector<PlacedTransport::Lent>> PlacedTransport::Lend(
    std::span<const PushItem>) {
  return std::vector<Lent>();
}
absl::Status PlacedTransport::FinishMovesFromPlaces() { return absl::OkStatus(); }
absl::Status PlacedTransport::BeforeRead(bool) { return absl::OkStatus(); }
absl::Status PlacedTransport::ToHost(std::span<const PushItem> items, std::vector<PushItem>* host,
                                     std::vector<std::vector<std::byte>>* storage) {
  host->assign(items.begin(), items.end());
  return absl::OkStatus();
}

absl::Status PlacedTransport::PushInline(const PushTarget& target, std::span<const PushItem> items,
                                         Deadline deadline) {
  std::vector<PushItem> host;
  std::vector<std::vector<std::byte>> storage;
  if (absl::Status s = ToHost(items, &host, &storage); !s.ok()) return s;
  return inline_->Push(target, host, deadline);
}

void PlacedTransport::Stop() {
  slots_->WaitIdle();
  async_->WaitIdle();
}

v1::AttachRequest PlacedTransport::RegionsRequest(const std::string& job) const {
  v1::AttachRequest request;
  request.set_transport(name_);
  if (job.empty()) {
    request.mutable_probe();
  } else {
    request.set_job(job);
    request.mutable_regions();
  }
  return request;
}

absl::Status PlacedTransport::Probe(Deadline deadline) {
  v1::AttachResponse response;
  if (absl::Status s = AttachCall(*stub_, RegionsRequest(context_.job), deadline, &response);
      !s.ok()) {
    return s;
  }
  Remember(context_.job, response);
  return CheckProbe(response, deadline);
}

absl::Status PlacedTransport::Push(const PushTarget& target, std::span<const PushItem> items,
                                   Deadline deadline) {
  if (target.kind == v1::PUSH_KIND_INITIAL_WEIGHTS) {
    return PushInline(target, items, deadline);  // once per job, from rank 0
  }
  if (absl::Status s = BeforePush(target.ready_event); !s.ok()) return s;
  if (context_.lend_gradients) return PushLending(target, items, deadline);
  return slots_->PushFollowingRestarts([&] { return PushPlaced(target, items, deadline); });
}

absl::Status PlacedTransport::PushLending(const PushTarget& target, std::span<const PushItem> items,
                                          Deadline deadline) {
  absl::StatusOr<std::vector<Lent>> lent = Lend(items);
  if (!lent.ok()) return lent.status();
  if (!lent->empty()) {
    // Lent memory is the trainer's, whichever daemon start reads it: the marks name none.
    Marks marks(*stub_, target, /*instance=*/0, Memory::kDevice, deadline,
                context_.max_chunk_bytes);
    for (size_t i = 0; i < lent->size(); ++i) {
      const Lent& l = (*lent)[i];
      if (!marks.Mark(l.item->tensor, 0, static_cast<int64_t>(l.item->data.size()),
                      i + 1 == lent->size(), &l.memory)) {
        break;  // the daemon ended the stream (or it was the last): Finish says why
      }
    }
    if (absl::Status s = marks.Finish(); !s.ok()) return s;
  }
  std::vector<PushItem> rest;  // the items not lent (Lend keeps the items' order)
  auto next_lent = lent->begin();
  for (const PushItem& item : items) {
    if (next_lent != lent->end() && next_lent->item == &item) {
      ++next_lent;
    } else {
      rest.push_back(item);
    }
  }
  if (rest.empty()) return absl::OkStatus();
  return slots_->PushFollowingRestarts([&] { return PushPlaced(target, rest, deadline); });
}

absl::Status PlacedTransport::PushPlaced(const PushTarget& target, std::span<const PushItem> items,
                                         Deadline deadline) {
  absl::StatusOr<std::shared_ptr<SlotCache>> slots = slots_->ForPush(target, items, deadline);
  if (!slots.ok()) return slots.status();
  absl::StatusOr<PushPlan> plan = PlanPush(**slots, target, items, deadline);
  if (!plan.ok()) return plan.status();
  if (!plan->placed.empty()) {
    if (absl::Status s = MoveToPlaces(plan->job, plan->moves); !s.ok()) return s;
    // Every byte lies in its slot: the items are marked in one stream (a mark names > 0 bytes).
    std::vector<const PushItem*> marked;
    for (const PushItem* item : plan->placed) {
      if (!item->data.empty()) marked.push_back(item);
    }
    Marks marks(*stub_, target, (*slots)->instance, memory_, deadline, context_.max_chunk_bytes);
    if (absl::Status s = marks.MarkWhole(marked); !s.ok()) return s;
    slots_->MarkReceived(**slots, plan->placed);
    slots_->LookAhead(target);
  }
  if (!plan->inline_items.empty()) return PushInline(target, plan->inline_items, deadline);
  return absl::OkStatus();
}

absl::StatusOr<PushPlan> PlacedTransport::PlanPush(const SlotCache& slots, const PushTarget& target,
                                                   std::span<const PushItem> items,
                                                   Deadline deadline) {
  PushPlan plan;
  plan.job = target.job;
  for (const PushItem& item : items) {
    auto it = slots.index.find(item.tensor);
    const v1::Place* place = it == slots.index.end() ? nullptr : &slots.places.slots(it->second);
    if (place == nullptr || place->segment() < 0 || place->offset() < 0 ||
        place->bytes() != static_cast<int64_t>(item.data.size())) {
      plan.inline_items.push_back(item);
      continue;
    }
    absl::StatusOr<DaemonRegion*> region =
        Region(target.job, place->segment(), slots.instance, deadline);
    if (!region.ok()) return region.status();
    if ((*region)->size() >= 0 && place->offset() + place->bytes() > (*region)->size()) {
      return absl::DataLossError(absl::StrCat("slot of ", place->tensor(), " lies outside ",
                                              region_noun_, " ", place->segment()));
    }
    const PlacedBytes slot = (*region)->At(place->offset(), item.data.size());
    const int64_t received = slots.received[static_cast<size_t>(it->second)];
    if (received == place->bytes()) {
      // Pushed before (a retry, or a restarted trainer): the same rule as inline pushes. Identical
      // bytes are marked again, not copied: the daemon judges (a duplicate is acknowledged; a
      // daemon restarted since these places were handed out refuses them).
      absl::StatusOr<bool> identical = PlaceHolds(target.job, slot, item.data);
      if (!identical.ok()) return identical.status();
      if (*identical) {
        plan.placed.push_back(&item);  // marked only
        continue;
      }
      return absl::FailedPreconditionError(
          absl::StrCat("a different gradient of tensor \"", item.tensor,
                       "\" was already pushed for step ", target.step, " by rank ", target.rank,
                       "; pushes are idempotent only for identical bytes"));
    }
    if (received > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor \"", item.tensor, "\" has ", received, " of ", place->bytes(),
                       " bytes of step ", target.step, " pushed inline; finish it inline"));
    }
    plan.placed.push_back(&item);
    plan.moves.push_back({&item, slot});
  }
  return plan;
}

absl::Status PlacedTransport::Pull(const PullTarget& target, Deadline deadline, Pulled* out) {
  // The caller's buffer goes in and comes back out, so a pull into the same Pulled each step
  // copies into memory already faulted in (a fresh buffer of 256 MiB costs its page faults: 7x).
  std::vector<Pulled> pulled(1);
  pulled.front() = std::move(*out);
  const absl::Status status = PullMany(OneTensor(target), deadline, &pulled);
  *out = std::move(pulled.front());
  return status;
}

absl::Status PlacedTransport::PullInPlace(const PullTarget& target, Deadline deadline,
                                          std::chrono::milliseconds lease, PulledView* out) {
  std::vector<PulledView> views;
  if (absl::Status s = PullInPlaceMany(OneTensor(target), deadline, lease, &views); !s.ok()) {
    return s;
  }
  *out = std::move(views.front());
  return absl::OkStatus();
}

absl::Status PlacedTransport::PullMany(const PullManyTarget& target, Deadline deadline,
                                       std::vector<Pulled>* out) {
  // The caller's buffers are kept: copies land in memory a previous pull already faulted in.
  out->resize(target.tensors.size());
  std::vector<uint64_t> leases;
  // Each tensor's move starts as its header arrives; FinishMovesFromPlaces waits for them all.
  absl::Status status = PullPlacesEach(
      *stub_, name_, target, kCopyLease, deadline, [&](size_t i, Pulled&& pulled) -> absl::Status {
        if (!pulled.header.has_place()) {
          (*out)[i] = std::move(pulled);
          return absl::OkStatus();
        }
        leases.push_back(pulled.header.lease());
        absl::StatusOr<PlacedBytes> bytes = View(target.job, pulled.header, deadline);
        if (!bytes.ok()) return bytes.status();
        if (leases.size() == 1) {
          if (absl::Status s = BeforeRead(/*in_place=*/false); !s.ok()) return s;
        }
        if (absl::Status s = MoveFromPlace(target.job, *bytes, &(*out)[i].data); !s.ok()) {
          return s;
        }
        (*out)[i].header = std::move(pulled.header);
        return absl::OkStatus();
      });
  const absl::Status copied = FinishMovesFromPlaces();
  if (!leases.empty()) ReleaseSoon(*stub_, *async_, leases);  // one call for all, not waited for
  return status.ok() ? copied : status;
}

absl::Status PlacedTransport::PullInPlaceMany(const PullManyTarget& target, Deadline deadline,
                                              std::chrono::milliseconds lease,
                                              std::vector<PulledView>* out) {
  if (absl::Status s = CanViewInPlace(); !s.ok()) return s;
  out->assign(target.tensors.size(), PulledView{});
  std::vector<uint64_t> leases;
  absl::Status status = PullPlacesEach(
      *stub_, name_, target, lease, deadline, [&](size_t i, Pulled&& pulled) -> absl::Status {
        if (!pulled.header.has_place()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "the daemon keeps ", pulled.header.tensor(), " out of the memory ", name_,
              " maps (it ran out of room); use a pull that copies (Pull, PullMany)"));
        }
        leases.push_back(pulled.header.lease());
        absl::StatusOr<PlacedBytes> bytes = View(target.job, pulled.header, deadline);
        if (!bytes.ok()) return bytes.status();
        if (bytes->mapped == nullptr) {  // a transport of unmapped places refuses views first
          return absl::InternalError(
              absl::StrCat("transport ", name_, " has no view of the daemon's memory"));
        }
        PulledView& view = (*out)[i];
        view.header = std::move(pulled.header);
        view.data = std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes->mapped),
                                               bytes->bytes);
        view.lease = view.header.lease();
        return absl::OkStatus();
      });
  if (status.ok() && !leases.empty()) status = BeforeRead(/*in_place=*/true);
  if (!status.ok() && !leases.empty()) ReleaseSoon(*stub_, *async_, leases);  // nothing handed out
  return status;
}

absl::Status PlacedTransport::Release(uint64_t lease, Deadline deadline) {
  return ReleaseMany({&lease, 1}, deadline);
}

absl::Status PlacedTransport::ReleaseMany(std::span<const uint64_t> leases, Deadline) {
  if (!leases.empty()) ReleaseSoon(*stub_, *async_, leases);
  return absl::OkStatus();
}

absl::StatusOr<PlacedBytes> PlacedTransport::View(const std::string& job,
                                                  const v1::PullHeader& header, Deadline deadline) {
  if (absl::Status s = FollowStart(header.instance(), deadline); !s.ok()) return s;
  if (header.place_on_device() != (memory_ == Memory::kDevice)) {
    return absl::DataLossError(absl::StrCat("the daemon answered a ", name_,
                                            " pull with a place in memory it does not map"));
  }
  const v1::Place& place = header.place();
  if (place.offset() < 0 || place.bytes() != header.data_bytes() + header.scale_bytes()) {
    return absl::DataLossError(absl::StrCat("pulled place [", place.offset(), ", +", place.bytes(),
                                            ") does not hold ", header.data_bytes(), " + ",
                                            header.scale_bytes(), " bytes"));
  }
  absl::StatusOr<DaemonRegion*> region = Region(job, place.segment(), header.instance(), deadline);
  if (!region.ok()) return region.status();
  if ((*region)->size() >= 0 && place.offset() + place.bytes() > (*region)->size()) {
    return absl::DataLossError(absl::StrCat("pulled place [", place.offset(), ", +", place.bytes(),
                                            ") does not fit ", region_noun_, " ", place.segment()));
  }
  return (*region)->At(place.offset(), static_cast<size_t>(place.bytes()));
}

void PlacedTransport::Remember(const std::string& job, const v1::AttachResponse& response) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const DaemonStarts::Seen seen = starts_.See(response.instance());
    if (seen == DaemonStarts::Seen::kPast) return;
    if (seen == DaemonStarts::Seen::kNew) {
      for (auto& [name, regions] : regions_) {
        for (auto& [index, region] : regions.mapped) {
          region->Retire();
          retired_.push_back(std::move(region));
        }
      }
      regions_.clear();
    }
    Regions& regions = regions_[job];
    if (RegionCount(response) >
        (regions.described == nullptr ? 0 : RegionCount(*regions.described))) {
      auto described = std::make_shared<v1::AttachResponse>(response);
      described->clear_slots();  // only the regions are kept
      regions.described = std::move(described);
    }
  }
  slots_->Observe(response.instance());
}

absl::Status PlacedTransport::FollowStart(uint64_t instance, Deadline deadline) {
  const auto current = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    return starts_.current();
  };
  if (instance == 0 || instance == current()) return absl::OkStatus();
  v1::AttachResponse response;
  if (absl::Status s = AttachCall(*stub_, RegionsRequest(context_.job), deadline, &response);
      !s.ok()) {
    return s;
  }
  Remember(context_.job, response);
  if (instance == current()) return absl::OkStatus();
  return absl::UnavailableError("the daemon restarted while it answered this pull; pull again");
}

absl::StatusOr<DaemonRegion*> PlacedTransport::Region(const std::string& job, int index,
                                                      uint64_t instance, Deadline deadline) {
  // A place of another start than the current one is refused as such (the push then asks for
  // its places again), never looked up in the current start's regions.
  const auto another_start = [&] {
    return PlaceFromAnotherDaemonStart(absl::StrCat(region_noun_, " ", index));
  };
  if (index < 0) return absl::DataLossError(absl::StrCat(region_noun_, " index ", index));
  std::shared_ptr<const v1::AttachResponse> described;
  uint64_t start = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (instance != 0 && instance != starts_.current()) return another_start();
    Regions& regions = regions_[job];
    auto it = regions.mapped.find(index);
    if (it != regions.mapped.end()) return it->second.get();
    if (regions.described != nullptr && index < RegionCount(*regions.described)) {
      described = regions.described;
    }
    start = starts_.current();
  }
  if (described == nullptr) {  // a region newer than any answer seen: ask for their list
    auto response = std::make_shared<v1::AttachResponse>();
    if (absl::Status s = AttachCall(*stub_, RegionsRequest(job), deadline, response.get());
        !s.ok()) {
      return s;
    }
    if (index >= RegionCount(*response)) {
      return absl::DataLossError(absl::StrCat("the daemon named ", region_noun_, " ", index, " of ",
                                              RegionCount(*response)));
    }
    Remember(job, *response);
    start = response->instance();
    described = std::move(response);
  }
  absl::StatusOr<std::unique_ptr<DaemonRegion>> region = Map(*described, index);
  if (!region.ok()) return region.status();
  std::lock_guard<std::mutex> lock(mu_);
  // The daemon restarted while the region was mapped: it is the old start's (unmapped here).
  if (start != starts_.current() || (instance != 0 && instance != start)) return another_start();
  // Another thread may have mapped it meanwhile: its mapping stays.
  auto [it, inserted] = regions_[job].mapped.emplace(index, *std::move(region));
  return it->second.get();
}

}  // namespace paramd
