// A std::vector whose storage starts on a 64-byte boundary: the state arrays the CPU step streams
// past the cache (non-temporal stores want aligned destinations, kernels/cpu/step_pipeline.h).
// glibc places a large allocation 16 bytes into its pages, so a plain vector never qualifies.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace paramd {

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};

  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: rebinding, as allocators do

  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlignment); }

  template <typename U>
  friend bool operator==(const CacheLineAllocator&, const CacheLineAllocator<U>&) {
    return true;
  }
};

template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace paramd
