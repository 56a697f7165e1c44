#include "transport/nccl/communicator.h"

#include <stdlib.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"

namespace paramd {
namespace {

absl::Status NcclStatus(ncclResult_t result, const std::string& call) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  const absl::StatusCode code = result == ncclInvalidArgument || result == ncclInvalidUsage
                                    ? absl::StatusCode::kInvalidArgument
                                : result == ncclRemoteError ? absl::StatusCode::kUnavailable
                                                            : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(call, ": ", ncclGetErrorString(result)));
}

constexpr auto kPoll = std::chrono::microseconds(50);

}  // namespace

void DefaultNcclEnvironment() { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); }

absl::StatusOr<std::string> NewNcclUniqueId() {
  ncclUniqueId id;
  if (absl::Status s = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) return s;
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::string_view unique_id, int nranks, int rank, int device,
    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm = Start(unique_id, nranks, rank, device);
  if (!comm.ok()) return comm.status();
  if (absl::Status s = (*comm)->Joined(deadline); !s.ok()) return s;
  return comm;
}

absl::Status NcclCommunicator::Joined(std::chrono::steady_clock::time_point deadline) {
  if (joined_) return absl::OkStatus();
  if (!usable()) return status_;
  DeviceScope scope(device_);
  if (!scope.status().ok()) return scope.status();
  absl::Status s = Settle(
      deadline, absl::StrCat("joining a communicator of ", nranks_, " ranks as rank ", rank_));
  joined_ = s.ok();
  return s;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Start(
    std::string_view unique_id, int nranks, int rank, int device) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("an NCCL unique id is ", sizeof(id.internal),
                                                   " bytes, not ", unique_id.size()));
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", nranks, " is not a rank of an NCCL communicator"));
  }
  unique_id.copy(id.internal, sizeof(id.internal));
  DefaultNcclEnvironment();
  DeviceScope scope(device);
  if (!scope.status().ok()) return scope.status();
  auto comm = std::unique_ptr<NcclCommunicator>(new NcclCommunicator(nranks, rank, device));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait is ours, against a deadline
  if (absl::Status s = NcclStatus(ncclCommInitRankConfig(&comm->comm_, nranks, id, rank, &config),
                                  "ncclCommInitRankConfig");
      !s.ok()) {
    return comm->Fail(s);
  }
  return comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;
  // Abort, not finalize: finalizing waits for the peer, which may be gone; abort frees the same
  // resources without waiting for anyone.
  DeviceScope scope(device_);
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  if (status_.ok()) status_ = status;
  Abort();
  return status_;
}

void NcclCommunicator::Abort() {
  if (comm_ == nullptr) return;
  DeviceScope scope(device_);
  ncclCommAbort(comm_);
  comm_ = nullptr;
  if (status_.ok()) status_ = absl::CancelledError("the NCCL communicator was aborted");
}

absl::Status NcclCommunicator::Settle(std::chrono::steady_clock::time_point deadline,
                                      const std::string& what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    if (absl::Status s = NcclStatus(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
        !s.ok()) {
      return Fail(s);
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return Fail(NcclStatus(state, what));
    if (std::chrono::steady_clock::now() >= deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(what,
                       ": not done by the deadline (a peer did not join or answer); the "
                       "communicator was aborted")));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

absl::Status NcclCommunicator::SendRecv(const void* send, size_t send_bytes, void* recv,
                                        size_t recv_bytes, int peer, cudaStream_t stream) {
  if (!usable()) return status_.ok() ? absl::FailedPreconditionError("no communicator") : status_;
  if (peer < 0 || peer >= nranks_) {
    return absl::InvalidArgumentError(absl::StrCat("peer ", peer, " of ", nranks_, " ranks"));
  }
  DeviceScope scope(device_);
  if (!scope.status().ok()) return scope.status();
  // A call made while an earlier one is in progress is refused by a non-blocking communicator.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  absl::Status status = NcclStatus(ncclGroupStart(), "ncclGroupStart");
  if (status.ok() && send_bytes > 0) {
    status = NcclStatus(ncclSend(send, send_bytes, ncclUint8, peer, comm_, stream), "ncclSend");
  }
  if (status.ok() && recv_bytes > 0) {
    status = NcclStatus(ncclRecv(recv, recv_bytes, ncclUint8, peer, comm_, stream), "ncclRecv");
  }
  const absl::Status ended = NcclStatus(ncclGroupEnd(), "ncclGroupEnd");
  if (!status.ok()) return Fail(status);
  if (!ended.ok()) return Fail(ended);
  return Settle(deadline, "queueing a send/receive");
}

absl::Status NcclCommunicator::Queue(std::span<const Piece> pieces, bool send, int peer,
                                     cudaStream_t stream) {
  if (!usable()) return status_.ok() ? absl::FailedPreconditionError("no communicator") : status_;
  if (peer < 0 || peer >= nranks_) {
    return absl::InvalidArgumentError(absl::StrCat("peer ", peer, " of ", nranks_, " ranks"));
  }
  DeviceScope scope(device_);
  if (!scope.status().ok()) return scope.status();
  absl::Status status = NcclStatus(ncclGroupStart(), "ncclGroupStart");
  for (const Piece& piece : pieces) {
    if (!status.ok()) break;
    if (piece.bytes == 0) continue;
    status = send ? NcclStatus(ncclSend(piece.data, piece.bytes, ncclUint8, peer, comm_, stream),
                               "ncclSend")
                  : NcclStatus(ncclRecv(piece.data, piece.bytes, ncclUint8, peer, comm_, stream),
                               "ncclRecv");
  }
  const absl::Status ended = NcclStatus(ncclGroupEnd(), "ncclGroupEnd");
  if (!status.ok()) return Fail(status);
  if (!ended.ok()) return Fail(ended);
  // Not settled here: the group's first use connects the two ranks, which needs the peer's side
  // queued too, and the peer may queue it only once told (Wait settles it).
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Wait(cudaStream_t stream, std::chrono::milliseconds timeout) {
  if (!usable()) return status_.ok() ? absl::FailedPreconditionError("no communicator") : status_;
  DeviceScope scope(device_);
  if (!scope.status().ok()) return scope.status();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      return Fail(NcclStatus(state, "a transfer on the NCCL communicator"));
    }
    // Done once the queued group settled (Queue leaves it in progress) and the stream ran it.
    const cudaError_t done = state == ncclSuccess ? cudaStreamQuery(stream) : cudaErrorNotReady;
    if (done == cudaSuccess) return absl::OkStatus();
    if (done != cudaErrorNotReady) return Fail(CudaStatus(done, "cudaStreamQuery"));
    if (std::chrono::steady_clock::now() >= deadline) {
      return Fail(absl::DeadlineExceededError(
          "a transfer on the NCCL communicator did not end by the deadline (its peer left or "
          "stopped answering); the communicator was aborted"));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

}  // namespace paramd
