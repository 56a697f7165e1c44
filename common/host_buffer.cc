#include "common/host_buffer.h"

#include <cstdlib>
#include <new>

#include "absl/strings/str_cat.h"

namespace paramd {
namespace {

class Heap final : public BufferAllocator {
 public:
  absl::StatusOr<HostBuffer> Allocate(int64_t bytes) override {
    if (bytes == 0) return HostBuffer();
    // 64-byte alignment: a cache line, and what the AVX-512 kernels like.
    auto* data = static_cast<uint8_t*>(
        ::operator new[](static_cast<size_t>(bytes), std::align_val_t{64}, std::nothrow));
    if (data == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the heap has no ", bytes, " bytes for a buffer (the machine is out of memory)"));
    }
    std::fill(data, data + bytes, uint8_t{0});
    return Make(data, bytes, Place{});
  }
  bool shared() const override { return false; }

 protected:
  void Free(uint8_t* data, int64_t, Place) override {
    ::operator delete[](data, std::align_val_t{64});
  }
};

}  // namespace

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    allocator_ = other.allocator_;
    data_ = other.data_;
    size_ = other.size_;
    place_ = other.place_;
    other.allocator_ = nullptr;
    other.data_ = nullptr;
    other.size_ = 0;
    other.place_ = Place{};
  }
  return *this;
}

void HostBuffer::Release() {
  if (allocator_ != nullptr && data_ != nullptr) allocator_->Free(data_, size_, place_);
  allocator_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  place_ = Place{};
}

HostBuffer BufferAllocator::Make(uint8_t* data, int64_t size, Place place) {
  HostBuffer buffer;
  buffer.allocator_ = this;
  buffer.data_ = data;
  buffer.size_ = size;
  buffer.place_ = place;
  return buffer;
}

BufferAllocator* HeapAllocator() {
  static Heap* heap = new Heap();
  return heap;
}

HostBuffer HeapBuffer(int64_t bytes) { return *HeapAllocator()->Allocate(bytes); }

std::shared_ptr<BufferAllocator> Borrowed(BufferAllocator* allocator) {
  return std::shared_ptr<BufferAllocator>(allocator, [](BufferAllocator*) {});
}

}  // namespace paramd
