// Host memory for the buffers a transport may expose: gradient slots and served bytes. A buffer
// comes from the heap, or from an allocator a transport's daemon end offers (memory a trainer on
// the same node maps, and reads and writes in place: DESIGN.md §6).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/place.h"

namespace paramd {

class BufferAllocator;

// An owned, zero-initialized (when fresh) byte buffer; returns its memory to its allocator.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { Release(); }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<const uint8_t> span() const { return {data_, static_cast<size_t>(size_)}; }
  std::vector<uint8_t> ToVector() const { return {data_, data_ + size_}; }
  // Where it lies in memory a transport exposes; null for private (heap, page-locked) memory.
  const Place* place() const { return place_.exposed() ? &place_ : nullptr; }

 private:
  friend class BufferAllocator;
  void Release();

  BufferAllocator* allocator_ = nullptr;
  uint8_t* data_ = nullptr;
  int64_t size_ = 0;
  Place place_;
};

class BufferAllocator {
 public:
  virtual ~BufferAllocator() = default;
  // A buffer of `bytes` bytes (0 gives an empty buffer).
  virtual absl::StatusOr<HostBuffer> Allocate(int64_t bytes) = 0;
  // True when buffers lie in memory a transport exposes to trainers.
  virtual bool shared() const = 0;

 protected:
  HostBuffer Make(uint8_t* data, int64_t size, Place place);
  virtual void Free(uint8_t* data, int64_t size, Place place) = 0;
  friend class HostBuffer;
};

// The process heap: RESOURCE_EXHAUSTED when the process runs out of memory.
BufferAllocator* HeapAllocator();

// A handle to an allocator that lives on its own (the heap, the page-locked pool), for those that
// keep allocators by shared handle.
std::shared_ptr<BufferAllocator> Borrowed(BufferAllocator* allocator);

// A heap buffer of `bytes` bytes, for tests and small buffers; crashes where the heap has none
// (the daemon's own buffers come from HeapAllocator()->Allocate, which says so instead).
HostBuffer HeapBuffer(int64_t bytes);

}  // namespace paramd
