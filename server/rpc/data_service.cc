#include "server/rpc/data_service.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/daemon_instance.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "server/rpc/pull_stream.h"
#include "server/rpc/read_stream.h"
#include "server/rpc/rpc_outcome.h"

namespace paramd {
namespace {

// Reads chunks one at a time and stores each on arrival (a chunk of marks mark by mark); the first
// bad one ends the stream.
class PushReactor final : public ReadStream<v1::PushChunk> {
 public:
  PushReactor(Daemon* daemon, absl::StatusOr<Caller> caller, grpc::ByteBuffer* response)
      : ReadStream(daemon, "Push", response) {
    Begin(std::move(caller));
  }

 private:
  absl::Status Take(v1::PushChunk& chunk) override {
    if (ended_) {
      return absl::InvalidArgumentError(
          "a push chunk after the stream's last one (PushChunk.last is set on the last chunk "
          "only)");
    }
    ended_ = chunk.last();
    return Store(chunk);
  }

  absl::Status Finished() override {
    if (!ended_) return CutOff();
    SetResponse(response_);
    return absl::OkStatus();
  }

  void Drop() override { job_.reset(); }

  // A stream that ended before its last chunk (PushChunk.last): what arrived whole stands.
  absl::Status CutOff() const {
    return absl::DataLossError(absl::StrCat(
        "the push stream ended before its last chunk (PushChunk.last), after ",
        response_.chunks_stored() + response_.chunks_duplicate(),
        " whole chunks: it was cut off (or the client predates PushChunk.last); the chunks that "
        "arrived whole are kept, and pushing again is safe (they are acknowledged as duplicates)"));
  }

  // Stores the chunk read, or each of its marks (PushChunk.marks) as a chunk of its own.
  absl::Status Store(v1::PushChunk& chunk) {
    PARAMD_RETURN_IF_ERROR(daemon()->CheckServing());
    if (!chunk.has_marks()) return StoreOne(chunk);
    if (chunk.marks().entries().empty()) {
      return absl::InvalidArgumentError(
          "a push chunk of marks names none; send at least one InPlaceMarks.Entry");
    }
    v1::PushChunk one;
    one.set_job(chunk.job());
    one.set_rank(chunk.rank());
    one.set_step(chunk.step());
    one.set_kind(chunk.kind());
    for (v1::InPlaceMarks::Entry& entry : *chunk.mutable_marks()->mutable_entries()) {
      one.set_tensor(std::move(*entry.mutable_tensor()));
      one.set_offset(entry.offset());
      one.mutable_in_place()->Swap(entry.mutable_mark());
      PARAMD_RETURN_IF_ERROR(StoreOne(one));
    }
    return absl::OkStatus();
  }

  absl::Status StoreOne(const v1::PushChunk& chunk) {
    const int64_t limit = daemon()->config().max_chunk_bytes();
    if (static_cast<int64_t>(chunk.data().size()) > limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "chunk of ", chunk.data().size(), " bytes exceeds this daemon's max_chunk_bytes (", limit,
          "); split pushes into chunks of at most that size"));
    }
    if (chunk.has_in_place() && chunk.in_place().instance() != 0 &&
        chunk.in_place().instance() != daemon()->instance()) {
      return WithReason(
          absl::FailedPreconditionError(absl::StrCat(
              "the slot place of tensor ", Quoted(chunk.tensor()), " ", kFromAnotherDaemonStart,
              ", whose memory this one does not see; ask Attach for the step's slot places again "
              "and "
              "write the bytes there")),
          v1::ERROR_REASON_ANOTHER_DAEMON_START);
    }
    if (job_ == nullptr || job_->name() != chunk.job()) {
      PARAMD_RETURN_IF_ERROR(caller().MayUseJob(chunk.job()));
      absl::StatusOr<std::shared_ptr<Job>> job = daemon()->registry().Find(chunk.job());
      if (!job.ok()) return job.status();
      job_ = *std::move(job);
    }
    absl::StatusOr<ChunkBuffer::Stored> stored = job_->Push(chunk);
    if (!stored.ok()) {
      return Reworded(stored.status(),
                      absl::StrCat(stored.status().message(), " (tensor ", Quoted(chunk.tensor()),
                                   ", rank ", chunk.rank(), ", step ", chunk.step(), ")"));
    }
    if (*stored == ChunkBuffer::Stored::kNew) {
      response_.set_chunks_stored(response_.chunks_stored() + 1);
      // Counted under the transport the rank uses where the bytes were written in its memory,
      // else under the one whose memory it is, or that carries them in its messages.
      std::optional<Memory> memory;
      if (chunk.has_in_place()) {
        memory =
            chunk.in_place().memory() == v1::PLACE_MEMORY_DEVICE ? Memory::kDevice : Memory::kHost;
      }
      daemon()->metrics().Pushed(
          daemon()->transports().LabelFor(job_->TrainerTransportOf(chunk.rank()), memory),
          memory.has_value() ? chunk.in_place().bytes()
                             : static_cast<int64_t>(chunk.data().size()));
    } else {
      response_.set_chunks_duplicate(response_.chunks_duplicate() + 1);
    }
    return absl::OkStatus();
  }

