// The life of a server stream written message by message (Pull, ExportState), written once: the
// request parsed, the caller allowed its job, the daemon serving, a place among max_open_streams,
// then Start; each write's completion handed to Written. A write that fails, or that completes
// after the call was cancelled, ends the call as CANCELLED; a cancellation while the stream is
// idle (IdleLocked: Pull waiting for a version) ends it at once. End finishes the call exactly
// once: it may be held back (MayFinishLocked: a callback of the stream's on its way finishes it
// instead), lets go of what the call holds (Drop) before the answer, and counts a failure.
//
// One mutex, mu_, guards the ending and whatever the derived stream keeps beside it; the hooks
// named ...Locked run under it, the others without it.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "server/daemon.h"
#include "server/rpc/access.h"
#include "server/rpc/rpc_outcome.h"

namespace paramd {

template <typename Request>
class WriteStream : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  void OnWriteDone(bool ok) final {
    bool cancelled = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled = cancelled_;
    }
    if (!ok || cancelled) {
      End(absl::CancelledError(gone_));
      return;
    }
    Written();
  }

  void OnCancel() final {
    bool idle = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      idle = IdleLocked();  // else the write under way (or the next) ends the call
    }
    if (idle) End(absl::CancelledError(cancelled_idle_));
  }

  void OnDone() final { delete this; }

 protected:
  // `method` names the call in counts and refusals ("Pull"); `gone` is the status message of a
  // call whose reader went away during a write, `cancelled_idle` of one cancelled while idle.
  WriteStream(Daemon* daemon, const char* method, std::string gone, std::string cancelled_idle)
      : daemon_(daemon),
        method_(method),
        gone_(std::move(gone)),
        cancelled_idle_(std::move(cancelled_idle)) {}
  virtual ~WriteStream() = default;

  // The derived constructor's last call: the caller's token and its right to the request's job
  // checked, the request parsed, a stream place taken, then Start (or the call ended with why
  // not). Nothing of this object is touched after Start returned OK.
  void Begin(const absl::StatusOr<Caller>& caller, const grpc::ByteBuffer* raw) {
    Request request;
    absl::Status status = caller.status();
    if (status.ok()) status = ParseMessage(raw, &request);
    if (status.ok()) status = caller->MayUseJob(request.job());
    if (status.ok()) status = daemon_->CheckServing();
    if (status.ok()) {
      absl::StatusOr<CountedLimit::Ticket> stream = daemon_->OpenStream(method_);
      if (stream.ok()) {
        stream_ = *std::move(stream);
      } else {
        status = stream.status();
      }
    }
    if (status.ok()) status = Start(request);
    if (!status.ok()) End(status);
  }

  // The request, checked as Begin says: starts writing (or waiting); an error ends the call.
  virtual absl::Status Start(const Request& request) = 0;
  // A write completed and the call goes on: the next write, or End.
  virtual void Written() = 0;
  // Whether a cancellation may end the call at once: no write is under way or about to start,
  // and none will start unless the stream hears of it (under mu_). By default a cancellation is
  // noticed where the next write completes.
  virtual bool IdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return false; }
  // End's chance to hold the finish back (under mu_, ending: true from then on): false while a
  // callback of the stream's is on its way, which then calls End itself.
  virtual bool MayFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return true; }
  // Lets go of what the call holds (a job's export, leases of a failed pull), with the answer
  // rather than when gRPC gets round to OnDone. Runs once, on the finishing thread, without mu_.
  virtual void Drop(const absl::Status& /*status*/) {}

  // Finishes the call once, with the status of End's first caller.
  void End(const absl::Status& status) {
    absl::Status final_status;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (!ending_) {
        ending_ = true;
        end_status_ = status;
      }
      if (!MayFinishLocked()) return;
      finished_ = true;
      final_status = end_status_;
    }
    Drop(final_status);
    stream_.Reset();
    CountRpcError(daemon_, method_, final_status);
    Finish(ToGrpcStatus(final_status));
  }

  // Writes the call's last message and finishes it OK in the same batch (End does nothing then).
  void WriteLastAndFinish(grpc::ByteBuffer* message) {
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
    }
    StartWriteAndFinish(message, grpc::WriteOptions(), grpc::Status::OK);
  }

  // The call was cancelled (its reader went away, or its deadline passed).
  bool CancelledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_; }
  // The call was cancelled or End was called: it starts nothing more.
  bool EndingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ || ending_; }

  Daemon* daemon() const { return daemon_; }

  absl::Mutex mu_;

 private:
  Daemon* const daemon_;
  const char* const method_;
  const std::string gone_;
  const std::string cancelled_idle_;
  CountedLimit::Ticket stream_;  // among max_open_streams
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;  // End was called; end_status_ is the call's status
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish (or StartWriteAndFinish) was called
};

}  // namespace paramd
