// CopyBytes (common/copy_bytes.h) copies exactly what memcpy does, on both of its paths: below
// kStreamCopyBytes, and above it at every alignment of source and destination within 64 bytes,
// with lengths that leave a head before the first aligned store and a tail after the last
// 128-byte block. The bytes around the destination stay as they were.
#include "common/copy_bytes.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace paramd {
namespace {

std::vector<std::byte> Pattern(size_t bytes, uint32_t seed) {
  std::vector<std::byte> out(bytes);
  uint32_t x = seed;
  for (std::byte& b : out) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return out;
}

void ExpectCopied(size_t bytes, size_t from_offset, size_t to_offset) {
  const std::vector<std::byte> source = Pattern(bytes + 64, static_cast<uint32_t>(bytes));
  std::vector<std::byte> target = Pattern(bytes + 128, 7);
  const std::vector<std::byte> before = target;
  CopyBytes(target.data() + to_offset, source.data() + from_offset, bytes);
  for (size_t i = 0; i < target.size(); ++i) {
    const bool inside = i >= to_offset && i < to_offset + bytes;
    const std::byte want = inside ? source[from_offset + i - to_offset] : before[i];
    if (target[i] != want) {
      ADD_FAILURE() << bytes << " bytes from +" << from_offset << " to +" << to_offset << ": byte "
                    << i << " differs";
      return;
    }
  }
}

TEST(CopyBytesTest, SmallCopiesAreMemcpys) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{31}, size_t{4096}, kStreamCopyBytes - 1}) {
    ExpectCopied(bytes, 3, 5);
  }
}

TEST(CopyBytesTest, LargeCopiesAreExactAtEveryAlignment) {
  for (size_t from : {size_t{0}, size_t{1}, size_t{16}, size_t{33}, size_t{63}}) {
    for (size_t to : {size_t{0}, size_t{1}, size_t{16}, size_t{31}, size_t{48}, size_t{64}}) {
      ExpectCopied(kStreamCopyBytes + 77, from, to);
    }
  }
  ExpectCopied(kStreamCopyBytes, 0, 0);
  ExpectCopied(kStreamCopyBytes + 128 * 3 + 5, 9, 40);
}

}  // namespace
}  // namespace paramd
