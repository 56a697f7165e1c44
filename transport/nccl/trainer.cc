// The trainer's end of `nccl` (nccl.h): a placed transport whose regions are the daemon's exported
// GPU allocations, known by address and not mapped here (RemoteRegion: never dereferenced), and
// whose mover sends and receives over the session's communicator, on a stream of its own.
#include <cuda_runtime_api.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "paramd/v1/data.grpc.pb.h"
#include "transport/gpu_items.h"
#include "transport/nccl/communicator.h"
#include "transport/nccl/nccl.h"
#include "transport/placed.h"

namespace paramd {
namespace {

constexpr int kDaemonRank = 0;
constexpr int kTrainerRank = 1;
// How long a transfer, and opening a session (both sides joining), may take.
constexpr std::chrono::milliseconds kTransferTimeout{60000};
constexpr std::chrono::milliseconds kOpenTimeout{30000};

Deadline After(std::chrono::milliseconds timeout) {
  return std::chrono::system_clock::now() + timeout;
}

// Device memory of this transport's, grown when a transfer needs more.
class Staging {
 public:
  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    if (data_ != nullptr) cudaFree(data_);
  }
  absl::StatusOr<uint8_t*> Reserve(size_t bytes) {
    if (bytes <= bytes_) return data_;
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
    if (cudaMalloc(reinterpret_cast<void**>(&data_), bytes) != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of GPU memory to stage nccl transfers"));
    }
    bytes_ = bytes;
    return data_;
  }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

class NcclTransport final : public PlacedTransport {
 public:
  explicit NcclTransport(const TransportContext& context)
      : PlacedTransport(context, "nccl", Memory::kDevice, "GPU allocation"),
        stub_(v1::Data::NewStub(context.channel)) {}

  // Sends from and receives into GPU memory over a communicator; the daemon's GPU memory is named
  // by address, never mapped here, so nothing is viewed in place (CanViewInPlace).
  TransportTraits traits() const override {
    return {.reads_device_memory = true, .views_in_place = false, .memory = Memory::kDevice};
  }

  ~NcclTransport() override {
    Stop();
    if (device_ < 0) return;
    const DeviceScope scope(device_);
    sessions_.clear();  // aborts (no call of one is in flight once Stop returned)
    if (callers_work_ != nullptr) cudaEventDestroy(callers_work_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Opens the session of the job this transport serves, if it serves one (the daemon and this
  // process join its communicator); a job's session is opened by its first transfer otherwise.
  absl::Status Open(Deadline deadline) {
    if (context().job.empty()) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(session_mu_);
    return OpenLocked(context().job, deadline);
  }

 private:
  int RegionCount(const v1::AttachResponse& response) const override {
    return std::min(response.nccl().bases_size(), response.nccl().sizes_size());
  }

  // One of the daemon's allocations: its address there and its size.
  absl::StatusOr<std::unique_ptr<DaemonRegion>> Map(const v1::AttachResponse& response,
                                                    int index) override {
    return std::make_unique<RemoteRegion>(response.nccl().bases(index),
                                          response.nccl().sizes(index));
  }

  // A GPU must be visible here, and be another than the daemon's (unless NCCL_HOSTID makes this
  // process another host to NCCL); the current device becomes the one this transport works on.
  absl::Status CheckProbe(const v1::AttachResponse& response, Deadline deadline) override {
    if (!response.has_nccl()) {
      return absl::FailedPreconditionError(
          "the daemon answered an nccl Attach without its regions");
    }
    int count = 0;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
      cudaGetLastError();
      return absl::FailedPreconditionError(absl::StrCat(
          "no GPU visible (", e == cudaSuccess ? "no devices" : cudaGetErrorString(e), ")"));
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device_));
    absl::StatusOr<int> daemon_gpu = DeviceWithUuid(response.nccl().device_uuid());
    if (!daemon_gpu.ok()) return daemon_gpu.status();
    if (*daemon_gpu == device_ && getenv("NCCL_HOSTID") == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("this process's GPU (cuda:", device_,
                       ") is the daemon's: NCCL takes no two ranks on one "
                       "GPU, and cuda_ipc serves this pair"));
    }
    return absl::OkStatus();
  }

  absl::Status CanViewInPlace() const override {
    return absl::FailedPreconditionError(
        "transport nccl cannot read in place (the daemon's memory is not mapped in this process); "
        "use Pull or PullMany (a copy)");
  }

