// `cuda_ipc` in a build without CUDA: listed, never viable, with the reason.
#include "transport/cuda_ipc/cuda_ipc.h"

namespace paramd {
namespace {
constexpr char kWhy[] = "built without CUDA";
}  // namespace

std::string CudaIpcWhyNotViable(const TransportContext& context) { return kWhy; }

absl::StatusOr<std::unique_ptr<Transport>> MakeCudaIpcTransport(const TransportContext& context) {
  return absl::FailedPreconditionError(std::string("transport cuda_ipc: ") + kWhy);
}

}  // namespace paramd
