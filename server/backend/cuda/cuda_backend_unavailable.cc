// The CUDA backend's factory in builds without CUDA.
#include "absl/strings/str_cat.h"
#include "server/backend/backends.h"

namespace paramd {

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device,
                                                         const v1::DaemonConfig& config) {
  return absl::FailedPreconditionError(
      absl::StrCat("backend cuda:", device,
                   " is not available: this paramd was built without CUDA (the build found no "
                   "CUDA toolkit); use backend \"cpu\" or rebuild with -DPARAMD_CUDA=ON"));
}

absl::StatusOr<int> CudaDeviceCount() {
  return absl::FailedPreconditionError(
      "this paramd was built without CUDA (the build found no CUDA toolkit)");
}

}  // namespace paramd
