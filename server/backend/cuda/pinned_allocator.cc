#include "server/backend/cuda/pinned_allocator.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <memory>

#include "absl/base/const_init.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace paramd::cuda {
namespace {

// Page-locked host memory (cudaHostAlloc) for the jobs' slots and served bytes: the copies to and
// from the GPU need no staging. A failed allocation leaves the job a heap buffer (slower copies).
class PinnedAllocator final : public BufferAllocator {
 public:
  explicit PinnedAllocator(int device) : device_(device) {}

  absl::StatusOr<HostBuffer> Allocate(int64_t bytes) override {
    if (bytes == 0) return HostBuffer();
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));  // the backend's device, on any thread
    void* data = nullptr;
    if (cudaHostAlloc(&data, static_cast<size_t>(bytes), cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of page-locked host memory"));
    }
    std::memset(data, 0, static_cast<size_t>(bytes));
    return Make(static_cast<uint8_t*>(data), bytes, Place{});
  }
  bool shared() const override { return false; }

 protected:
  // On whatever thread drops the last reference: the backend's device, then the thread's own.
  void Free(uint8_t* data, int64_t, Place) override {
    const DeviceScope scope(device_);
    cudaFreeHost(data);
    cudaGetLastError();
  }

 private:
  const int device_;
};

}  // namespace

BufferAllocator* PinnedAllocatorOf(int device) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* allocators = new std::map<int, std::unique_ptr<PinnedAllocator>>();
  absl::MutexLock lock(&mu);
  std::unique_ptr<PinnedAllocator>& a = (*allocators)[device];
  if (a == nullptr) a = std::make_unique<PinnedAllocator>(device);
  return a.get();
}

}  // namespace paramd::cuda
