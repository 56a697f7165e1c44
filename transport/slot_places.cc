#include "transport/slot_places.h"

#include <grpcpp/client_context.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/daemon_instance.h"
#include "common/grpc_status.h"
#include "transport/inline/inline.h"

namespace paramd {

Deadline Soon() { return std::chrono::system_clock::now() + std::chrono::seconds(10); }

absl::Status AttachCall(v1::Data::Stub& stub, const v1::AttachRequest& request, Deadline deadline,
                        v1::AttachResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(deadline);
  return FromGrpcStatus(stub.Attach(&context, request, response));
}

v1::AttachRequest SlotRequest(const PushTarget& target, const std::string& transport) {
  v1::AttachRequest request;
  request.set_job(target.job);
  request.set_rank(target.rank);
  request.set_transport(transport);
  request.set_step(target.step);
  return request;
}

std::shared_ptr<SlotCache> SlotCache::Of(const v1::AttachRequest& request,
                                         v1::AttachResponse response) {
  auto cache = std::make_shared<SlotCache>();
  cache->job = request.job();
  cache->rank = request.rank();
  cache->step = request.step();
  cache->instance = response.instance();
  cache->places = std::move(response);
  for (int i = 0; i < cache->places.slots_size(); ++i) {
    cache->index.emplace(cache->places.slots(i).tensor(), i);
    cache->received.push_back(cache->places.slots(i).received());
  }
  return cache;
}

absl::StatusOr<std::shared_ptr<SlotCache>> StepSlots::For(const PushTarget& target,
                                                          Deadline deadline) {
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
  remember_(response);
  std::shared_ptr<SlotCache> cache = SlotCache::Of(request, std::move(response));
  std::lock_guard<std::mutex> lock(mu_);
  ObserveLocked(cache->instance);
  if (cache->instance == starts_.current()) last_ = cache;
  return cache;
}

void StepSlots::Observe(uint64_t instance) {
  std::lock_guard<std::mutex> lock(mu_);
  ObserveLocked(instance);
}

void StepSlots::ObserveLocked(uint64_t instance) {
  starts_.See(instance);
  const uint64_t current = starts_.current();
  if (last_ != nullptr && last_->instance != current) last_.reset();
  if (ahead_ != nullptr && ahead_->instance != current) ahead_.reset();
}

absl::StatusOr<std::shared_ptr<SlotCache>> StepSlots::ForPush(const PushTarget& target,
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

void StepSlots::Forget() {
  std::lock_guard<std::mutex> lock(mu_);
  last_.reset();
  ahead_.reset();
}

absl::Status StepSlots::PushFollowingRestarts(const std::function<absl::Status()>& push) {
  absl::Status status = push();
  if (!FromAnotherDaemonStart(status)) return status;
  Forget();
  return push();
}

void StepSlots::LookAhead(const PushTarget& target) {
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
                             remember_(call->response);
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

void StepSlots::MarkReceived(SlotCache& slots, std::span<const PushItem* const> placed) {
  std::lock_guard<std::mutex> lock(mu_);
  slots.MarkReceived(placed);
}

void SlotCache::MarkReceived(std::span<const PushItem* const> placed) {
  for (const PushItem* item : placed) {
    const int i = index.at(item->tensor);
    received[static_cast<size_t>(i)] = places.slots(i).bytes();
  }
}

void ReleaseSoon(v1::Data::Stub& stub, AsyncCalls& calls, std::span<const uint64_t> leases) {
  auto* call = calls.Start<v1::ReleaseRequest, v1::ReleaseResponse>();
  call->context.set_deadline(Soon());
  for (uint64_t lease : leases) call->request.add_leases(lease);
  stub.async()->Release(&call->context, &call->request, &call->response,
                        [&calls, call](grpc::Status) { calls.Finished(call); });
}

absl::Status FollowStart(v1::Data::Stub& stub, const v1::AttachRequest& probe, uint64_t instance,
                         Deadline deadline, const std::function<uint64_t()>& current,
                         const std::function<void(const v1::AttachResponse&)>& remember) {
  if (instance == 0 || instance == current()) return absl::OkStatus();
  v1::AttachResponse response;
  if (absl::Status s = AttachCall(stub, probe, deadline, &response); !s.ok()) return s;
  remember(response);
  if (instance == current()) return absl::OkStatus();
  return absl::UnavailableError("the daemon restarted while it answered this pull; pull again");
}

absl::Status PullPlacesEach(v1::Data::Stub& stub, const PullManyTarget& target,
                            std::chrono::milliseconds lease, Deadline deadline,
                            const std::function<absl::Status(size_t, Pulled&&)>& each) {
  v1::PullRequest request;
  request.set_job(target.job);
  for (const std::string& tensor : target.tensors) request.add_tensors(tensor);
  *request.mutable_format() = target.format;
  request.set_min_version(target.min_version);
  request.set_delivery(v1::PULL_DELIVERY_PLACE);
  request.set_lease_ms(lease.count());
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

namespace {
PullManyTarget OneTensor(const PullTarget& target) {
  return {target.job, {target.tensor}, target.format, target.min_version};
}
}  // namespace

absl::Status PullOneOfMany(Transport& transport, const PullTarget& target, Deadline deadline,
                           Pulled* out) {
  // The caller's buffer goes in and comes back out, so a pull into the same Pulled each step
  // copies into memory already faulted in (a fresh buffer of 256 MiB costs its page faults: 7x).
  std::vector<Pulled> pulled(1);
  pulled.front() = std::move(*out);
  const absl::Status status = transport.PullMany(OneTensor(target), deadline, &pulled);
  *out = std::move(pulled.front());
  return status;
}

absl::Status PullInPlaceOneOfMany(Transport& transport, const PullTarget& target, Deadline deadline,
                                  std::chrono::milliseconds lease, PulledView* out) {
  std::vector<PulledView> views;
  if (absl::Status s = transport.PullInPlaceMany(OneTensor(target), deadline, lease, &views);
      !s.ok()) {
    return s;
  }
  *out = std::move(views.front());
  return absl::OkStatus();
}

absl::StatusOr<PushPlan> PlanPush(
    const SlotCache& slots, const PushTarget& target, std::span<const PushItem> items,
    const std::function<absl::StatusOr<uint8_t*>(const v1::ShmPlace&)>& locate,
    const std::function<absl::StatusOr<bool>(const uint8_t*, std::span<const std::byte>)>& same) {
  PushPlan plan;
  for (const PushItem& item : items) {
    auto it = slots.index.find(item.tensor);
    const v1::ShmPlace* place = it == slots.index.end() ? nullptr : &slots.places.slots(it->second);
    if (place == nullptr || place->segment() < 0 || place->offset() < 0 ||
        place->bytes() != static_cast<int64_t>(item.data.size())) {
      plan.inline_items.push_back(item);
      continue;
    }
    absl::StatusOr<uint8_t*> slot = locate(*place);
    if (!slot.ok()) return slot.status();
    const int64_t received = slots.received[static_cast<size_t>(it->second)];
    if (received == place->bytes()) {
      // Pushed before (a retry, or a restarted trainer): the same rule as inline pushes. Identical
      // bytes are marked again, not copied: the daemon judges (a duplicate is acknowledged; a
      // daemon restarted since these places were handed out refuses them).
      absl::StatusOr<bool> identical = same(*slot, item.data);
      if (!identical.ok()) return identical.status();
      if (*identical) {
        plan.placed.push_back(&item);
        plan.slots.push_back(nullptr);
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
    plan.slots.push_back(*slot);
  }
  return plan;
}

}  // namespace paramd
