#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/borrowed_bytes.h"
#include "common/grpc_status.h"
#include "paramd/v1/data.grpc.pb.h"
#include "transport/inline/inline.h"

namespace paramd {
namespace {

// The full name of Data.Push, for the raw-bytes writer below.
constexpr char kPushMethod[] = "/paramd.v1.Data/Push";

class InlineTransport final : public Transport {
 public:
  explicit InlineTransport(const TransportContext& context)
      : channel_(context.channel),
        stub_(v1::Data::NewStub(context.channel)),
        push_method_(kPushMethod, grpc::internal::RpcMethod::CLIENT_STREAMING, channel_),
        max_chunk_bytes_(context.max_chunk_bytes) {}

  std::string name() const override { return "inline"; }
  // The bytes travel in messages, from and into host memory.
  TransportTraits traits() const override { return {}; }

  absl::Status Push(const PushTarget& target, std::span<const PushItem> items,
                    Deadline deadline) override {
    // No bytes, no stream (a stream says where it ends with its last chunk, and has none).
    if (std::all_of(items.begin(), items.end(), [](const PushItem& i) { return i.data.empty(); })) {
      return absl::OkStatus();
    }
    grpc::ClientContext context;
    context.set_deadline(deadline);
    context.set_initial_metadata_corked(true);  // sent with the first chunk: one batch less
    v1::PushResponse response;
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel_.get(), push_method_,
                                                                      &context, &response));
    v1::PushChunk chunk;
    chunk.set_job(target.job);
    chunk.set_rank(target.rank);
    chunk.set_step(target.step);
    chunk.set_kind(target.kind);
    // The last chunk (PushChunk.last) goes with the stream's close.
    const PushItem* last_item = nullptr;
    for (const PushItem& item : items) {
      if (!item.data.empty()) last_item = &item;
    }
    bool open = true;
    for (const PushItem& item : items) {
      chunk.set_tensor(item.tensor);
      const int64_t size = static_cast<int64_t>(item.data.size());
      for (int64_t offset = 0; open && offset < size; offset += max_chunk_bytes_) {
        const int64_t length = std::min(max_chunk_bytes_, size - offset);
        const bool last = &item == last_item && offset + length == size;
        chunk.set_offset(offset);
        chunk.set_last(last);
        // The payload (field 7) is a slice over the caller's memory, which outlives the call.
        const grpc::ByteBuffer message = WithBorrowedBytesField(
            chunk.SerializeAsString(), 7, item.data.data() + offset, static_cast<size_t>(length));
        if (last) {
          writer->WriteLast(message, grpc::WriteOptions());
        } else {
          open = writer->Write(message);  // false: the daemon ended the stream; Finish says why
        }
      }
    }
    return FromGrpcStatus(writer->Finish());
  }

  absl::Status Pull(const PullTarget& target, Deadline deadline, Pulled* out) override {
    return PullStream(*stub_, PullRequestOf(target), deadline, out);
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Data::Stub> stub_;
  const grpc::internal::RpcMethod push_method_;
  const int64_t max_chunk_bytes_;
};

}  // namespace

v1::PullRequest PullRequestOf(const PullTarget& target) {
  v1::PullRequest request;
  request.set_job(target.job);
  request.set_tensor(target.tensor);
  *request.mutable_format() = target.format;
  request.set_min_version(target.min_version);
  return request;
}

absl::Status PullStreamEach(v1::Data::Stub& stub, const v1::PullRequest& request, Deadline deadline,
                            const std::function<absl::Status(Pulled&&)>& each,
                            std::vector<std::byte>* reuse) {
  grpc::ClientContext context;
  context.set_deadline(deadline);
  std::unique_ptr<grpc::ClientReader<v1::PullChunk>> reader = stub.Pull(&context, request);
  v1::PullChunk chunk;
  std::optional<Pulled> current;  // a header whose streamed bytes are still arriving
  int64_t filled = 0;
  int64_t expected = 0;
  const size_t wanted = request.tensors().empty() ? 1 : request.tensors().size();
  size_t delivered = 0;
  auto fail = [&](absl::Status status) {
    context.TryCancel();
    reader->Finish();
    return status;
  };
  auto deliver = [&]() -> absl::Status {
    ++delivered;
    absl::Status status = each(*std::move(current));
    current.reset();
    return status;
  };
  // A header starts a tensor; a placed pull's bytes stay where they lie, so it is delivered at
  // once, and streamed bytes follow their header.
  auto take_header = [&](v1::PullHeader&& header) -> absl::Status {
    if (current.has_value()) {
      return absl::DataLossError("pull stream sent a header before the previous one's bytes");
    }
    current.emplace();
    if (reuse != nullptr) {
      current->data = std::move(*reuse);
      reuse = nullptr;
    }
    current->header = std::move(header);
    expected = current->header.has_place()
                   ? 0
                   : current->header.data_bytes() + current->header.scale_bytes();
    current->data.resize(static_cast<size_t>(expected));
    filled = 0;
    return expected == 0 ? deliver() : absl::OkStatus();
  };
  while (reader->Read(&chunk)) {
    if (chunk.has_header()) {
      if (absl::Status s = take_header(std::move(*chunk.mutable_header())); !s.ok()) {
        return fail(s);
      }
      continue;
    }
    if (chunk.has_headers()) {  // batch_headers: each as if it came alone
      for (v1::PullHeader& header : *chunk.mutable_headers()->mutable_headers()) {
        if (absl::Status s = take_header(std::move(header)); !s.ok()) return fail(s);
      }
      continue;
    }
    const int64_t length = static_cast<int64_t>(chunk.data().size());
    if (!current.has_value() || filled + length > expected) {
      return fail(absl::DataLossError("pull stream sent data beyond its header's size"));
    }
    std::memcpy(current->data.data() + filled, chunk.data().data(), chunk.data().size());
    filled += length;
    if (filled == expected) {
      if (absl::Status s = deliver(); !s.ok()) return fail(s);
    }
  }
  absl::Status status = FromGrpcStatus(reader->Finish());
  if (status.ok() && (current.has_value() || delivered != wanted)) {
    return absl::DataLossError(
        absl::StrCat("pull of ", wanted, " tensor(s) ended after ", delivered, " whole ones"));
  }
  return status;
}

absl::Status PullStream(v1::Data::Stub& stub, const v1::PullRequest& request, Deadline deadline,
                        Pulled* out) {
  return PullStreamEach(
      stub, request, deadline,
      [out](Pulled&& pulled) {
        *out = std::move(pulled);
        return absl::OkStatus();
      },
      &out->data);
}

std::unique_ptr<Transport> MakeInlineTransport(const TransportContext& context) {
  return std::make_unique<InlineTransport>(context);
}

}  // namespace paramd
