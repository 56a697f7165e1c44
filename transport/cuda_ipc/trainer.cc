// The trainer's end of `cuda_ipc`: a placed transport (transport/placed.h) whose regions are the
// daemon's exported GPU allocations, opened by IPC handle on the trainer's device, and whose mover
// copies on a stream of its own (see cuda_ipc.h for the ordering).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_allocation.h"
#include "common/cuda_status.h"
#include "common/in_process_key.h"
#include "transport/cuda_ipc/cuda_ipc.h"
#include "transport/gpu_items.h"
#include "transport/placed.h"

namespace paramd {
namespace {

bool InThisProcess(uint64_t base) {
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, reinterpret_cast<void*>(base)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice;
}

// One of the daemon's allocations as this process sees it; a handle opened here is closed with it.
class MappedAllocation final : public MappedRegion {
 public:
  MappedAllocation(uint8_t* base, bool opened, int device)
      : base_(base), opened_(opened), device_(device) {}
  ~MappedAllocation() override {
    if (!opened_) return;
    const DeviceScope scope(device_);
    cudaIpcCloseMemHandle(base_);
  }
  uint8_t* data() const override { return base_; }
  int64_t size() const override { return -1; }  // a handle does not tell

 private:
  uint8_t* const base_;
  const bool opened_;  // by cudaIpcOpenMemHandle
  const int device_;
};

class CudaIpcTransport final : public PlacedTransport {
 public:
  explicit CudaIpcTransport(const TransportContext& context)
      : PlacedTransport(context, "cuda_ipc", Memory::kDevice, "GPU allocation") {}

  // The daemon's GPU allocations are mapped here; its copies read and write either memory.
  TransportTraits traits() const override {
    return {.reads_device_memory = true, .views_in_place = true, .memory = Memory::kDevice};
  }

  ~CudaIpcTransport() override {
    Stop();  // releases and slot look-aheads still in flight; their deadlines bound this
    if (device_ < 0) return;
    const DeviceScope scope(device_);
    if (callers_work_ != nullptr) cudaEventDestroy(callers_work_);
    if (step_event_opened_) cudaEventDestroy(step_event_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

 private:
  int RegionCount(const v1::AttachResponse& response) const override {
    const v1::CudaIpcRegions& regions = response.cuda_ipc();
    return std::min(regions.ipc_handles_size(), regions.ipc_bases_size());
  }

  // The caller has no device made current: the handle is opened on the trainer's.
  absl::StatusOr<std::unique_ptr<DaemonRegion>> Map(const v1::AttachResponse& response,
                                                    int index) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    const v1::CudaIpcRegions& regions = response.cuda_ipc();
    if (absl::Status s = NoteStepEvent(regions); !s.ok()) return s;
    const std::string& handle = regions.ipc_handles(index);
    const uint64_t base = regions.ipc_bases(index);
    if (regions.pid() == static_cast<int64_t>(getpid()) && InThisProcess(base)) {
      // The daemon runs in this process (tests): CUDA refuses to open a process's own handles, and
      // its address is valid here as it is.
      return std::make_unique<MappedAllocation>(reinterpret_cast<uint8_t*>(base), false, device_);
    }
    cudaIpcMemHandle_t h;
    if (handle.size() != sizeof(h)) {
      return absl::DataLossError(absl::StrCat("IPC handle of ", handle.size(), " bytes"));
    }
    std::memcpy(&h, handle.data(), sizeof(h));
    void* opened = nullptr;
    PARAMD_CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&opened, h, cudaIpcMemLazyEnablePeerAccess));
    return std::make_unique<MappedAllocation>(static_cast<uint8_t*>(opened), true, device_);
  }

