// The life of a client stream read message by message (Push, ImportState), written once: the
// caller identified by its token, a place among max_open_streams, each message parsed and handed
// to Take, the client's end to Finished, and one End that lets go of what the call holds before
// its answer (Drop), counts a failure and finishes the call.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <utility>

#include "absl/status/statusor.h"
#include "common/grpc_status.h"
#include "server/daemon.h"
#include "server/rpc/access.h"
#include "server/rpc/rpc_outcome.h"

namespace paramd {

template <typename Message>
class ReadStream : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  void OnReadDone(bool ok) final {
    if (!ok) {  // the client finished writing (or the call ended)
      End(Finished());
      return;
    }
    absl::Status status = ParseMessage(&buffer_, &message_);
    if (status.ok()) status = Take(message_);
    if (!status.ok()) {
      End(status);
      return;
    }
    StartRead(&buffer_);
  }

  void OnDone() final { delete this; }

 protected:
  // `method` names the call in counts and refusals ("Push").
  ReadStream(Daemon* daemon, const char* method, grpc::ByteBuffer* raw_response)
      : daemon_(daemon), method_(method), raw_response_(raw_response) {}
  virtual ~ReadStream() = default;

  // The derived constructor's last call: the caller's token checked, a stream place taken, the
  // first read started (or the call ended with why not).
  void Begin(absl::StatusOr<Caller> caller) {
    if (!caller.ok()) {
      End(caller.status());
      return;
    }
    caller_ = *std::move(caller);
    absl::StatusOr<CountedLimit::Ticket> stream = daemon_->OpenStream(method_);
    if (!stream.ok()) {
      End(stream.status());
      return;
    }
    stream_ = *std::move(stream);
    StartRead(&buffer_);
  }

  // Each message read; an error ends the call with it.
  virtual absl::Status Take(Message& message) = 0;
  // The client finished writing: the call's status (an OK call's answer written with
  // SetResponse first).
  virtual absl::Status Finished() = 0;
  // Lets go of what the call holds (a job, staged bytes), with the answer rather than when gRPC
  // gets round to OnDone: a DeleteJob the caller sends next finds nothing of the call holding it.
  virtual void Drop() {}

  template <typename Response>
  void SetResponse(const Response& response) {
    SerializeMessage(response, raw_response_);
  }

  Daemon* daemon() const { return daemon_; }
  const Caller& caller() const { return caller_; }

 private:
  void End(const absl::Status& status) {
    Drop();
    stream_.Reset();
    CountRpcError(daemon_, method_, status);
    Finish(ToGrpcStatus(status));
  }

  Daemon* const daemon_;
  const char* const method_;
  grpc::ByteBuffer* const raw_response_;
  Caller caller_;  // whose token the call carries
  CountedLimit::Ticket stream_;
  grpc::ByteBuffer buffer_;  // the message as read
  Message message_;
};

}  // namespace paramd
