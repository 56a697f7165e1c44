#include "server/rpc/pull_stream.h"

#include <grpcpp/support/proto_buffer_writer.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/borrowed_bytes.h"
#include "common/status_macros.h"
#include "server/rpc/pull_header.h"
#include "server/rpc/pull_queue.h"
#include "server/rpc/write_stream.h"

namespace paramd {
namespace {

// Headers in one PullChunk at most (about 100 bytes each).
constexpr int kMaxBatchedHeaders = 1024;

// The tensor being written: its served version's lease, and the bytes streamed after its header
// (none where the header carries a place), cut into data messages.
class StreamedTensor {
 public:
  // Takes `pulled`'s lease and bytes; nothing is left to stream where it is placed.
  void Take(PulledTensor pulled) {
    served_ = std::move(pulled.served);
    bytes_ = pulled.bytes;
    placed_ = pulled.placed();
    offset_ = placed_ ? size() : 0;
  }
  bool placed() const { return placed_; }
  int64_t size() const { return static_cast<int64_t>(bytes_->size()); }
  bool more() const { return offset_ < size(); }

  // The next data message, of at most `max_bytes`: PullChunk field 2 (`data`) as a slice over the
  // leased buffer, which stays alive and unchanged until the call is done.
  void Next(int64_t max_bytes, grpc::ByteBuffer* message) {
    const int64_t length = std::min(size() - offset_, max_bytes);
    *message = WithBorrowedBytesField(std::string(), 2, bytes_->data() + offset_,
                                      static_cast<size_t>(length));
    offset_ += length;
  }

 private:
  std::shared_ptr<const ServedTensor> served_;  // the lease
  const HostBuffer* bytes_ = nullptr;
  bool placed_ = false;  // the header carries a place (no data chunks follow)
  int64_t offset_ = 0;
};

class PullReactor final : public WriteStream<v1::PullRequest> {
 public:
  PullReactor(Daemon* daemon, const absl::StatusOr<Caller>& caller, const grpc::ByteBuffer* raw)
      : WriteStream(daemon, "Pull", "the puller went away",
                    "pull cancelled or its deadline passed while waiting") {
    Begin(caller, raw);
  }

 private:
  // Waiting: a waiter for each tensor whose version is not published yet, and a place among
  // max_waiting_pulls, kept only while one is: a pull that finds them all published does not
  // wait, and is not refused.
  absl::Status Start(const v1::PullRequest& request) override {
    PARAMD_ASSIGN_OR_RETURN(PullAsk ask, CheckPull(*daemon(), request));
    ask_ = std::move(ask);
    std::optional<CountedLimit::Ticket> waiting = daemon()->waiting_pulls().TryTake();
    bool refused = false;
    {
      absl::MutexLock lock(&mu_);
      queue_ = PullQueue(ask_.tensors.size());
      for (size_t i = 0; i < ask_.tensors.size(); ++i) {
        const uint64_t id =
            ask_.job->AddWaiter(ask_.tensors[i], ask_.min_version, [this, i] { OnReady(i); });
        if (id == 0) {
          queue_.Ready(i);
        } else {
          queue_.Wait(i, id);
        }
      }
      refused = queue_.waiting() && !waiting.has_value();
      if (queue_.waiting() && waiting.has_value()) waiting_ = *std::move(waiting);
    }
    if (refused) {
      return absl::ResourceExhaustedError(absl::StrCat(
          daemon()->waiting_pulls().limit(),
          " pulls wait for a version already, this daemon's max_waiting_pulls; pull after the "
          "step published, or raise max_waiting_pulls"));
    }
    Pump();
    return absl::OkStatus();
  }

  // Once `i`'s waiter fired, this call may end on another thread (a write in flight takes `i` into
  // its batch and finishes the call): the decision to write is taken under the same lock that
  // queued `i`, and nothing of this reactor is touched after it unless this thread writes.
  void OnReady(size_t i) {
    bool end = false;
    std::optional<PullQueue::Next> next;
    {
      absl::MutexLock lock(&mu_);
      queue_.Fired(i);
      if (!queue_.waiting()) waiting_.Reset();  // it waits no more
      if (EndingLocked()) {
        end = !queue_.waiting();  // the last callback on its way finishes the call
      } else {
        queue_.Ready(i);
        next = StartWriteLocked();
      }
    }
    if (end) {
      End(absl::CancelledError("pull cancelled while waiting"));
      return;
    }
    if (next.has_value()) WriteHeaders(ask_.tensors[next->index], next->last);
  }

  // A cancellation ends the call at once while nothing is written; a write under way ends it.
  bool IdleLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; }

  // Waiters not fired yet are removed; while one that fired has its OnReady on the way, that call
  // finishes instead (so no callback ever reaches a finished, deleted reactor).
  bool MayFinishLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.RemoveWaiters([this](uint64_t id) { return ask_.job->RemoveWaiter(id); });
  }

