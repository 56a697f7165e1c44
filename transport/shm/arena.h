// A job's shared memory: buffers carved out of a few large segments (transport/shm/segment.h) so a
// trainer maps each segment once, however many tensors the job has. First fit with coalescing of
// freed neighbours; a segment is added when none has room. Segments live until the arena is
// destroyed, which removes them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/free_ranges.h"
#include "common/host_buffer.h"
#include "transport/shm/segment.h"

namespace paramd {

class ShmArena final : public BufferAllocator {
 public:
  // Segments are the paths `prefix` + index (ShmSegment::Create, shared with `group` where given)
  // and hold at least `min_segment_bytes` each. The first is created now; its first bytes hold
  // `probe`, which a trainer reads to prove it shares this memory.
  static absl::StatusOr<std::unique_ptr<ShmArena>> Create(std::string prefix,
                                                          int64_t min_segment_bytes, uint64_t probe,
                                                          std::optional<gid_t> group = {});
  ~ShmArena() override;

  absl::StatusOr<HostBuffer> Allocate(int64_t bytes) override;
  bool shared() const override { return true; }

  // Names of the segments so far, by index (Place::segment).
  std::vector<std::string> segment_names() const;
  uint64_t probe() const { return probe_; }
  // Bytes of all segments, and of the buffers handed out.
  int64_t reserved_bytes() const;
  int64_t used_bytes() const;
  // True when no buffer is out (but the arena's own probe).
  bool idle() const;

 protected:
  void Free(uint8_t* data, int64_t size, Place place) override;

 private:
  ShmArena(std::string prefix, int64_t min_segment_bytes, uint64_t probe,
           std::optional<gid_t> group)
      : prefix_(std::move(prefix)),
        min_segment_bytes_(min_segment_bytes),
        probe_(probe),
        group_(group) {}
  absl::StatusOr<HostBuffer> AllocateLocked(int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Segment {
    std::unique_ptr<ShmSegment> shm;
    FreeRanges free;
  };

  const std::string prefix_;
  const int64_t min_segment_bytes_;
  const uint64_t probe_;
  const std::optional<gid_t> group_;
  HostBuffer probe_buffer_;  // the probe's bytes at the start of segment 0
  mutable absl::Mutex mu_;
  std::vector<Segment> segments_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace paramd
