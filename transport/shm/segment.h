// POSIX shared-memory segments, both ends. The daemon creates them (owner-only permissions, space
// reserved up front so a full /dev/shm is an error at allocation rather than a SIGBUS on first
// touch) and removes them when it exits; the trainer opens and maps them by name.
//
// Names are "/paramd.<uid>.<pid>.<tag>.<index>": the creating daemon's user and process, so a
// daemon starting after a crash can find and remove what a dead daemon of its user left behind.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace paramd {

class ShmSegment {
 public:
  // Creates and maps a new segment of `bytes` bytes, mode 0600. ALREADY_EXISTS when the name is
  // taken, RESOURCE_EXHAUSTED when /dev/shm cannot hold it.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name, int64_t bytes);
  // Opens and maps an existing segment (whole size).
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& name, bool writable);

  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  // Unmaps; the creator also removes the name.
  ~ShmSegment();

  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  ShmSegment(std::string name, uint8_t* data, int64_t size, bool owner)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner) {}

  const std::string name_;
  uint8_t* const data_;
  const int64_t size_;
  const bool owner_;
};

// "/paramd.<uid>.<pid>.<tag>." : the prefix of this process's segment names.
std::string ShmSegmentPrefix(uid_t uid, pid_t pid, const std::string& tag);

// Removes the segments of user `uid` whose creating process no longer runs (a daemon that was
// killed). Returns how many were removed.
int ReclaimStaleShmSegments(uid_t uid);

}  // namespace paramd
