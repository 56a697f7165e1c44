// A job sharded over several daemons (DESIGN.md §7), from a trainer's side: the job's shard map,
// which every daemon of the job computes alike (common/shard_map.h), and one Client per daemon.
// Each call goes to the owners of the tensors it names, in parallel: a push sends each owner the
// rows it holds, a commit goes to every daemon (each steps its part, agreeing with the others on
// the step's scalars), and a pull of a split tensor puts its owners' pieces together in the
// trainer's buffer (PlaceServedRange). Client (client/client.h) uses it when a job's daemon list
// names two or more daemons.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/job_state.h"
#include "common/shard_map.h"
#include "paramd/v1/control.pb.h"
#include "transport/transport.h"

namespace paramd {

class ShardedJob {
 public:
  // Connects to every daemon of `request.daemons()` (sorted, two or more) and registers the rank
  // with each, in parallel. Returns the first daemon's answer in `response`.
  static absl::StatusOr<std::unique_ptr<ShardedJob>> Register(const ClientOptions& options,
                                                              const v1::RegisterRequest& request,
                                                              v1::RegisterResponse* response);
  ~ShardedJob();

  const std::string& job() const { return job_; }
  // Each owner's rows of each item (a whole tensor's bytes) to that owner; pre-reduced, only to
  // the owners whose part this rank pushes (owner index mod world size). `ready_event` as
  // Client::PushGradients'.
  absl::Status Push(v1::PushKind kind, int32_t rank, int64_t step, std::span<const PushItem> items,
                    uintptr_t ready_event = 0);
  // Every daemon of the job gets the commit; the first daemon's answer.
  absl::StatusOr<v1::CommitResponse> Commit(int32_t rank, int64_t step, std::optional<double> lr,
                                            std::optional<double> grad_scale);
  // One version of every piece, put together in `out`.
  absl::Status Pull(const PullTarget& target, std::chrono::milliseconds timeout, Pulled* out);
  absl::Status PullMany(const PullManyTarget& target, std::chrono::milliseconds timeout,
                        std::vector<Pulled>* out);
  // A tensor held whole, leased where its owner serves it; FAILED_PRECONDITION for a split one.
  absl::StatusOr<PulledView> PullInPlace(const PullTarget& target,
                                         std::chrono::milliseconds timeout,
                                         std::chrono::milliseconds lease);
  // Every piece of a tensor leased where its owner serves it, in row order, one version for all
  // (each view's row_begin and header.rows() say which rows it holds): PullInPlaceMany of it.
  absl::StatusOr<std::vector<PulledView>> PullInPlacePieces(const PullTarget& target,
                                                            std::chrono::milliseconds timeout,
                                                            std::chrono::milliseconds lease);
  // Several tensors in place, in `target.tensors`' order: a tensor held whole is one view, a
  // split one its pieces in row order (row_begin > 0 after the first), each with its owner. One
  // PullInPlaceMany per owner, in parallel, all of one version (asked again, a few times at
  // most, where the owners answer different ones).
  absl::StatusOr<std::vector<PulledView>> PullInPlaceMany(const PullManyTarget& target,
                                                          std::chrono::milliseconds timeout,
                                                          std::chrono::milliseconds lease);
  // Ends the leases of `views` (each names its owner), one call per owner.
  absl::Status Release(const PulledView& view);
  absl::Status Release(std::span<const PulledView> views);
  absl::StatusOr<v1::DeleteJobResponse> DeleteJob();
  // Every daemon takes the new hyperparameters (in parallel): the first daemon's answer.
  absl::StatusOr<v1::SetHyperparamsResponse> SetHyperparams(
      const v1::SetHyperparamsRequest& request);
  // Every daemon checkpoints its part (in parallel): the first daemon's answer, with the bytes of
  // all. The versions agree once every rank pulled the newest (a checkpoint is of the steps
  // committed before it); FAILED_PRECONDITION naming both where they do not.
  absl::StatusOr<v1::CheckpointResponse> Checkpoint();
  // Every daemon restores its part from its newest checkpoint ("" path) or `path` on each.
  absl::StatusOr<v1::RestoreResponse> Restore(const std::string& path);
  // The whole job's state (client/job_state.h), put together from every daemon's part at one step
  // boundary: a split tensor's row fields and chunk scales are its pieces' in row order (every
  // piece but the last holds a multiple of 128 rows), its scalars are the ones its owners agreed
  // on. FAILED_PRECONDITION where the daemons stand at different steps (a step in flight: export
  // once every rank pulled the newest version).
  absl::StatusOr<JobState> ExportState();
  // A whole state cut into each daemon's part, each imported by its daemon (in daemon order). The
  // whole state is checked first (every field of every tensor once, with its type and shape:
  // INVALID_ARGUMENT naming it), so a state that a daemon would refuse for its shape reaches none.
  absl::Status ImportState(const JobState& state);
  // The daemons' transports, "addr=name" each, comma-separated.
  std::string transports() const;
  // Each owner's transport and its traits, by owner index (Client::transport_traits).
  std::vector<Client::OwnerTransport> transport_traits() const;

 private:
  struct Tensor {
    std::string name;
    int64_t rows = 0;
    int64_t cols = 0;
    int64_t grad_element_bytes = 0;
    std::vector<ShardPiece> pieces;
  };
  ShardedJob() = default;

  absl::StatusOr<const Tensor*> Find(const std::string& name) const;
  // Pulls of `names` from the owners, one PullMany per owner, in parallel: out[i][p] is piece p of
  // names[i], at `min_version`.
  absl::Status PullPieces(const PullManyTarget& target, std::chrono::milliseconds timeout,
                          std::vector<std::vector<Pulled>>* out);
  // Piece pulls of one tensor put together (their versions the same).
  absl::Status Assemble(const Tensor& t, const v1::ServeFormat& format, std::vector<Pulled>& pieces,
                        Pulled* out) const;

  std::string job_;
  int world_size_ = 1;
  bool pre_reduced_ = false;  // PUSH_MODE_PRE_REDUCED: rank o mod world_size pushes owner o's part
  ShardMap map_;
  std::vector<std::unique_ptr<Client>> clients_;  // by owner index (the sorted daemon list)
  std::vector<Tensor> tensors_;
  std::map<std::string, int> index_;
};

}  // namespace paramd
