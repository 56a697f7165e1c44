// The daemon's end of `cuda_ipc`: offered where the backend exports GPU memory (cuda:N); every
// Attach answer carries the exported allocations' IPC handles, so a trainer maps each once.
// Needs no CUDA itself: the backend owns the memory.
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "transport/cuda_ipc/cuda_ipc.h"

namespace paramd {
namespace {

class CudaIpcDaemonEnd final : public DaemonEnd {
 public:
  explicit CudaIpcDaemonEnd(TransportHost& host) : host_(host) {}

  std::string why_not_offered() const override {
    if (host_.device_exports().has_value()) return std::string();
    return absl::StrCat("the daemon's backend is ", host_.backend_name(),
                        ", which keeps no GPU memory to share; cuda_ipc needs a cuda:N backend");
  }

  std::optional<Memory> memory() const override { return Memory::kDevice; }

  absl::Status Attach(const v1::AttachRequest& request, v1::AttachResponse* response) override {
    return AttachPlaced(
        host_, Memory::kDevice, request,
        // The job's own allocations alone (none for a probe).
        [this](const std::string& job, v1::AttachResponse* r) {
          const DeviceExports exports = *host_.device_exports(job);
          v1::CudaIpcRegions* regions = r->mutable_cuda_ipc();
          regions->clear_ipc_handles();
          regions->clear_ipc_bases();
          for (const std::string& handle : exports.handles) {
            regions->add_ipc_handles(handle);
          }
          for (uint64_t base : exports.bases) regions->add_ipc_bases(base);
          regions->set_device(exports.device);
          regions->set_device_uuid(exports.uuid);
          regions->set_pid(static_cast<int64_t>(getpid()));
          regions->set_step_event(exports.step_event);
          regions->set_step_event_local(exports.step_event_local);
          return absl::OkStatus();
        },
        response);
  }

 private:
  TransportHost& host_;
};

}  // namespace

std::unique_ptr<DaemonEnd> MakeCudaIpcDaemonEnd(TransportHost& host) {
  return std::make_unique<CudaIpcDaemonEnd>(host);
}

}  // namespace paramd
