#include <cuda_runtime_api.h>
#include <grpcpp/client_context.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/daemon_instance.h"
#include "common/grpc_status.h"
#include "paramd/v1/data.grpc.pb.h"
#include "transport/async_calls.h"
#include "transport/cuda_ipc/cuda_ipc.h"
#include "transport/inline/inline.h"
#include "transport/slot_places.h"

namespace paramd {
namespace {

constexpr char kName[] = "cuda_ipc";
// A copy-out pull holds its lease only while it copies, then releases it without waiting for the
// answer; the lease expires after this long if the trainer dies first.
constexpr std::chrono::milliseconds kCopyLease{10000};
// A gradient is copied and marked in pieces of at most this size, so the marks' round trips run
// while later pieces still copy (a multiple of every element size).
constexpr int64_t kPieceBytes = int64_t{512} << 20;

v1::AttachRequest ProbeRequest() {
  v1::AttachRequest request;
  request.set_transport(kName);
  return request;
}

// The local ordinal of the GPU with this UUID, or -1.
absl::StatusOr<int> DeviceWithUuid(const std::string& uuid) {
  int count = 0;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, d));
    if (uuid.size() == sizeof(prop.uuid.bytes) &&
        std::memcmp(uuid.data(), prop.uuid.bytes, uuid.size()) == 0) {
      return d;
    }
  }
  return -1;
}

class CudaIpcTransport final : public Transport {
 public:
  explicit CudaIpcTransport(const TransportContext& context)
      : context_(context),
        stub_(v1::Data::NewStub(context.channel)),
        inline_(MakeInlineTransport(context)),
        slots_(stub_.get(), kName, [this](const v1::AttachResponse& r) { Remember(r); }) {}

