// The free byte ranges of one region (a shared-memory segment, an exported GPU allocation): first
// fit at an alignment, freed neighbours coalesced. Not thread-safe: its owner locks.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>

namespace paramd {

class FreeRanges {
 public:
  // The whole region [0, size) is free.
  explicit FreeRanges(int64_t size) {
    if (size > 0) free_.emplace(0, size);
  }

  // The offset of `length` bytes starting at a multiple of `align`, taken; none when no free
  // range holds them. The gap in front of an aligned start stays free.
  std::optional<int64_t> Take(int64_t length, int64_t align) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const int64_t start = it->first;
      const int64_t end = it->first + it->second;
      const int64_t offset = (start + align - 1) / align * align;
      if (offset + length > end) continue;
      free_.erase(it);
      if (offset > start) free_.emplace(start, offset - start);
      if (end > offset + length) free_.emplace(offset + length, end - offset - length);
      return offset;
    }
    return std::nullopt;
  }

  // Returns [offset, offset + length), merged with the free ranges it touches.
  void Give(int64_t offset, int64_t length) {
    auto [it, inserted] = free_.emplace(offset, length);
    if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      if (auto prev = std::prev(it); prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }

 private:
  std::map<int64_t, int64_t> free_;  // offset -> length, never adjacent
};

}  // namespace paramd
