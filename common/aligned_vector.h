// A std::vector whose storage starts on a 64-byte boundary: the state arrays the CPU step streams
// past the cache (non-temporal stores want aligned destinations, kernels/cpu/step_pipeline.h).
// glibc places a large allocation 16 bytes into its pages, so a plain vector never qualifies.
// Arrays of 2 MiB or more start on a 2 MiB boundary and their whole 2 MiB pages are marked for
// transparent huge pages (MADV_HUGEPAGE; on a kernel whose THP setting is "madvise" they are
// otherwise 4 KiB pages): the step streams several such arrays at once, and with 4 KiB pages each
// stream takes a TLB miss every 1024 floats. The mark is advice: where the kernel refuses it, the
// array is as before.
//
// Sizing does not initialize: `resize(n)` and `AlignedVector<T>(n)` leave the new elements of a
// trivial T as the fresh memory holds them, its pages untouched, so that the pass that writes every
// element (on the threads of a pool) is what faults them in; `assign(n, value)` and
// `resize(n, value)` fill, and ResizeZeroed sizes with zeros on the calling thread.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace paramd {

template <typename T>
struct StateArrayAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  static constexpr size_t kHugePage = size_t{2} << 20;

  StateArrayAllocator() = default;
  template <typename U>
  StateArrayAllocator(const StateArrayAllocator<U>&) {}  // NOLINT: rebinding, as allocators do

  static bool OnHugePages(size_t n) { return n * sizeof(T) >= kHugePage; }

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (!OnHugePages(n)) return static_cast<T*>(::operator new(bytes, kAlignment));
    void* p = ::operator new (bytes, std::align_val_t{kHugePage});
    madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // the pages inside the array
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    if (!OnHugePages(n)) {
      ::operator delete(p, kAlignment);
    } else {
      ::operator delete (p, std::align_val_t{kHugePage});
    }
  }

  // Default-initialization where std::vector would value-initialize (see above); any other
  // construction as the standard allocator does it.
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }

  template <typename U>
  friend bool operator==(const StateArrayAllocator&, const StateArrayAllocator<U>&) {
    return true;
  }
};

template <typename T>
using AlignedVector = std::vector<T, StateArrayAllocator<T>>;

// Sizes `v` to n elements, the new ones zero: every new page touched by the calling thread.
template <typename T>
void ResizeZeroed(AlignedVector<T>& v, size_t n) {
  static_assert(std::is_trivially_copyable_v<T>);
  const size_t old = v.size();
  v.resize(n);
  if (n > old) std::memset(static_cast<void*>(v.data() + old), 0, (n - old) * sizeof(T));
}

}  // namespace paramd