  // A pull that fails hands no place to its caller (the client drops what it read): the leases
  // this call took end now rather than at their expiry.
  void Drop(const absl::Status& status) override {
    std::vector<uint64_t> taken;
    {
      absl::MutexLock lock(&mu_);
      waiting_.Reset();
      taken.swap(taken_);
    }
    if (!status.ok()) daemon()->leases().Release(taken);
  }

  // Streaming: the tensor's next data chunk, or the next tensor once it is written whole.
  void Written() override {
    if (tensor_.more()) {
      tensor_.Next(daemon()->config().pull_chunk_bytes(), &buffer_);
      StartWrite(&buffer_);
      return;
    }
    if (!tensor_.placed()) {
      daemon()->metrics().Pulled(daemon()->transports().NameOf(std::nullopt), tensor_.size());
    }
    bool all = false;
    bool cancelled = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      all = queue_.all_begun();
      // A cancel that came during this write left the call's end to it (IdleLocked was false).
      cancelled = CancelledLocked();
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

  // Starts writing the next published tensor, unless a write is under way or none is ready.
  void Pump() {
    std::optional<PullQueue::Next> next;
    {
      absl::MutexLock lock(&mu_);
      next = StartWriteLocked();
    }
    if (next.has_value()) WriteHeaders(ask_.tensors[next->index], next->last);
  }

  // The next published tensor to write, marking a write under way; none while one is, or none is
  // ready, or the call ends.
  std::optional<PullQueue::Next> StartWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_) return std::nullopt;
    std::optional<PullQueue::Next> next = TakeReadyLocked();
    writing_ = next.has_value();
    return next;
  }

  // The next published tensor not begun, unless none is or the call ends.
  std::optional<PullQueue::Next> TakeReady() {
    absl::MutexLock lock(&mu_);
    return TakeReadyLocked();
  }
  std::optional<PullQueue::Next> TakeReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (EndingLocked()) return std::nullopt;
    return queue_.Take();
  }

  // Writes `tensor`'s header (and, where it is not placed, its bytes after it). A puller that
  // takes batches gets the headers of the tensors published already in the same message, up to
  // the first one that is not placed: a model's headers leave in a few writes, not one each.
  void WriteHeaders(int tensor, bool last) {
    v1::PullChunk message;
    if (!MakeHeader(tensor, message.mutable_header())) return;
    for (int more = 0; ask_.batch && tensor_.placed() && !last && more < kMaxBatchedHeaders;
         ++more) {
      std::optional<PullQueue::Next> next = TakeReady();
      if (!next.has_value()) break;
      if (message.has_header()) {
        v1::PullHeader first = std::move(*message.mutable_header());
        *message.mutable_headers()->add_headers() = std::move(first);
      }
      last = next->last;
      if (!MakeHeader(ask_.tensors[next->index], message.mutable_headers()->add_headers())) return;
    }
    bool own_buffer = false;
    buffer_.Clear();  // the previous tensor's last message is written
    grpc::SerializationTraits<v1::PullChunk>::Serialize(message, &buffer_, &own_buffer);
    if (tensor_.placed() && last) {
      WriteLastAndFinish(&buffer_);  // the last header is the rest of the answer
      return;
    }
    StartWrite(&buffer_);
  }

  // Fills `header` for `tensor`'s served version (server/rpc/pull_header.h) and keeps its lease
  // where it is placed; false when the call ended instead.
  bool MakeHeader(int tensor, v1::PullHeader* header) {
    absl::StatusOr<PulledTensor> pulled = MakePullHeader(*daemon(), ask_, tensor, header);
    if (!pulled.ok()) {
      End(pulled.status());
      return false;
    }
    if (pulled->placed()) {
      absl::MutexLock lock(&mu_);
      taken_.push_back(*pulled->lease);
    }
    tensor_.Take(*std::move(pulled));
    return true;
  }

  PullAsk ask_;                   // what the request asks, checked (its job, its tensors)
  CountedLimit::Ticket waiting_;  // among max_waiting_pulls, while the call waits for versions

  PullQueue queue_ ABSL_GUARDED_BY(mu_) = PullQueue(0);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;         // a tensor is being written
  std::vector<uint64_t> taken_ ABSL_GUARDED_BY(mu_);  // the leases of the places this call sent

  StreamedTensor tensor_;    // the tensor being written
  grpc::ByteBuffer buffer_;  // the message being written
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartPull(Daemon* daemon,
                                                      const absl::StatusOr<Caller>& caller,
                                                      const grpc::ByteBuffer* request) {
  return new PullReactor(daemon, caller, request);
}

}  // namespace paramd
