#include "common/copy_bytes.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace paramd {
namespace {

#if defined(__x86_64__)
// Unaligned loads, 32-byte aligned non-temporal stores (the head copied first to align them).
__attribute__((target("avx2"))) void StreamCopyAvx2(std::byte* to, const std::byte* from,
                                                    size_t bytes) {
  const size_t head = (32 - (reinterpret_cast<uintptr_t>(to) & 31)) & 31;
  std::memcpy(to, from, head);
  to += head;
  from += head;
  bytes -= head;
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to + i + 96), d);
  }
  // The streamed stores are ordered before whatever this thread does next (a mark, a return).
  _mm_sfence();
  std::memcpy(to + i, from + i, bytes - i);
}

bool HasAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}
#endif

}  // namespace

void CopyBytes(void* to, const void* from, size_t bytes) {
#if defined(__x86_64__)
  if (bytes >= kStreamCopyBytes && HasAvx2()) {
    StreamCopyAvx2(static_cast<std::byte*>(to), static_cast<const std::byte*>(from), bytes);
    return;
  }
#endif
  std::memcpy(to, from, bytes);
}

}  // namespace paramd
