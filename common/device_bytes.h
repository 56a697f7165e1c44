// GPU memory a backend exports to trainers on its node (they map it by handle and read and write
// it in place, DESIGN.md §6): the owned pieces the daemon hands out and what a trainer needs to
// map them. The daemon's end and the trainer's end of a transport both speak of it; neither needs
// CUDA to.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/place.h"

namespace paramd {

class DeviceAllocator;

// An owned piece of a backend's exported GPU memory; returns to its allocator when destroyed.
// Empty (null, size 0) where the backend exports none.
class DeviceBytes {
 public:
  DeviceBytes() = default;
  DeviceBytes(DeviceBytes&& other) noexcept { *this = std::move(other); }
  DeviceBytes& operator=(DeviceBytes&& other) noexcept;
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() { Release(); }

  void* get() const { return d_ptr_; }
  int64_t size() const { return size_; }
  bool empty() const { return d_ptr_ == nullptr; }
  Place place() const { return place_; }

 private:
  friend class DeviceAllocator;
  void Release();

  DeviceAllocator* allocator_ = nullptr;
  void* d_ptr_ = nullptr;
  int64_t size_ = 0;
  Place place_;
};

// What a trainer needs to map a backend's exported GPU memory.
struct DeviceExports {
  int device = -1;                   // CUDA ordinal in the daemon's process
  std::string uuid;                  // the GPU's 16-byte UUID
  std::vector<std::string> handles;  // cudaIpcMemHandle_t bytes, by Place::region
  std::vector<uint64_t> bases;       // the allocations' addresses in this process
  std::vector<int64_t> sizes;        // and their sizes in bytes
  // An interprocess event recorded after each step's work on the device: a version is published
  // once its step is queued, and whoever reads its bytes on the GPU waits for this event first.
  std::string step_event;         // cudaIpcEventHandle_t bytes; empty: none
  uint64_t step_event_local = 0;  // the cudaEvent_t in this process
};

class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;

 protected:
  DeviceBytes Make(void* d_ptr, int64_t size, Place place) {
    DeviceBytes bytes;
    bytes.allocator_ = this;
    bytes.d_ptr_ = d_ptr;
    bytes.size_ = size;
    bytes.place_ = place;
    return bytes;
  }
  // Takes the bytes back. Called from any thread; must not wait on the device.
  virtual void Free(void* d_ptr, int64_t size, Place place) = 0;
  friend class DeviceBytes;
};

// One job's exported GPU memory (ExportedMemoryAbility::ExportedMemoryFor): the pieces its slots
// and served bytes take.
class ExportedMemory : public DeviceAllocator {
 public:
  // `bytes` of it (contents undefined); RESOURCE_EXHAUSTED where the GPU has no room.
  virtual absl::StatusOr<DeviceBytes> Allocate(int64_t bytes) = 0;
};

inline DeviceBytes& DeviceBytes::operator=(DeviceBytes&& other) noexcept {
  if (this != &other) {
    Release();
    allocator_ = std::exchange(other.allocator_, nullptr);
    d_ptr_ = std::exchange(other.d_ptr_, nullptr);
    size_ = std::exchange(other.size_, 0);
    place_ = std::exchange(other.place_, Place{});
  }
  return *this;
}

inline void DeviceBytes::Release() {
  if (allocator_ != nullptr && d_ptr_ != nullptr) allocator_->Free(d_ptr_, size_, place_);
  allocator_ = nullptr;
  d_ptr_ = nullptr;
  size_ = 0;
}

}  // namespace paramd
