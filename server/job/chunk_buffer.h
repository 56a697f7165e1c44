// A tensor's bytes arriving in chunks (one rank's gradient, or the initial weights): where each
// chunk landed, so an identical re-send is acknowledged without effect and a different one is
// refused (DESIGN.md §2, idempotent pushes).
#pragma once

#include <cstdint>
#include <map>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/host_buffer.h"

namespace paramd {

class ChunkBuffer {
 public:
  enum class Stored { kNew, kDuplicate };

  // Takes `buffer` as the memory (its size is the tensor's) and forgets every chunk.
  void Reset(HostBuffer buffer);
  // Holds no memory, only counts marks of `size` bytes written elsewhere (a GPU slot, a
  // trainer's lent GPU memory), and forgets every chunk.
  void ResetCounting(int64_t size);
  // Forgets every chunk, keeping the memory.
  void Clear();

  // Stores `data` at `offset`. A chunk equal in place and bytes to a stored one is kDuplicate; one
  // that differs, or that overlaps a stored chunk at other boundaries, is FAILED_PRECONDITION and
  // changes nothing. The caller has checked bounds.
  absl::StatusOr<Stored> Store(int64_t offset, std::string_view data);
  // Records that a trainer wrote [offset, offset + length) in place (shared memory). The same
  // range again is kDuplicate (its bytes cannot be told apart from a retry's); overlapping at
  // other boundaries is FAILED_PRECONDITION. The caller has checked bounds.
  absl::StatusOr<Stored> MarkWritten(int64_t offset, int64_t length);

  bool complete() const { return received_ == size(); }
  int64_t received() const { return received_; }
  int64_t size() const { return counting_ >= 0 ? counting_ : bytes_.size(); }
  // Whether it holds the bytes (else it only counts marks: Store needs memory).
  bool holds_memory() const { return counting_ < 0; }
  const uint8_t* data() const { return bytes_.data(); }
  const Place* place() const { return bytes_.place(); }

 private:
  // The stored chunks around [offset, offset + length): kDuplicate when one has exactly these
  // bounds and its bytes match (or were written in place), an error when one overlaps, else kNew
  // (not recorded).
  absl::StatusOr<Stored> Check(int64_t offset, int64_t length, bool in_place,
                               std::string_view data) const;

  HostBuffer bytes_;
  int64_t counting_ = -1;              // the size counted, when it holds no memory
  std::map<int64_t, int64_t> chunks_;  // offset -> length
  int64_t received_ = 0;
};

}  // namespace paramd
