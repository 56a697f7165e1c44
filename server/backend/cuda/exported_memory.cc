#include "server/backend/cuda/exported_memory.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/free_ranges.h"

namespace paramd {

// One job's exported memory: buffers carved out of a few allocations. First fit with coalescing of
// freed neighbours; an allocation is added when none has room, at least as large as those before
// it together (up to 256 MiB), so a job of any size opens few handles and a small job holds little.
class DeviceArena final : public ExportedMemory {
 public:
  explicit DeviceArena(int device) : device_(device) {}
  ~DeviceArena() override {
    cudaSetDevice(device_);
    for (const Allocation& a : allocations_) cudaFree(a.base);
  }

  absl::StatusOr<DeviceBytes> Allocate(int64_t bytes) override {
    if (bytes <= 0) return DeviceBytes();
    const int64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < allocations_.size(); ++i) {
      if (std::optional<int64_t> offset = allocations_[i].free.Take(size, kAlign)) {
        return Hand(i, *offset, bytes, size);
      }
    }
    Allocation a;
    a.size =
        std::max(std::min(reserved_, kMaxGrowthBytes), (size + kGranule - 1) / kGranule * kGranule);
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (cudaMalloc(&a.base, static_cast<size_t>(a.size)) != cudaSuccess) {
      cudaGetLastError();  // a failed allocation leaves no sticky error
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", a.size, " bytes of GPU memory to share with trainers"));
    }
    cudaIpcMemHandle_t handle;
    if (absl::Status s = CudaStatus(cudaIpcGetMemHandle(&handle, a.base),
                                    "cudaIpcGetMemHandle(&handle, a.base)");
        !s.ok()) {
      cudaFree(a.base);
      return s;
    }
    a.handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    a.free = FreeRanges(a.size);
    reserved_ += a.size;
    allocations_.push_back(std::move(a));
    const size_t index = allocations_.size() - 1;
    return Hand(index, *allocations_[index].free.Take(size, kAlign), bytes, size);
  }

  void Describe(DeviceExports* exports) const {
    absl::MutexLock lock(&mu_);
    for (const Allocation& a : allocations_) {
      exports->handles.push_back(a.handle);
      exports->bases.push_back(reinterpret_cast<uint64_t>(a.base));
      exports->sizes.push_back(a.size);
    }
  }

  // True when no buffer of it is held.
  bool idle() const {
    absl::MutexLock lock(&mu_);
    return used_ == 0;
  }

 protected:
  void Free(void* d_ptr, int64_t size, Place place) override {
    const int64_t length = (size + kAlign - 1) / kAlign * kAlign;
    absl::MutexLock lock(&mu_);
    allocations_[static_cast<size_t>(place.region)].free.Give(place.offset, length);
    used_ -= length;
  }

 private:
  // 256-byte offsets keep every buffer aligned as cudaMalloc's are, for the kernels' vector stores.
  static constexpr int64_t kAlign = 256;
  static constexpr int64_t kGranule = 2 << 20;
  static constexpr int64_t kMaxGrowthBytes = 256 << 20;

  struct Allocation {
    void* base = nullptr;
    int64_t size = 0;
    std::string handle;  // cudaIpcMemHandle_t bytes
    FreeRanges free{0};
  };

  DeviceBytes Hand(size_t index, int64_t offset, int64_t bytes, int64_t length)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    used_ += length;
    return Make(static_cast<uint8_t*>(allocations_[index].base) + offset, bytes,
                Place{static_cast<int32_t>(index), offset});
  }

  const int device_;
  mutable absl::Mutex mu_;
  std::vector<Allocation> allocations_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of all allocations
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;      // bytes handed out
};

ExportedMemories::ExportedMemories(int device) : device_(device) {}

ExportedMemories::~ExportedMemories() {
  absl::MutexLock lock(&mu_);
  arenas_.clear();
}

std::shared_ptr<ExportedMemory> ExportedMemories::For(const std::string& job) {
  absl::MutexLock lock(&mu_);
  const uint64_t key = next_key_++;
  DeviceArena* arena =
      arenas_.emplace(key, Arena{job, false, std::make_unique<DeviceArena>(device_)})
          .first->second.arena.get();
  current_[job] = key;  // a job of this name that is going keeps its own until it has gone
  return std::shared_ptr<ExportedMemory>(arena, [this, key](ExportedMemory*) {
    absl::MutexLock lock(&mu_);
    Arena& a = arenas_.at(key);
    a.released = true;
    if (auto it = current_.find(a.job); it != current_.end() && it->second == key) {
      current_.erase(it);
    }
    ReapLocked();
  });
}

void ExportedMemories::Describe(const std::string& job, DeviceExports* exports) const {
  absl::MutexLock lock(&mu_);
  if (auto it = current_.find(job); it != current_.end()) {
    arenas_.at(it->second).arena->Describe(exports);
  }
}

void ExportedMemories::ReapLocked() {
  for (auto it = arenas_.begin(); it != arenas_.end();) {
    it = it->second.released && it->second.arena->idle() ? arenas_.erase(it) : std::next(it);
  }
}

}  // namespace paramd
