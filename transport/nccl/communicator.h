// The `nccl` transport's communicator (DESIGN.md §6): a trainer and a daemon backend on different
// GPUs of one node join a 2-rank NCCL communicator, whose unique id the daemon hands out at Attach.
// NCCL calls here never block without end: the communicator is made in NCCL's non-blocking mode,
// and every wait (its making, a transfer) is polled against a deadline, past which the
// communicator is aborted and the call answers DEADLINE_EXCEEDED. A communicator that failed or
// was aborted is not used again: the transport tears it down and makes another when the peer
// returns.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace paramd {

// NVLink SHARP (multicast) stays off unless the user set NCCL_NVLS_ENABLE: it reserves memory and
// multicast objects a 2-rank send/recv does not need. Call before the first communicator.
void DefaultNcclEnvironment();

// A new unique id's bytes (ncclGetUniqueId), to hand to the peer (Attach).
absl::StatusOr<std::string> NewNcclUniqueId();

class NcclCommunicator {
 public:
  // Rank `rank` of `nranks` on `device`, over the communicator of `unique_id` (its bytes, as
  // NewNcclUniqueId gave them). Returns once every rank joined; DEADLINE_EXCEEDED (the
  // communicator aborted) where they did not by `timeout`; INVALID_ARGUMENT for an id of another
  // size or ranks out of range.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      std::string_view unique_id, int nranks, int rank, int device,
      std::chrono::milliseconds timeout);
  // Starts joining, as Create does, without waiting: NCCL joins in the background, and Joined
  // waits for it. The same errors, but DEADLINE_EXCEEDED only from Joined.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Start(std::string_view unique_id,
                                                                 int nranks, int rank, int device);
  // Waits until every rank joined (OK at once once they have), or until `deadline`: then the
  // communicator is aborted and DEADLINE_EXCEEDED returned.
  absl::Status Joined(std::chrono::steady_clock::time_point deadline);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // Queues, in one NCCL group on `stream`, a send of `send_bytes` bytes at `send` to `peer` and a
  // receive of `recv_bytes` into `recv` from `peer` (either may be 0 bytes: that side is left
  // out). GPU memory on this communicator's device.
  absl::Status SendRecv(const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                        int peer, cudaStream_t stream);
  // One piece of GPU memory on this communicator's device.
  struct Piece {
    void* data;
    size_t bytes;
  };
  // Queues, in one NCCL group on `stream`, a send (`send`) or a receive of each piece to or from
  // `peer`, in order: the peer queues the other side of the same pieces in the same order. Returns
  // without waiting for the group to settle (its first use connects the ranks, which needs the
  // peer's side): Wait does, and no other call of this communicator may come before it.
  absl::Status Queue(std::span<const Piece> pieces, bool send, int peer, cudaStream_t stream);
  // Waits until `stream` ran what was queued on it, or `timeout` passed: then the communicator is
  // aborted (a peer that left takes its transfers with it) and DEADLINE_EXCEEDED is returned.
  absl::Status Wait(cudaStream_t stream, std::chrono::milliseconds timeout);

  // Ends every transfer in flight and makes the communicator unusable; no call blocks after it.
  void Abort();
  bool usable() const { return comm_ != nullptr && status_.ok(); }
  // Why the communicator is unusable (OK while it is usable).
  const absl::Status& status() const { return status_; }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int device() const { return device_; }

 private:
  NcclCommunicator(int nranks, int rank, int device)
      : nranks_(nranks), rank_(rank), device_(device) {}
  // Polls the communicator's asynchronous state until no call is in progress, or `deadline`.
  absl::Status Settle(std::chrono::steady_clock::time_point deadline, const std::string& what);
  absl::Status Fail(absl::Status status);

  const int nranks_;
  const int rank_;
  const int device_;
  ncclComm_t comm_ = nullptr;
  bool joined_ = false;  // every rank joined (Joined)
  absl::Status status_;
};

}  // namespace paramd
