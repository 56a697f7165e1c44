#include "server/job/chunk_buffer.h"

#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace paramd {

void ChunkBuffer::Reset(HostBuffer buffer) {
  bytes_ = std::move(buffer);
  counting_ = -1;
  Clear();
}

void ChunkBuffer::ResetCounting(int64_t size) {
  bytes_ = HostBuffer();
  counting_ = size;
  Clear();
}

void ChunkBuffer::Clear() {
  chunks_.clear();
  received_ = 0;
}

absl::StatusOr<ChunkBuffer::Stored> ChunkBuffer::Check(int64_t offset, int64_t length,
                                                       bool in_place, std::string_view data) const {
  // The stored chunk starting at or before `offset`, and the one after it.
  auto next = chunks_.upper_bound(offset);
  if (next != chunks_.begin()) {
    auto prev = std::prev(next);
    if (prev->first == offset && prev->second == length) {
      if (in_place || std::memcmp(bytes_.data() + offset, data.data(), data.size()) == 0) {
        return Stored::kDuplicate;
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "a different chunk of ", length, " bytes at offset ", offset,
          " was already pushed for this step; pushes are idempotent only for identical bytes"));
    }
    if (prev->first + prev->second > offset) {
      return absl::FailedPreconditionError(absl::StrCat(
          "chunk [", offset, ", ", offset + length, ") overlaps the stored chunk [", prev->first,
          ", ", prev->first + prev->second, "); re-send chunks at their original boundaries"));
    }
  }
  if (next != chunks_.end() && next->first < offset + length) {
    return absl::FailedPreconditionError(absl::StrCat(
        "chunk [", offset, ", ", offset + length, ") overlaps the stored chunk [", next->first,
        ", ", next->first + next->second, "); re-send chunks at their original boundaries"));
  }
  return Stored::kNew;
}

absl::StatusOr<ChunkBuffer::Stored> ChunkBuffer::Store(int64_t offset, std::string_view data) {
  const int64_t length = static_cast<int64_t>(data.size());
  absl::StatusOr<Stored> stored = Check(offset, length, /*in_place=*/false, data);
  if (!stored.ok() || *stored == Stored::kDuplicate) return stored;
  std::memcpy(bytes_.data() + offset, data.data(), data.size());
  chunks_.emplace(offset, length);
  received_ += length;
  return Stored::kNew;
}

absl::StatusOr<ChunkBuffer::Stored> ChunkBuffer::MarkWritten(int64_t offset, int64_t length) {
  absl::StatusOr<Stored> stored = Check(offset, length, /*in_place=*/true, {});
  if (!stored.ok() || *stored == Stored::kDuplicate) return stored;
  chunks_.emplace(offset, length);
  received_ += length;
  return Stored::kNew;
}

}  // namespace paramd