  // The gradients may still be being written on the trainer's stream (backward): the sends wait
  // for that work, or for the gradients' ready event alone.
  absl::Status BeforePush(uintptr_t ready_event) override {
    PARAMD_RETURN_IF_ERROR(Ready());
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    if (ready_event != 0) {
      PARAMD_CUDA_RETURN_IF_ERROR(
          cudaStreamWaitEvent(stream_, reinterpret_cast<cudaEvent_t>(ready_event), 0));
      return absl::OkStatus();
    }
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(callers_work_, reinterpret_cast<cudaStream_t>(context().cuda_stream)));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, callers_work_, 0));
    return absl::OkStatus();
  }

  // Read back over the session and compared (only a retried push asks).
  absl::StatusOr<bool> PlaceHolds(const std::string& job, const PlacedBytes& slot,
                                  std::span<const std::byte> data) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    std::lock_guard<std::mutex> lock(session_mu_);
    PARAMD_ASSIGN_OR_RETURN(uint8_t * staged, pull_staging_.Reserve(data.size()));
    const std::vector<Span> spans = {{slot.address, staged, data.size()}};
    PARAMD_RETURN_IF_ERROR(TransferLocked(job, spans, /*to_daemon=*/false, Soon()));
    return SameBytes(staged, data.data(), data.size(), stream_);
  }

  // One transfer into the slots (the base marks them written once it returned: every byte is in
  // its slot once the daemon answered). An item in GPU memory of this device is sent where it
  // lies; others are staged there first.
  absl::Status MoveToPlaces(const std::string& job, std::span<const ToPlace> moves) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    std::vector<Span> spans;
    std::lock_guard<std::mutex> lock(session_mu_);
    size_t staged_bytes = 0;
    for (const ToPlace& move : moves) {
      const PushItem& item = *move.item;
      if (!item.data.empty() && !IsGpuMemory(item.data.data(), device_)) {
        staged_bytes += item.data.size();
      }
    }
    uint8_t* staged = nullptr;
    if (staged_bytes > 0) {
      PARAMD_ASSIGN_OR_RETURN(staged, push_staging_.Reserve(staged_bytes));
    }
    for (const ToPlace& move : moves) {
      const PushItem& item = *move.item;
      if (item.data.empty()) continue;
      uint8_t* local = const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(item.data.data()));
      if (!IsGpuMemory(item.data.data(), device_)) {
        PARAMD_RETURN_IF_ERROR(CudaStatus(
            cudaMemcpyAsync(staged, item.data.data(), item.data.size(), cudaMemcpyDefault, stream_),
            "cudaMemcpyAsync(staging)"));
        local = staged;
        staged += item.data.size();
      }
      spans.push_back({move.slot.address, local, item.data.size()});
    }
    absl::Status moved =
        spans.empty() ? absl::OkStatus()
                      : TransferLocked(job, spans, /*to_daemon=*/true, After(kTransferTimeout));
    if (absl::Status synced = CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        moved.ok()) {
      moved = synced;
    }
    return moved;
  }

  // Gathered while the headers arrive; FinishMovesFromPlaces moves them all in one transfer.
  absl::Status MoveFromPlace(const std::string& job, const PlacedBytes& from,
                             std::vector<std::byte>* out) override {
    out->resize(from.bytes);
    std::lock_guard<std::mutex> lock(pending_mu_);
    Pulls& pulls = pending_[std::this_thread::get_id()];
    pulls.job = job;  // a pull is of one job
    pulls.copies.push_back({from.address, from.bytes, out});
    return absl::OkStatus();
  }

  absl::Status FinishMovesFromPlaces() override {
    std::vector<Pending> pending;
    std::string job;
    {
      std::lock_guard<std::mutex> lock(pending_mu_);
      auto it = pending_.find(std::this_thread::get_id());
      if (it == pending_.end()) return absl::OkStatus();
      pending = std::move(it->second.copies);
      job = std::move(it->second.job);
      pending_.erase(it);
    }
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    std::lock_guard<std::mutex> lock(session_mu_);
    size_t total = 0;
    for (const Pending& p : pending) total += p.bytes;
    PARAMD_ASSIGN_OR_RETURN(uint8_t * staged, pull_staging_.Reserve(total));
    std::vector<Span> spans;
    for (const Pending& p : pending) {
      spans.push_back({p.from, staged, p.bytes});
      staged += p.bytes;
    }
    PARAMD_RETURN_IF_ERROR(
        TransferLocked(job, spans, /*to_daemon=*/false, After(kTransferTimeout)));
    for (size_t i = 0; i < pending.size(); ++i) {
      if (pending[i].bytes == 0) continue;
      PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pending[i].out->data(), spans[i].local,
                                                  pending[i].bytes, cudaMemcpyDefault, stream_));
    }
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(stream_)");
  }

  // Items in GPU memory are copied down for the inline path; host items are sent as they are.
  absl::Status ToHost(std::span<const PushItem> items, std::vector<PushItem>* host,
                      std::vector<std::vector<std::byte>>* storage) override {
    if (device_ < 0) {
      host->assign(items.begin(), items.end());
      return absl::OkStatus();
    }
    PARAMD_RETURN_IF_ERROR(Ready());
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    return GpuItemsToHost(
        items, stream_, [this] { return BeforePush(0); }, host, storage);
  }

  // The stream and event, made once on the trainer's device (CheckProbe chose it).
  absl::Status Ready() {
    std::lock_guard<std::mutex> lock(ready_mu_);
    if (stream_ != nullptr) return absl::OkStatus();
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&callers_work_, cudaEventDisableTiming));
    return absl::OkStatus();
  }

  // Opens job `job`'s session: its transfers may touch that job's memory alone.
  absl::Status OpenLocked(const std::string& job, Deadline deadline) {
    PARAMD_RETURN_IF_ERROR(Ready());
    sessions_.erase(job);
    v1::AttachRequest request;
    request.set_transport("nccl");
    request.set_job(job);
    request.mutable_nccl_open();
    v1::AttachResponse response;
    grpc::ClientContext call;
    call.set_deadline(deadline);
    PARAMD_RETURN_IF_ERROR(FromGrpcStatus(stub_->Attach(&call, request, &response)));
    const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::system_clock::now());
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
        NcclCommunicator::Create(response.nccl().unique_id(), 2, kTrainerRank, device_,
                                 std::max(timeout, std::chrono::milliseconds(0)));
    if (!comm.ok()) {
      return absl::Status(comm.status().code(),
                          absl::StrCat("joining nccl session ", response.nccl().session(),
                                       " with the daemon: ", comm.status().message()));
    }
    sessions_[job] = Session{*std::move(comm), response.nccl().session()};
    return absl::OkStatus();
  }

  // A span of a transfer: its place in the daemon's memory, and its bytes here (GPU memory of
  // this device).
  struct Span {
    uint64_t daemon;
    uint8_t* local;
    size_t bytes;
  };

  // Queues this side of the spans (sends to the daemon, or receives from it) and asks the daemon
  // for its side; a session that failed is opened again first, and once more where the daemon
  // knows none (it restarted). Returns once this side ran.
  absl::Status TransferLocked(const std::string& job, const std::vector<Span>& spans,
                              bool to_daemon, Deadline deadline) {
    absl::Status status;
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto it = sessions_.find(job);
      if (it == sessions_.end() || !it->second.comm->usable()) {
        PARAMD_RETURN_IF_ERROR(OpenLocked(job, deadline));
        it = sessions_.find(job);
      }
      NcclCommunicator& comm = *it->second.comm;
      std::vector<NcclCommunicator::Piece> pieces;
      v1::AttachRequest request;
      request.set_transport("nccl");
      request.set_job(job);
      v1::NcclTransfer* call = request.mutable_nccl_transfer();
      call->set_session(it->second.number);
      call->set_to_daemon(to_daemon);
      for (const Span& span : spans) {
        pieces.push_back({span.local, span.bytes});
        v1::NcclSpan* s = call->add_spans();
        s->set_address(span.daemon);
        s->set_bytes(static_cast<int64_t>(span.bytes));
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::system_clock::now());
      call->set_timeout_ms(std::max<int64_t>(1, left.count()));
      status = comm.Queue(pieces, /*send=*/to_daemon, kDaemonRank, stream_);
      if (!status.ok()) continue;  // the communicator is aborted: open another
      v1::AttachResponse response;
      grpc::ClientContext context;
      context.set_deadline(deadline);
      status = FromGrpcStatus(stub_->Attach(&context, request, &response));
      if (!status.ok()) {
        comm.Abort();  // what this side queued will not be matched
        if (status.code() == absl::StatusCode::kNotFound) continue;
        return status;
      }
      return comm.Wait(stream_, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::system_clock::now()));
    }
    return status;
  }

  struct Pending {
    uint64_t from;  // the daemon's address
    size_t bytes;
    std::vector<std::byte>* out;
  };

  std::unique_ptr<v1::Data::Stub> stub_;
  int device_ = -1;  // the trainer's GPU (CheckProbe)
  std::mutex ready_mu_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t callers_work_ = nullptr;  // recorded on the trainer's stream, waited for by stream_
  // A job's session with the daemon: its communicator and its number there.
  struct Session {
    std::unique_ptr<NcclCommunicator> comm;
    uint64_t number = 0;
  };
  std::mutex session_mu_;                    // one transfer at a time, and the sessions
  std::map<std::string, Session> sessions_;  // by job (a client's transport serves one)
  Staging push_staging_;
  Staging pull_staging_;
  std::mutex pending_mu_;
  // The copy-outs of each pull in progress (of one job), by the thread pulling (CopyOut and
  // FinishCopies of a pull run on its caller's thread).
  struct Pulls {
    std::string job;
    std::vector<Pending> copies;
  };
  std::map<std::thread::id, Pulls> pending_;
};

}  // namespace

std::string NcclWhyNotViable(const TransportContext& context) {
  NcclTransport probe(context);
  absl::Status status = probe.Probe(Soon());
  return status.ok() ? std::string() : std::string(status.message());
}

absl::StatusOr<std::unique_ptr<Transport>> MakeNcclTransport(const TransportContext& context) {
  auto transport = std::make_unique<NcclTransport>(context);
  if (absl::Status s = transport->Probe(Soon()); !s.ok()) return s;
  if (absl::Status s = transport->Open(After(kOpenTimeout)); !s.ok()) return s;
  return transport;
}

}  // namespace paramd
