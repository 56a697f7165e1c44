// A tensor's bytes arriving in chunks (one rank's gradient, or the initial weights): where each
// chunk landed, so an identical re-send is acknowledged without effect and a different one is
// refused (DESIGN.md §2, idempotent pushes).
#pragma once

#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace paramd {

class ChunkBuffer {
 public:
  enum class Stored { kNew, kDuplicate };

  // Sizes the buffer for `bytes` bytes and forgets every chunk.
  void Reset(int64_t bytes);

  // Stores `data` at `offset`. A chunk equal in place and bytes to a stored one is kDuplicate; one
  // that differs, or that overlaps a stored chunk at other boundaries, is FAILED_PRECONDITION and
  // changes nothing. The caller has checked bounds.
  absl::StatusOr<Stored> Store(int64_t offset, std::string_view data);

  bool complete() const { return received_ == static_cast<int64_t>(bytes_.size()); }
  int64_t received() const { return received_; }
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const uint8_t* data() const { return bytes_.data(); }
  int64_t capacity() const { return static_cast<int64_t>(bytes_.capacity()); }

 private:
  std::vector<uint8_t> bytes_;
  std::map<int64_t, int64_t> chunks_;  // offset -> length
  int64_t received_ = 0;
};

}  // namespace paramd
