// What the same-node transports (`shm`, `cuda_ipc`) share on the trainer's side: the Attach call,
// a rank's slot places for a step (asked once per step, and for the next step as soon as a push is
// done, so the next push copies at once), and the rule that sorts a push's items into slots written
// in place and items that go inline.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "paramd/v1/data.grpc.pb.h"
#include "transport/async_calls.h"
#include "transport/transport.h"

namespace paramd {

// Ten seconds from now: the deadline of a transport's own bookkeeping calls.
Deadline Soon();

absl::Status AttachCall(v1::Data::Stub& stub, const v1::AttachRequest& request, Deadline deadline,
                        v1::AttachResponse* response);

// The Attach request for the slot places of `target`'s rank and step over `transport`.
v1::AttachRequest SlotRequest(const PushTarget& target, const std::string& transport);

// Which start of the daemon (AttachResponse.instance) a transport's mappings and places belong
// to. Answers come from the newest start seen, from a new one (the daemon restarted at the same
// address: forget what the old one handed out), or late from a past one (ignore them). Not
// thread-safe: its owner's lock guards it.
class DaemonStarts {
 public:
  enum class Seen { kCurrent, kNew, kPast };
  Seen See(uint64_t instance) {
    if (instance == 0 || instance == current_) return Seen::kCurrent;  // 0: not told
    if (past_.contains(instance)) return Seen::kPast;
    if (current_ != 0) past_.insert(current_);
    const bool first = current_ == 0;
    current_ = instance;
    return first ? Seen::kCurrent : Seen::kNew;
  }
  uint64_t current() const { return current_; }

 private:
  uint64_t current_ = 0;
  std::set<uint64_t> past_;
};

// A rank's slot places for one step, indexed by tensor, with the bytes this process knows the
// daemon has received in each.
struct SlotCache {
  std::string job;
  int32_t rank = 0;
  int64_t step = -1;
  uint64_t instance = 0;  // the daemon start that handed the places out (AttachResponse.instance)
  v1::AttachResponse places;
  std::map<std::string, int> index;  // tensor -> slot
  std::vector<int64_t> received;     // written under its StepSlots' mutex

  // From the answer to `request` (a SlotRequest).
  static std::shared_ptr<SlotCache> Of(const v1::AttachRequest& request,
                                       v1::AttachResponse response);
  bool Serves(const PushTarget& target) const {
    return job == target.job && rank == target.rank && step == target.step;
  }
  // Records the placed items as received whole.
  void MarkReceived(std::span<const PushItem* const> placed);
};

// A rank's slot places per step over one transport: the last step's, and the next step's, asked
// ahead without waiting once a push is done (the daemon sets a step's slots aside one step early).
// Places of another daemon start than the newest seen are never handed out. `remember` sees every
// Attach answer (segment names or IPC handles may have grown, or belong to a new start) before
// this object uses it; it runs on a gRPC thread for the look-ahead, and must not call back into
// this object.
class StepSlots {
 public:
  StepSlots(v1::Data::Stub* stub, std::string transport,
            std::function<void(const v1::AttachResponse&)> remember)
      : stub_(stub), transport_(std::move(transport)), remember_(std::move(remember)) {}
  ~StepSlots() { WaitIdle(); }

  // The places of `target`'s step: cached, asked ahead, or asked now.
  absl::StatusOr<std::shared_ptr<SlotCache>> For(const PushTarget& target, Deadline deadline);
  // For a push of `items`: as For, but asked anew when the cache says an item was received whole
  // (a retry), since reading those bytes back through a cached place is only safe in memory of
  // the daemon's current start (a restarted daemon's old GPU memory may be freed).
  absl::StatusOr<std::shared_ptr<SlotCache>> ForPush(const PushTarget& target,
                                                     std::span<const PushItem> items,
                                                     Deadline deadline);
  // Asks for the places of the step after `target`'s, unless asked already. A refusal (the job
  // has not reached `target.step`, say) only leaves the next push to ask itself.
  void LookAhead(const PushTarget& target);
  // Records the placed items as received whole in `slots`.
  void MarkReceived(SlotCache& slots, std::span<const PushItem* const> placed);
  // The daemon's start seen in an answer (a pull's, say): places of other starts are dropped.
  void Observe(uint64_t instance);
  // Drops every cached place (the daemon refused a mark as from another start).
  void Forget();
  // Runs `push` (which asks For its places); when the daemon refused them as a past start's
  // (it restarted since), forgets every place and runs it once more: asked anew, written anew.
  absl::Status PushFollowingRestarts(const std::function<absl::Status()>& push);
  // Waits for a look-ahead in flight (its deadline bounds the wait).
  void WaitIdle() { async_.WaitIdle(); }

