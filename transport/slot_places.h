// What the same-node transports (`shm`, `cuda_ipc`) share on the trainer's side: the Attach call,
// a rank's slot places for a step (asked once per step), and the rule that sorts a push's items
// into slots written in place and items that go inline.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "paramd/v1/data.grpc.pb.h"
#include "transport/transport.h"

namespace paramd {

// Ten seconds from now: the deadline of a transport's own bookkeeping calls.
Deadline Soon();

absl::Status AttachCall(v1::Data::Stub& stub, const v1::AttachRequest& request, Deadline deadline,
                        v1::AttachResponse* response);

// The Attach request for the slot places of `target`'s rank and step over `transport`.
v1::AttachRequest SlotRequest(const PushTarget& target, const std::string& transport);

// A rank's slot places for one step, indexed by tensor, with the bytes this process knows the
// daemon has received in each.
struct SlotCache {
  std::string job;
  int32_t rank = 0;
  int64_t step = -1;
  v1::AttachResponse places;
  std::map<std::string, int> index;  // tensor -> slot
  std::vector<int64_t> received;     // guarded by the owning transport's mutex

  // From the answer to `request` (a SlotRequest).
  static std::shared_ptr<SlotCache> Of(const v1::AttachRequest& request,
                                       v1::AttachResponse response);
  bool Serves(const PushTarget& target) const {
    return job == target.job && rank == target.rank && step == target.step;
  }
  // Records the placed items as received whole.
  void MarkReceived(std::span<const PushItem* const> placed);
};

// A push sorted: items to write into their slots (with the slots' addresses), and items to push
// inline (unknown tensors, sizes that do not match, slots outside shared memory: the daemon then
// answers as for any other transport).
struct PushPlan {
  std::vector<const PushItem*> placed;
  std::vector<uint8_t*> slots;
  std::vector<PushItem> inline_items;
};

// Sorts `items` by `slots`. `locate` gives a slot place's address; `same` whether a slot the
// daemon already holds whole has the item's bytes (then the item is a retry and is left out; else
// FAILED_PRECONDITION, as for inline pushes). A slot partly pushed inline is FAILED_PRECONDITION.
absl::StatusOr<PushPlan> PlanPush(
    const SlotCache& slots, const PushTarget& target, std::span<const PushItem> items,
    const std::function<absl::StatusOr<uint8_t*>(const v1::ShmPlace&)>& locate,
    const std::function<absl::StatusOr<bool>(const uint8_t*, std::span<const std::byte>)>& same);

}  // namespace paramd