  ~CudaIpcTransport() override {
    // Releases and slot look-aheads still in flight use this object; their deadlines bound this.
    slots_.WaitIdle();
    async_.WaitIdle();
    if (device_ < 0) return;
    const DeviceScope scope(device_);
    for (const auto& [index, mapping] : mapped_) {
      if (mapping.opened) cudaIpcCloseMemHandle(mapping.base);
    }
    for (const Mapping& mapping : retired_) {
      if (mapping.opened) cudaIpcCloseMemHandle(mapping.base);
    }
    for (cudaEvent_t event : events_) cudaEventDestroy(event);
    if (callers_work_ != nullptr) cudaEventDestroy(callers_work_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  std::string name() const override { return kName; }

  // Asks the daemon for its GPU and checks that this process sees it; takes the current device as
  // the one this transport copies from (the trainer's GPU).
  absl::Status Probe(Deadline deadline) {
    v1::AttachResponse response;
    if (absl::Status s = AttachCall(*stub_, ProbeRequest(), deadline, &response); !s.ok()) {
      return s;
    }
    int count = 0;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
      cudaGetLastError();
      return absl::FailedPreconditionError(absl::StrCat(
          "no GPU visible (", e == cudaSuccess ? "no devices" : cudaGetErrorString(e), ")"));
    }
    absl::StatusOr<int> daemon_gpu = DeviceWithUuid(response.device_uuid());
    if (!daemon_gpu.ok()) return daemon_gpu.status();
    if (*daemon_gpu < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the daemon's GPU (cuda:", response.device(),
                       " there) is not visible to this process (another node, or hidden by "
                       "CUDA_VISIBLE_DEVICES)"));
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device_));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&callers_work_, cudaEventDisableTiming));
    Remember(response);
    return absl::OkStatus();
  }

  absl::Status Push(const PushTarget& target, std::span<const PushItem> items,
                    Deadline deadline) override {
    if (target.kind == v1::PUSH_KIND_INITIAL_WEIGHTS) {
      return inline_->Push(target, items, deadline);  // once per job, from rank 0
    }
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    // The gradients may still be being written on the trainer's stream (backward): everything
    // this push reads from them (copies, a retried push's comparison) waits for that work.
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(callers_work_, reinterpret_cast<cudaStream_t>(context_.cuda_stream)));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, callers_work_, 0));
    return slots_.PushFollowingRestarts([&] { return PushPlaced(target, items, deadline); });
  }

  absl::Status PushPlaced(const PushTarget& target, std::span<const PushItem> items,
                          Deadline deadline) {
    absl::StatusOr<std::shared_ptr<SlotCache>> slots = slots_.ForPush(target, items, deadline);
    if (!slots.ok()) return slots.status();
    auto locate = [&](const v1::ShmPlace& place) -> absl::StatusOr<uint8_t*> {
      absl::StatusOr<uint8_t*> base = Map(place.segment(), (*slots)->instance, deadline);
      if (!base.ok()) return base.status();
      return *base + place.offset();
    };
    auto same = [this](const uint8_t* slot, std::span<const std::byte> data) {
      return SameBytes(slot, data);
    };
    absl::StatusOr<PushPlan> plan = PlanPush(**slots, target, items, locate, same);
    if (!plan.ok()) return plan.status();
    const std::vector<const PushItem*>& placed = plan->placed;
    if (!placed.empty()) {
      // Each piece is marked once its copy has completed (see the header); the stream is
      // synchronized whatever happens, as the caller may reuse its buffers when Push returns.
      std::lock_guard<std::mutex> push_lock(push_mu_);
      absl::Status s = CopyAndMark(target, (*slots)->instance, placed, plan->slots, deadline);
      if (absl::Status synced =
              CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(stream_)");
          s.ok()) {
        s = synced;
      }
      if (!s.ok()) return s;
      slots_.MarkReceived(**slots, placed);
      slots_.LookAhead(target);
    }
    if (!plan->inline_items.empty()) return inline_->Push(target, plan->inline_items, deadline);
    return absl::OkStatus();
  }

  absl::Status Pull(const PullTarget& target, Deadline deadline, Pulled* out) override {
    return PullOneOfMany(*this, target, deadline, out);
  }

  absl::Status PullInPlace(const PullTarget& target, Deadline deadline,
                           std::chrono::milliseconds lease, PulledView* out) override {
    return PullInPlaceOneOfMany(*this, target, deadline, lease, out);
  }

  absl::Status PullMany(const PullManyTarget& target, Deadline deadline,
                        std::vector<Pulled>* out) override {
    // The caller's buffers are kept: copies land in memory a previous pull already faulted in.
    out->resize(target.tensors.size());
    std::vector<uint64_t> leases;
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    // Each tensor's copy is queued as its header arrives; one synchronization at the end.
    absl::Status status = PullPlacesEach(
        *stub_, target, kCopyLease, deadline, [&](size_t i, Pulled&& pulled) -> absl::Status {
          if (!pulled.header.has_place()) {
            (*out)[i] = std::move(pulled);
            return absl::OkStatus();
          }
          leases.push_back(pulled.header.lease());
          absl::StatusOr<const uint8_t*> bytes = View(pulled.header, deadline);
          if (!bytes.ok()) return bytes.status();
          std::vector<std::byte>& data = (*out)[i].data;
          data.resize(static_cast<size_t>(pulled.header.place().bytes()));
          PARAMD_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(data.data(), *bytes, data.size(), cudaMemcpyDefault, stream_));
          (*out)[i].header = std::move(pulled.header);
          return absl::OkStatus();
        });
    const absl::Status synced =
        CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(stream_)");
    if (!leases.empty()) ReleaseMany(leases, deadline).IgnoreError();  // asynchronous: always OK
    return status.ok() ? synced : status;
  }

  absl::Status PullInPlaceMany(const PullManyTarget& target, Deadline deadline,
                               std::chrono::milliseconds lease,
                               std::vector<PulledView>* out) override {
    out->assign(target.tensors.size(), PulledView{});
    std::vector<uint64_t> leases;
    absl::Status status = PullPlacesEach(
        *stub_, target, lease, deadline, [&](size_t i, Pulled&& pulled) -> absl::Status {
          if (!pulled.header.has_place()) {
            return absl::FailedPreconditionError(absl::StrCat(
                "the daemon keeps ", pulled.header.tensor(),
                " out of its exported GPU memory (it ran out of room); use a pull that copies "
                "(Pull, PullMany)"));
          }
          leases.push_back(pulled.header.lease());
          absl::StatusOr<const uint8_t*> bytes = View(pulled.header, deadline);
          if (!bytes.ok()) return bytes.status();
          PulledView& view = (*out)[i];
          view.header = std::move(pulled.header);
          view.data = std::span<const std::byte>(reinterpret_cast<const std::byte*>(*bytes),
                                                 static_cast<size_t>(view.header.place().bytes()));
          view.lease = view.header.lease();
          return absl::OkStatus();
        });
    if (!status.ok() && !leases.empty()) {
      ReleaseMany(leases, deadline).IgnoreError();  // nothing handed out; asynchronous: always OK
    }
    return status;
  }

  absl::Status Release(uint64_t lease, Deadline deadline) override {
    return ReleaseMany({&lease, 1}, deadline);
  }

  // Sent without waiting for the answer, which has nothing to report (the daemon ignores unknown
  // and expired leases): the trainer has already stopped reading the bytes, and a pull needs no
  // round trip more. The transport waits for the call when it closes.
  absl::Status ReleaseMany(std::span<const uint64_t> leases, Deadline deadline) override {
    ReleaseSoon(*stub_, async_, leases);
    return absl::OkStatus();
  }

 private:
  // One of the daemon's allocations as this process sees it.
  struct Mapping {
    uint8_t* base = nullptr;
    bool opened = false;  // by cudaIpcOpenMemHandle (closed with the transport)
  };

  // Whether the slot already holds `data` (host or device memory), read back to the host: only a
  // retry gets here.
  absl::StatusOr<bool> SameBytes(const uint8_t* slot, std::span<const std::byte> data) {
    std::vector<std::byte> theirs(data.size()), mine(data.size());
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(theirs.data(), slot, data.size(), cudaMemcpyDefault, stream_));
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(mine.data(), data.data(), data.size(), cudaMemcpyDefault, stream_));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return theirs == mine;
  }

  // Copies the placed items into their slots in pieces, an event after each, and marks each piece
  // written in device memory, in one Push stream naming the daemon start whose places they are,
  // once its event has completed (an item whose slot holds it already, a retry, is marked only).
  // The caller holds push_mu_ (the events) and synchronizes the stream afterwards.
  absl::Status CopyAndMark(const PushTarget& target, uint64_t instance,
                           const std::vector<const PushItem*>& placed,
                           const std::vector<uint8_t*>& slots, Deadline deadline) {
    struct Piece {
      const PushItem* item;
      int64_t offset;
      int64_t bytes;
      int event;  // index into events_; -1: nothing copied
    };
    std::vector<Piece> pieces;
    size_t used_events = 0;
    for (size_t i = 0; i < placed.size(); ++i) {
      const int64_t size = static_cast<int64_t>(placed[i]->data.size());
      for (int64_t offset = 0; offset < size; offset += kPieceBytes) {
        Piece piece{placed[i], offset, std::min(kPieceBytes, size - offset), -1};
        if (slots[i] != nullptr) {
          if (used_events == events_.size()) {
            cudaEvent_t event;
            PARAMD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
            events_.push_back(event);
          }
          PARAMD_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(slots[i] + offset, placed[i]->data.data() + offset,
                              static_cast<size_t>(piece.bytes), cudaMemcpyDefault, stream_));
          PARAMD_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[used_events], stream_));
          piece.event = static_cast<int>(used_events++);
        }
        pieces.push_back(piece);
      }
    }
    if (pieces.empty()) return absl::OkStatus();  // empty tensors: nothing to mark
    grpc::ClientContext context;
    context.set_deadline(deadline);
    context.set_initial_metadata_corked(true);  // sent with the first write: one batch less
    v1::PushResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::PushChunk>> writer = stub_->Push(&context, &response);
    v1::PushChunk chunk;
    chunk.set_job(target.job);
    chunk.set_rank(target.rank);
    chunk.set_step(target.step);
    chunk.set_kind(target.kind);
    chunk.set_in_place_device(true);
    chunk.set_instance(instance);
    bool open = true;
    for (size_t p = 0; p < pieces.size() && open; ++p) {
      if (absl::Status s = pieces[p].event < 0
                               ? absl::OkStatus()
                               : CudaStatus(cudaEventSynchronize(events_[pieces[p].event]),
                                            "cudaEventSynchronize");
          !s.ok()) {
        context.TryCancel();
        writer->Finish();
        return s;
      }
      chunk.set_tensor(pieces[p].item->tensor);
      chunk.set_offset(pieces[p].offset);
      chunk.set_in_place_bytes(pieces[p].bytes);
      if (p + 1 < pieces.size()) {
        // The marks matter together (the commit follows the push): gRPC may batch them.
        open = writer->Write(chunk, grpc::WriteOptions().set_buffer_hint());
      } else {
        writer->WriteLast(chunk, grpc::WriteOptions());  // also closes the stream: one write less
        open = false;
      }
    }
    return FromGrpcStatus(writer->Finish());
  }

  absl::StatusOr<const uint8_t*> View(const v1::PullHeader& header, Deadline deadline) {
    if (absl::Status s = FollowStart(header.instance(), deadline); !s.ok()) return s;
    const v1::ShmPlace& place = header.place();
    if (!header.place_on_device()) {
      return absl::DataLossError(
          "the daemon answered a cuda_ipc pull with a shared-memory place, not a GPU one");
    }
    if (place.offset() < 0 || place.bytes() != header.data_bytes() + header.scale_bytes()) {
      return absl::DataLossError(absl::StrCat(
          "pulled GPU place [", place.offset(), ", +", place.bytes(), ") does not hold ",
          header.data_bytes(), " + ", header.scale_bytes(), " bytes"));
    }
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    absl::StatusOr<uint8_t*> base = Map(place.segment(), header.instance(), deadline);
    if (!base.ok()) return base.status();
    return *base + place.offset();
  }

  // Takes the IPC handles of an Attach answer. From a new start of the daemon (it restarted at
  // the same address), they replace the old ones, whose mappings stay open until the transport
  // goes (a view may still point into them); a late answer of a past start is ignored.
  void Remember(const v1::AttachResponse& response) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const DaemonStarts::Seen seen = starts_.See(response.instance());
      if (seen == DaemonStarts::Seen::kPast) return;
      if (seen == DaemonStarts::Seen::kNew) {
        for (const auto& [index, mapping] : mapped_) retired_.push_back(mapping);
        mapped_.clear();
        handles_.clear();
        bases_.clear();
      }
      if (response.ipc_handles_size() > static_cast<int>(handles_.size())) {
        handles_.assign(response.ipc_handles().begin(), response.ipc_handles().end());
        bases_.assign(response.ipc_bases().begin(), response.ipc_bases().end());
        daemon_pid_ = response.pid();
      }
    }
    slots_.Observe(response.instance());
  }

  // Makes sure the handles opened are those of daemon start `instance` (a pull's).
  absl::Status FollowStart(uint64_t instance, Deadline deadline) {
    return paramd::FollowStart(
        *stub_, ProbeRequest(), instance, deadline,
        [this] {
          std::lock_guard<std::mutex> lock(mu_);
          return starts_.current();
        },
        [this](const v1::AttachResponse& response) { Remember(response); });
  }

  // Allocation `index` of daemon start `instance` (0: the current one) as this process sees it,
  // opened on first use (asking for new handles when needed). A place of another start than the
  // current one is refused as such (the push then asks for its places again), never looked up in
  // the current start's allocations. The caller has made device_ current.
  absl::StatusOr<uint8_t*> Map(int index, uint64_t instance, Deadline deadline) {
    if (index < 0) return absl::DataLossError(absl::StrCat("GPU allocation index ", index));
    std::string handle;
    uint64_t base = 0;
    int64_t pid = 0;
    uint64_t start = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (instance != 0 && instance != starts_.current())
        return PlaceFromAnotherDaemonStart(absl::StrCat("GPU allocation ", index));
      auto it = mapped_.find(index);
      if (it != mapped_.end()) return it->second.base;
      if (index < static_cast<int>(handles_.size())) {
        handle = handles_[static_cast<size_t>(index)];
        base = bases_[static_cast<size_t>(index)];
        pid = daemon_pid_;
      }
      start = starts_.current();
    }
    if (handle.empty()) {
      v1::AttachResponse response;
      if (absl::Status s = AttachCall(*stub_, ProbeRequest(), deadline, &response); !s.ok()) {
        return s;
      }
      if (index >= response.ipc_handles_size()) {
        return absl::DataLossError(absl::StrCat("the daemon named GPU allocation ", index, " of ",
                                                response.ipc_handles_size()));
      }
      Remember(response);
      handle = response.ipc_handles(index);
      base = response.ipc_bases(index);
      pid = response.pid();
      start = response.instance();
    }
    Mapping mapping;
    if (pid == static_cast<int64_t>(getpid()) && InThisProcess(base)) {
      // The daemon runs in this process (tests): CUDA refuses to open a process's own handles, and
      // its address is valid here as it is.
      mapping.base = reinterpret_cast<uint8_t*>(base);
    } else {
      cudaIpcMemHandle_t h;
      if (handle.size() != sizeof(h)) {
        return absl::DataLossError(absl::StrCat("IPC handle of ", handle.size(), " bytes"));
      }
      std::memcpy(&h, handle.data(), sizeof(h));
      void* opened = nullptr;
      PARAMD_CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&opened, h, cudaIpcMemLazyEnablePeerAccess));
      mapping.base = static_cast<uint8_t*>(opened);
      mapping.opened = true;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (start != starts_.current() || (instance != 0 && instance != start)) {
      // The daemon restarted while the handle was opened: it is the old start's, unused here.
      if (mapping.opened) cudaIpcCloseMemHandle(mapping.base);
      return PlaceFromAnotherDaemonStart(absl::StrCat("GPU allocation ", index));
    }
    auto [it, inserted] = mapped_.emplace(index, mapping);
    if (!inserted && mapping.opened) cudaIpcCloseMemHandle(mapping.base);  // another thread won
    return it->second.base;
  }

  static bool InThisProcess(uint64_t base) {
    cudaPointerAttributes attributes;
    if (cudaPointerGetAttributes(&attributes, reinterpret_cast<void*>(base)) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice;
  }

  const TransportContext context_;
  std::unique_ptr<v1::Data::Stub> stub_;
  std::unique_ptr<Transport> inline_;
  int device_ = -1;  // the trainer's GPU: its stream, and the context handles are opened in
  cudaStream_t stream_ = nullptr;
  cudaEvent_t callers_work_ = nullptr;  // recorded on the trainer's stream, waited for by stream_
  std::mutex push_mu_;                  // one push's copies and marks at a time: the events
  std::vector<cudaEvent_t> events_;     // one per piece of a push, reused

  std::mutex mu_;
  std::vector<std::string> handles_;
  std::vector<uint64_t> bases_;
  int64_t daemon_pid_ = 0;
  std::map<int, Mapping> mapped_;
  DaemonStarts starts_;           // whose handles handles_ and mapped_ are
  std::vector<Mapping> retired_;  // mappings of past starts
  StepSlots slots_;               // after what Remember uses
  AsyncCalls async_;              // releases in flight (last: it waits for them first)
};

}  // namespace

std::string CudaIpcWhyNotViable(const TransportContext& context) {
  CudaIpcTransport probe(context);
  absl::Status status = probe.Probe(Soon());
  return status.ok() ? std::string() : std::string(status.message());
}

absl::StatusOr<std::unique_ptr<Transport>> MakeCudaIpcTransport(const TransportContext& context) {
  auto transport = std::make_unique<CudaIpcTransport>(context);
  if (absl::Status s = transport->Probe(Soon()); !s.ok()) return s;
  return transport;
}

}  // namespace paramd