 private:
  v1::Data::Stub* const stub_;
  const std::string transport_;
  const std::function<void(const v1::AttachResponse&)> remember_;
  std::mutex mu_;
  std::condition_variable ahead_done_;  // signalled when a look-ahead is back
  bool ahead_pending_ = false;
  std::shared_ptr<SlotCache> ahead_;  // the step after the last one pushed
  std::shared_ptr<SlotCache> last_;   // the last step pushed
  DaemonStarts starts_;
  AsyncCalls async_;  // the look-ahead in flight (last: it waits first)

  void ObserveLocked(uint64_t instance);
};

// Sends a release of `leases` without waiting for the answer (there is nothing to report: unknown
// and expired leases are ignored), with a deadline of its own; `calls` waits for it at its end.
void ReleaseSoon(v1::Data::Stub& stub, AsyncCalls& calls, std::span<const uint64_t> leases);

// Makes sure a transport's mappings belong to daemon start `instance` (a pulled place's): when
// `current()` (the start they belong to) is another, asks Attach with `probe` and gives the
// answer to `remember`, which takes the new start's names or handles. UNAVAILABLE (retried) when
// the place came from a start that is gone.
absl::Status FollowStart(v1::Data::Stub& stub, const v1::AttachRequest& probe, uint64_t instance,
                         Deadline deadline, const std::function<uint64_t()>& current,
                         const std::function<void(const v1::AttachResponse&)>& remember);

// One Pull call for the places of several tensors (PullRequest.tensors, PULL_DELIVERY_PLACE, leases
// of `lease`): `each` gets every answer with its index in `target.tensors`, as it arrives (with
// streamed bytes where the daemon had no place for them).
absl::Status PullPlacesEach(v1::Data::Stub& stub, const PullManyTarget& target,
                            std::chrono::milliseconds lease, Deadline deadline,
                            const std::function<absl::Status(size_t, Pulled&&)>& each);

// One tensor through a transport's pulls of several (the same-node transports ask for one tensor
// the way they ask for many: one request, the place, the copy or the view, the lease).
absl::Status PullOneOfMany(Transport& transport, const PullTarget& target, Deadline deadline,
                           Pulled* out);
absl::Status PullInPlaceOneOfMany(Transport& transport, const PullTarget& target, Deadline deadline,
                                  std::chrono::milliseconds lease, PulledView* out);

// A push sorted: items to write into their slots (with the slots' addresses), and items to push
// inline (unknown tensors, sizes that do not match, slots outside shared memory: the daemon then
// answers as for any other transport).
struct PushPlan {
  std::vector<const PushItem*> placed;
  std::vector<uint8_t*> slots;  // null: the slot holds these bytes already (a retry): mark only
  std::vector<PushItem> inline_items;
};

// Sorts `items` by `slots`. `locate` gives a slot place's address; `same` whether a slot the
// daemon already holds whole has the item's bytes (then the item is a retry, marked again without
// a copy; else FAILED_PRECONDITION, as for inline pushes). A slot partly pushed inline is
// FAILED_PRECONDITION.
absl::StatusOr<PushPlan> PlanPush(
    const SlotCache& slots, const PushTarget& target, std::span<const PushItem> items,
    const std::function<absl::StatusOr<uint8_t*>(const v1::ShmPlace&)>& locate,
    const std::function<absl::StatusOr<bool>(const uint8_t*, std::span<const std::byte>)>& same);

}  // namespace paramd
