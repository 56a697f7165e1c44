// GpuCopies in a build without CUDA: shm copies host memory only.
#include "transport/shm/gpu_copies.h"

namespace paramd {

absl::StatusOr<std::unique_ptr<GpuCopies>> GpuCopies::Make(int, uintptr_t) {
  return absl::FailedPreconditionError(
      "this paramd was built without CUDA: shm copies host memory only");
}

int64_t GpuCopies::PageLockedBytes() { return 0; }

}  // namespace paramd
