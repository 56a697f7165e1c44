// A job's daemons agreeing on its steps (DESIGN.md §7): the "check" round before a step is decided
// (every daemon's found-inf and global-norm block sums) and a split tensor's amax rounds (its
// owners' amaxes), over the Peer exchange (peer_exchange.h). A job on one daemon has the identity
// agreement: its check is the job's, and it holds no split tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "paramd/v1/control.pb.h"
#include "server/shard/peer_exchange.h"

namespace paramd {

class ShardAgreement {
 public:
  virtual ~ShardAgreement() = default;

  // True for the identity agreement (a job on one daemon).
  virtual bool alone() const = 0;
  // Step `step`'s check round, from this daemon's check of its part (`finite`, and the block sums
  // of each of its tensors, in its order). Returns whether every gradient of the job is finite and,
  // in `blocks`, the whole job's block sums in registration order, then block order, as one daemon
  // holding it all would have them.
  virtual absl::StatusOr<bool> AgreeOnCheck(int64_t step, bool finite,
                                            const std::vector<std::vector<double>>& block_sums,
                                            std::vector<double>* blocks) = 0;
  // Tensor `index` of the part's whole amax at step `step` (round `round`), from the amax of this
  // daemon's rows of it; null for a tensor held whole.
  virtual std::function<absl::StatusOr<float>(float range_amax)> WholeAmaxOf(
      size_t index, int64_t step, const std::string& round) = 0;
};

// A job on one daemon: its own check, no amax round.
std::unique_ptr<ShardAgreement> IdentityAgreement();

// Job `job` sharded over daemons, `part` this daemon's part of it (its tensors' job indexes and
// row offsets), `amax_among[i]` the owners of tensor i of the part (indexes in the job's daemon
// list, sorted) where it is a row range of a split tensor, empty for a tensor held whole.
// `exchange` outlives it.
std::unique_ptr<ShardAgreement> PeerAgreement(std::string job, const v1::RegisterRequest& part,
                                              std::vector<std::vector<int>> amax_among,
                                              PeerExchange* exchange);

}  // namespace paramd
