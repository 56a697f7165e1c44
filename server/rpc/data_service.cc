#include "server/rpc/data_service.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/borrowed_bytes.h"
#include "common/daemon_instance.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "server/rpc/pull_header.h"
#include "server/rpc/read_stream.h"
#include "server/rpc/rpc_outcome.h"

namespace paramd {
namespace {

// Headers in one PullChunk at most (about 100 bytes each).
constexpr int kMaxBatchedHeaders = 1024;

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

// Waits for the versions (without holding a thread), then streams, tensor by tensor in the order
// they are published, a header and the bytes of the served version it leases: the shared pointer
// keeps those bytes alive and unchanged while they are written. What the request asks and each
// header are built apart (server/rpc/pull_header.h); this is the waiting and the writing.
class PullReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PullReactor(Daemon* daemon, const absl::StatusOr<Caller>& caller, const grpc::ByteBuffer* raw)
      : daemon_(daemon) {
    v1::PullRequest request;
    absl::Status status = caller.status();
    if (status.ok()) status = ParseMessage(raw, &request);
    if (status.ok()) status = caller->MayUseJob(request.job());
    if (status.ok()) status = Prepare(request);
    if (!status.ok()) {
      End(status);
      return;
    }
    // A place among max_waiting_pulls, kept only where a version is not published yet: a pull
    // that finds them all there does not wait, and is not refused.
    std::optional<CountedLimit::Ticket> waiting = daemon_->waiting_pulls().TryTake();
    bool refused = false;
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < ask_.tensors.size(); ++i) {
        const uint64_t id =
            ask_.job->AddWaiter(ask_.tensors[i], ask_.min_version, [this, i] { OnReady(i); });
        if (id == 0) {
          ready_.push_back(i);
        } else {
          waiters_.emplace(i, id);
        }
      }
      refused = !waiters_.empty() && !waiting.has_value();
      if (!waiters_.empty() && waiting.has_value()) waiting_ = *std::move(waiting);
    }
    if (refused) {
      End(absl::ResourceExhaustedError(absl::StrCat(
          daemon_->waiting_pulls().limit(),
          " pulls wait for a version already, this daemon's max_waiting_pulls; pull after the "
          "step published, or raise max_waiting_pulls")));
      return;
    }
    Pump();
  }

  void OnCancel() override {
    bool busy = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      busy = writing_;  // then the write's OnWriteDone ends the call
    }
    if (!busy) End(absl::CancelledError("pull cancelled or its deadline passed while waiting"));
  }

  void OnWriteDone(bool ok) override {
    bool cancelled = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled = cancelled_;
    }
    if (!ok || cancelled) {
      End(absl::CancelledError("the puller went away"));
      return;
    }
    if (offset_ < static_cast<int64_t>(bytes_->size())) {
      WriteNext();
      return;
    }
    if (!placed_)
      daemon_->metrics().Pulled(daemon_->transports().NameOf(std::nullopt), bytes_->size());
    bool all = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      all = begun_ == ask_.tensors.size();
      // A cancel that came during this write left the call's end to it (OnCancel saw writing_).
      cancelled = cancelled_;
    }
    if (cancelled) {
      End(absl::CancelledError("the puller went away"));
      return;
    }
    if (all) {
      End(absl::OkStatus());
      return;
    }
    Pump();
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Prepare(const v1::PullRequest& request) {
    PARAMD_RETURN_IF_ERROR(daemon_->CheckServing());
    PARAMD_ASSIGN_OR_RETURN(stream_, daemon_->OpenStream("Pull"));
    PARAMD_ASSIGN_OR_RETURN(PullAsk ask, CheckPull(*daemon_, request));
    ask_ = std::move(ask);
    return absl::OkStatus();
  }

  // Once `i`'s waiter fired, this call may end on another thread (a write in flight takes `i` into
  // its batch and finishes the call): the decision to write is taken under the same lock that
  // queued `i`, and nothing of this reactor is touched after it unless this thread writes.
  void OnReady(size_t i) {
    bool end = false;
    std::optional<std::pair<size_t, bool>> next;
    {
      absl::MutexLock lock(&mu_);
      waiters_.erase(i);
      if (waiters_.empty()) waiting_.Reset();  // it waits no more
      if (cancelled_ || ending_) {
        end = waiters_.empty();  // the last callback on its way finishes the call
      } else {
        ready_.push_back(i);
        next = StartWriteLocked();
      }
    }
    if (end) {
      End(absl::CancelledError("pull cancelled while waiting"));
      return;
    }
    if (next.has_value()) Begin(ask_.tensors[next->first], next->second);
  }

  // Starts writing the next published tensor, unless a write is under way or none is ready.
  void Pump() {
    std::optional<std::pair<size_t, bool>> next;
    {
      absl::MutexLock lock(&mu_);
      next = StartWriteLocked();
    }
    if (next.has_value()) Begin(ask_.tensors[next->first], next->second);
  }

  // The next published tensor to write (its ask_.tensors index, and whether it is the call's last),
  // marking a write under way; none while one is, or none is ready, or the call ends.
  std::optional<std::pair<size_t, bool>> StartWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_) return std::nullopt;
    std::optional<std::pair<size_t, bool>> next = TakeReadyLocked();
    writing_ = next.has_value();
    return next;
  }

  // The next published tensor not begun (its ask_.tensors index, and whether it is the call's
  // last), unless none is or the call ends.
  std::optional<std::pair<size_t, bool>> TakeReady() {
    absl::MutexLock lock(&mu_);
    return TakeReadyLocked();
  }
  std::optional<std::pair<size_t, bool>> TakeReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancelled_ || ending_ || ready_.empty()) return std::nullopt;
    const size_t i = ready_.front();
    ready_.pop_front();
    return std::make_pair(i, ++begun_ == ask_.tensors.size());
  }

  // Writes `tensor`'s header (and, where it is not placed, its bytes after it). A puller that
  // takes batches gets the headers of the tensors published already in the same message, up to
  // the first one that is not placed: a model's headers leave in a few writes, not one each.
  void Begin(int tensor, bool last) {
    v1::PullChunk message;
    if (!MakeHeader(tensor, message.mutable_header())) return;
    for (int more = 0; ask_.batch && placed_ && !last && more < kMaxBatchedHeaders; ++more) {
      std::optional<std::pair<size_t, bool>> next = TakeReady();
      if (!next.has_value()) break;
      if (message.has_header()) {
        v1::PullHeader first = std::move(*message.mutable_header());
        *message.mutable_headers()->add_headers() = std::move(first);
      }
      last = next->second;
      if (!MakeHeader(ask_.tensors[next->first], message.mutable_headers()->add_headers())) return;
    }
    bool own_buffer = false;
    buffer_.Clear();  // the previous tensor's last message is written
    grpc::SerializationTraits<v1::PullChunk>::Serialize(message, &buffer_, &own_buffer);
    if (placed_ && last) {
      // The last header is the rest of the answer: written and finished in one batch.
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      StartWriteAndFinish(&buffer_, grpc::WriteOptions(), grpc::Status::OK);
      return;
    }
    StartWrite(&buffer_);
  }

  // Fills `header` for `tensor`'s served version (server/rpc/pull_header.h) and keeps its lease
  // where it is placed; false when the call ended instead.
  bool MakeHeader(int tensor, v1::PullHeader* header) {
    absl::StatusOr<PulledTensor> pulled = MakePullHeader(*daemon_, ask_, tensor, header);
    if (!pulled.ok()) {
      End(pulled.status());
      return false;
    }
    served_ = std::move(pulled->served);
    bytes_ = pulled->bytes;
    placed_ = pulled->placed();
    offset_ = placed_ ? static_cast<int64_t>(bytes_->size()) : 0;  // no data chunks follow
    if (placed_) {
      absl::MutexLock lock(&mu_);
      taken_.push_back(*pulled->lease);
    }
    return true;
  }

  void WriteNext() {
    const int64_t size = static_cast<int64_t>(bytes_->size());
    const int64_t length = std::min(size - offset_, daemon_->config().pull_chunk_bytes());
    // PullChunk field 2 (`data`) as a slice over the leased buffer, which stays alive and
    // unchanged until this call is done.
    buffer_ = WithBorrowedBytesField(std::string(), 2, bytes_->data() + offset_,
                                     static_cast<size_t>(length));
    offset_ += length;
    StartWrite(&buffer_);
  }

  // Finishes the call once, with the status of the first caller. Waiters not fired yet are
  // removed; while one that fired has its OnReady on the way, that call finishes instead (so no
  // callback ever reaches a finished, deleted reactor).
  void End(const absl::Status& status) {
    absl::Status final_status;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (!ending_) {
        ending_ = true;
        end_status_ = status;
      }
      for (auto it = waiters_.begin(); it != waiters_.end();) {
        it = ask_.job->RemoveWaiter(it->second) ? waiters_.erase(it) : std::next(it);
      }
      if (!waiters_.empty()) return;
      finished_ = true;
      final_status = end_status_;
      waiting_.Reset();
      stream_.Reset();
      // A pull that fails hands no place to its caller (the client drops what it read): the
      // leases this call took end now rather than at their expiry.
      if (!final_status.ok()) daemon_->leases().Release(taken_);
    }
    CountRpcError(daemon_, "Pull", final_status);
    Finish(ToGrpcStatus(final_status));
  }

  Daemon* const daemon_;
  CountedLimit::Ticket stream_;   // among max_open_streams
  CountedLimit::Ticket waiting_;  // among max_waiting_pulls, while the call waits for versions
  PullAsk ask_;                   // what the request asks, checked (its job, its tensors)

  absl::Mutex mu_;
  // ask_.tensors index -> the job's waiter, not fired yet
  std::map<size_t, uint64_t> waiters_ ABSL_GUARDED_BY(mu_);
  std::deque<size_t> ready_ ABSL_GUARDED_BY(mu_);  // published, not begun
  size_t begun_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // End was called; end_status_ is the call's status
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;        // Finish (or StartWriteAndFinish) was called
  std::vector<uint64_t> taken_ ABSL_GUARDED_BY(mu_);  // the leases of the places this call sent

  // The tensor being written.
  std::shared_ptr<const ServedTensor> served_;  // the lease
  const HostBuffer* bytes_ = nullptr;
  bool placed_ = false;  // the header carries a place (no data chunks follow)
  int64_t offset_ = 0;
  grpc::ByteBuffer buffer_;  // the message being written
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
  return new PullReactor(daemon_, access_->Identify(*context), request);
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