  // The daemon's GPU must be visible here; the current device becomes the one this transport
  // copies from (the trainer's GPU).
  absl::Status CheckProbe(const v1::AttachResponse& response, Deadline deadline) override {
    int count = 0;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
      cudaGetLastError();
      return absl::FailedPreconditionError(absl::StrCat(
          "no GPU visible (", e == cudaSuccess ? "no devices" : cudaGetErrorString(e), ")"));
    }
    absl::StatusOr<int> daemon_gpu = DeviceWithUuid(response.cuda_ipc().device_uuid());
    if (!daemon_gpu.ok()) return daemon_gpu.status();
    if (*daemon_gpu < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the daemon's GPU (cuda:", response.cuda_ipc().device(),
                       " there) is not visible to this process (another node, or hidden by "
                       "CUDA_VISIBLE_DEVICES)"));
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device_));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    same_gpu_ = *daemon_gpu == device_;
    daemon_in_process_ = response.cuda_ipc().pid() == static_cast<int64_t>(getpid());
    // Another GPU's memory is read and written peer to peer (NVLink, or PCIe where the topology
    // allows it): without a peer path the pair is left to the next transport of the table.
    if (!same_gpu_) {
      int peer = 0;
      PARAMD_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&peer, device_, *daemon_gpu));
      if (peer == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "this process's GPU (cuda:", device_, ") has no peer access to the daemon's (cuda:",
            *daemon_gpu, " here): cuda_ipc reads and writes the daemon's GPU memory peer to peer"));
      }
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Interprocess: a lent gradient's mark names it, and the daemon's step waits for it.
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&callers_work_, cudaEventDisableTiming | cudaEventInterprocess));
    cudaIpcEventHandle_t handle;
    PARAMD_CUDA_RETURN_IF_ERROR(cudaIpcGetEventHandle(&handle, callers_work_));
    callers_work_handle_.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    return absl::OkStatus();  // the step event is opened with the first region (Map)
  }

  // Opens the daemon's step event that `regions` names (again after a restart: another handle),
  // when a region is mapped: a view can only lie in one. The caller has made the trainer's device
  // current.
  absl::Status NoteStepEvent(const v1::CudaIpcRegions& regions) {
    std::lock_guard<std::mutex> lock(event_mu_);
    // The handle and the daemon's own pointer to it: a daemon started again in this process may
    // get the same handle bytes for its new event.
    if (regions.step_event() == step_event_handle_ &&
        regions.step_event_local() == step_event_local_) {
      return absl::OkStatus();
    }
    if (step_event_opened_) cudaEventDestroy(step_event_);
    step_event_ = nullptr;
    step_event_opened_ = false;
    step_event_handle_ = regions.step_event();
    step_event_local_ = regions.step_event_local();
    if (step_event_handle_.empty()) return absl::OkStatus();  // its versions are final when named
    if (regions.pid() == static_cast<int64_t>(getpid()) && regions.ipc_bases_size() > 0 &&
        InThisProcess(regions.ipc_bases(0))) {
      // The daemon runs in this process (tests): its own handle cannot be opened here.
      step_event_ = reinterpret_cast<cudaEvent_t>(regions.step_event_local());
      return absl::OkStatus();
    }
    cudaIpcEventHandle_t h;
    if (step_event_handle_.size() != sizeof(h)) {
      return absl::DataLossError(
          absl::StrCat("IPC event handle of ", step_event_handle_.size(), " bytes"));
    }
    std::memcpy(&h, step_event_handle_.data(), sizeof(h));
    cudaEvent_t opened = nullptr;
    PARAMD_CUDA_RETURN_IF_ERROR(cudaIpcOpenEventHandle(&opened, h));
    step_event_ = opened;
    step_event_opened_ = true;
    return absl::OkStatus();
  }

  // A pulled version's step may still run on the daemon's GPU: the views' reader (the caller's
  // stream) or this transport's copies wait for the steps the daemon had queued, on the device.
  absl::Status BeforeRead(bool in_place) override {
    std::lock_guard<std::mutex> lock(event_mu_);
    if (step_event_ == nullptr) return absl::OkStatus();
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    cudaStream_t reader =
        in_place ? reinterpret_cast<cudaStream_t>(context().cuda_stream) : stream_;
    return CudaStatus(cudaStreamWaitEvent(reader, step_event_, 0),
                      "cudaStreamWaitEvent(the daemon's step)");
  }

  // The gradients may still be being written on the trainer's stream (backward): everything this
  // push reads from them (copies, a retried push's comparison) waits for that work. The daemon
  // reads them after the commit, when backward is over: a ready event would gain nothing.
  absl::Status BeforePush(uintptr_t) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(callers_work_, reinterpret_cast<cudaStream_t>(context().cuda_stream)));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, callers_work_, 0));
    return absl::OkStatus();
  }

  // With ClientOptions::lend_gradients, a gradient on the daemon's own GPU in memory CUDA can
  // share (a cudaMalloc allocation of this process: PyTorch's caching allocator's segments) is
  // lent by its allocation's IPC handle and offset. Host memory, another GPU's, and allocations
  // without an IPC handle (cuMemCreate's: PyTorch's expandable segments) are copied.
  absl::StatusOr<std::vector<Lent>> Lend(std::span<const PushItem> items) override {
    std::vector<Lent> lent;
    if (!same_gpu_) return lent;
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    std::lock_guard<std::mutex> lock(lend_mu_);
    for (const PushItem& item : items) {
      if (item.data.empty()) continue;
      absl::StatusOr<CudaAllocation> allocation = CudaAllocationOf(item.data.data());
      if (!allocation.ok() || allocation->device != device_) continue;
      const std::string* handle = HandleOf(*allocation);
      if (handle == nullptr) continue;
      Lent& l = lent.emplace_back();
      l.item = &item;
      l.memory.set_ipc_handle(*handle);
      l.memory.set_offset(reinterpret_cast<const uint8_t*>(item.data.data()) - allocation->base);
      l.memory.set_address(reinterpret_cast<uint64_t>(item.data.data()));
      l.memory.set_pid(static_cast<int64_t>(getpid()));
      // Only to a daemon in this process, which reads the address itself (its key is this one).
      if (daemon_in_process_) l.memory.set_in_process_key(InProcessKey());
      // Backward's writes are ordered by the event BeforePush recorded after them: the daemon's
      // step waits for it on the GPU, and nothing here waits for the device.
      l.memory.set_ready_event(callers_work_handle_);
      l.memory.set_ready_event_local(reinterpret_cast<uint64_t>(callers_work_));
    }
    return lent;
  }

  // The IPC handle of an allocation, asked once per allocation (a later one at the same base has
  // another id); null where CUDA gives none.
  const std::string* HandleOf(const CudaAllocation& allocation) {
    auto it = handles_.find(allocation.base);
    if (it != handles_.end() && it->second.id == allocation.id) return &it->second.handle;
    cudaIpcMemHandle_t h;
    if (cudaIpcGetMemHandle(&h, allocation.base) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    Handle& entry = handles_[allocation.base];
    entry.id = allocation.id;
    entry.handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
    return &entry.handle;
  }

  // Read back to the host (host or device memory alike): only a retry gets here.
  absl::StatusOr<bool> PlaceHolds(const std::string&, const PlacedBytes& slot,
                                  std::span<const std::byte> data) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    return SameBytes(slot.mapped, data.data(), data.size(), stream_);
  }

  // Copies the items into their slots and waits once for every copy: the marks follow (see
  // cuda_ipc.h). The stream is synchronized whatever happens, as the caller may reuse its buffers
  // when Push returns.
  absl::Status MoveToPlaces(const std::string&, std::span<const ToPlace> moves) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    std::lock_guard<std::mutex> push_lock(push_mu_);
    absl::Status s;
    for (const ToPlace& move : moves) {
      const PushItem& item = *move.item;
      if (item.data.empty()) continue;
      s = CudaStatus(cudaMemcpyAsync(move.slot.mapped, item.data.data(), item.data.size(),
                                     cudaMemcpyDefault, stream_),
                     "cudaMemcpyAsync(slot)");
      if (!s.ok()) break;
    }
    if (absl::Status synced =
            CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(stream_)");
        s.ok()) {
      s = synced;
    }
    return s;
  }

  // Queued on the stream as each header arrives; FinishMovesFromPlaces waits for them all.
  absl::Status MoveFromPlace(const std::string&, const PlacedBytes& from,
                             std::vector<std::byte>* out) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    out->resize(from.bytes);
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out->data(), from.mapped, from.bytes, cudaMemcpyDefault, stream_));
    return absl::OkStatus();
  }

  // Items in GPU memory are copied down for the inline path; host items are sent as they are.
  absl::Status ToHost(std::span<const PushItem> items, std::vector<PushItem>* host,
                      std::vector<std::vector<std::byte>>* storage) override {
    const DeviceScope scope(device_);
    if (!scope.status().ok()) return scope.status();
    return GpuItemsToHost(
        items, stream_, [this] { return BeforePush(0); }, host, storage);
  }

  absl::Status FinishMovesFromPlaces() override {
    if (stream_ == nullptr) return absl::OkStatus();
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(stream_)");
  }

  struct Handle {
    uint64_t id = 0;  // the allocation's (CudaAllocation::id)
    std::string handle;
  };
  bool same_gpu_ = false;           // the trainer's GPU is the daemon's: gradients can be lent
  bool daemon_in_process_ = false;  // the daemon runs in this process (tests)
  std::mutex lend_mu_;
  std::map<const uint8_t*, Handle> handles_;  // of lent allocations, by base
  int device_ = -1;  // the trainer's GPU: its stream, and the context handles are opened in
  cudaStream_t stream_ = nullptr;
  cudaEvent_t callers_work_ = nullptr;  // recorded on the trainer's stream, waited for by stream_
  std::string callers_work_handle_;     // its cudaIpcEventHandle_t bytes (lent gradients' marks)
  std::mutex push_mu_;                  // one push's copies at a time on stream_
  std::mutex event_mu_;                 // the daemon's step event:
  std::string step_event_handle_;       // as the daemon named it (empty: none)
  uint64_t step_event_local_ = 0;       // and its address in the daemon's process
  cudaEvent_t step_event_ = nullptr;    // opened here, or the daemon's own in this process
  bool step_event_opened_ = false;      // by cudaIpcOpenEventHandle (destroyed with this)
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