  v1::PushResponse response_;
  std::shared_ptr<Job> job_;
  bool ended_ = false;  // the last chunk (PushChunk.last) was read
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* DataService::Push(grpc::CallbackServerContext* context,
                                                             grpc::ByteBuffer* response) {
  return new PushReactor(daemon_, access_->Identify(*context), response);
}

grpc::ServerUnaryReactor* DataService::Commit(grpc::CallbackServerContext* context,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  return ServeUnary<v1::CommitRequest, v1::CommitResponse>(
      context, daemon_, *access_, "Commit", request, response,
      [](const Caller& caller, const auto& r) { return caller.MayUseJob(r.job()); },
      [this](const auto& r, auto* out) { return DoCommit(r, out); });
}

grpc::ServerUnaryReactor* DataService::Attach(grpc::CallbackServerContext* context,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  return ServeUnary<v1::AttachRequest, v1::AttachResponse>(
      context, daemon_, *access_, "Attach", request, response,
      [](const Caller& caller, const v1::AttachRequest& r) {
        return r.job().empty() ? caller.MayProbe() : caller.MayUseJob(r.job());
      },
      [this](const v1::AttachRequest& r, v1::AttachResponse* out) {
        const absl::Status status = DoAttach(r, out);
        out->set_instance(daemon_->instance());
        return status;
      });
}

grpc::ServerUnaryReactor* DataService::Release(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) {
  Caller caller;
  return ServeUnary<v1::ReleaseRequest, v1::ReleaseResponse>(
      context, daemon_, *access_, "Release", request, response,
      [&caller](const Caller& identified, const v1::ReleaseRequest&) {
        caller = identified;
        return caller.MayProbe();
      },
      [this, &caller](const v1::ReleaseRequest& r, v1::ReleaseResponse* out) {
        // A lease of a job the caller may not use is left as it is, as an unknown one would be.
        out->set_released(daemon_->leases().Release(
            std::vector<uint64_t>(r.leases().begin(), r.leases().end()),
            [&caller](const std::string& job) { return caller.MayUseJob(job).ok(); }));
        return absl::OkStatus();
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* DataService::Pull(grpc::CallbackServerContext* context,
                                                              const grpc::ByteBuffer* request) {
  return StartPull(daemon_, access_->Identify(*context), request);
}

absl::Status DataService::DoCommit(const v1::CommitRequest& request, v1::CommitResponse* response) {
  PARAMD_RETURN_IF_ERROR(daemon_->CheckServing());
  PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, daemon_->registry().Find(request.job()));
  PARAMD_ASSIGN_OR_RETURN(CommitOutcome outcome, job->Commit(request));
  response->set_committed_ranks(outcome.committed_ranks);
  response->set_step_started(outcome.step_started);
  if (outcome.work) daemon_->StartStep(job, *outcome.work);
  return absl::OkStatus();
}

absl::Status DataService::DoAttach(const v1::AttachRequest& request, v1::AttachResponse* response) {
  PARAMD_RETURN_IF_ERROR(daemon_->CheckServing());
  return daemon_->transports().Attach(request, response);
}

}  // namespace paramd
