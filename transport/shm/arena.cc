#include "transport/shm/arena.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace paramd {
namespace {

// Buffers start on cache lines; big ones on pages, so a trainer's copy streams whole pages. A
// buffer's length is rounded the same way, so Free knows what Allocate took.
int64_t Alignment(int64_t bytes) { return bytes >= (1 << 16) ? 4096 : 64; }
int64_t RoundUp(int64_t bytes, int64_t align) { return (bytes + align - 1) / align * align; }
int64_t Aligned(int64_t bytes) { return RoundUp(bytes, Alignment(bytes)); }

constexpr int64_t kSegmentGranule = 2 << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<ShmArena>> ShmArena::Create(std::string prefix,
                                                           int64_t min_segment_bytes,
                                                           uint64_t probe,
                                                           std::optional<gid_t> group) {
  std::unique_ptr<ShmArena> arena(new ShmArena(std::move(prefix), min_segment_bytes, probe, group));
  absl::StatusOr<HostBuffer> buffer = arena->Allocate(sizeof(probe));
  if (!buffer.ok()) return buffer.status();
  std::memcpy(buffer->data(), &probe, sizeof(probe));
  arena->probe_buffer_ = *std::move(buffer);
  return arena;
}

ShmArena::~ShmArena() {
  probe_buffer_ = HostBuffer();
  absl::MutexLock lock(&mu_);
  PARAMD_CHECK(used_ == 0) << used_ << " bytes of shared memory still in use at exit";
}

absl::StatusOr<HostBuffer> ShmArena::Allocate(int64_t bytes) {
  if (bytes == 0) return HostBuffer();
  const int64_t length = Aligned(bytes);
  absl::MutexLock lock(&mu_);
  for (size_t s = 0; s < segments_.size(); ++s) {
    if (std::optional<int64_t> offset = segments_[s].free.Take(length, Alignment(bytes))) {
      used_ += length;
      uint8_t* data = segments_[s].shm->data() + *offset;
      std::memset(data, 0, static_cast<size_t>(bytes));
      return Make(data, bytes, Place{static_cast<int32_t>(s), *offset});
    }
  }
  const int64_t size = std::max(min_segment_bytes_,
                                (length + kSegmentGranule - 1) / kSegmentGranule * kSegmentGranule);
  absl::StatusOr<std::unique_ptr<ShmSegment>> shm =
      ShmSegment::Create(absl::StrCat(prefix_, segments_.size()), size, group_);
  if (!shm.ok()) return shm.status();
  Segment& segment = segments_.emplace_back(Segment{*std::move(shm), FreeRanges(size)});
  segment.free.Take(length, Alignment(bytes));  // offset 0 of a fresh segment
  reserved_ += size;
  used_ += length;
  PARAMD_LOG(DEBUG) << "shared memory segment " << segment.shm->name() << ": " << size << " bytes";
  // A fresh segment is zero (posix_fallocate of tmpfs).
  return Make(segment.shm->data(), bytes, Place{static_cast<int32_t>(segments_.size() - 1), 0});
}

void ShmArena::Free(uint8_t* data, int64_t size, Place place) {
  const int64_t length = Aligned(size);
  absl::MutexLock lock(&mu_);
  segments_[static_cast<size_t>(place.region)].free.Give(place.offset, length);
  used_ -= length;
}

std::vector<std::string> ShmArena::segment_names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const Segment& s : segments_) names.push_back(s.shm->name());
  return names;
}

int64_t ShmArena::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}

int64_t ShmArena::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

bool ShmArena::idle() const {
  absl::MutexLock lock(&mu_);
  return used_ == Aligned(probe_buffer_.size());
}

}  // namespace paramd
