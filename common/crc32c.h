// CRC-32C (Castagnoli, the polynomial iSCSI, ext4 and gRPC use), incrementally: the SSE4.2 crc32
// instruction where the CPU has it, a table elsewhere; both give the same value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace paramd {

// The CRC of `bytes` continuing from `crc` (0 for the first piece): Crc32c(Crc32c(0, a), b) is
// the CRC of a followed by b.
uint32_t Crc32c(uint32_t crc, const void* bytes, size_t size);

}  // namespace paramd
