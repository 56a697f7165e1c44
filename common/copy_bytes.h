// Copies of large buffers between a trainer's memory and the daemon's shared memory (the `shm`
// transport's push and copy-out pull). glibc's memcpy of large buffers takes a non-temporal path
// whose speed depends on where source and destination lie within their pages: on an AMD EPYC
// machine it copies 256 MiB at 10-11 GB/s where their page offsets match and at 3.3-4.0 GB/s where
// the destination's is a little past the source's (16 to 64 bytes), which is where a trainer's heap
// buffer and a place in a shared-memory segment often fall. A loop of unaligned 32-byte loads and
// aligned non-temporal stores copies at 9.7-12.4 GB/s at every offset measured there. CopyBytes
// takes that loop for copies of at least kStreamCopyBytes on a CPU with AVX2, and memcpy otherwise
// (smaller copies stay in the cache for whoever reads them next).
#pragma once

#include <cstddef>

namespace paramd {

// From this many bytes CopyBytes streams past the cache.
inline constexpr size_t kStreamCopyBytes = size_t{4} << 20;

// Copies `bytes` bytes from `from` to `to` (not overlapping), as memcpy.
void CopyBytes(void* to, const void* from, size_t bytes);

}  // namespace paramd
