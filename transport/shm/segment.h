// Shared-memory segments, both ends: files of /dev/shm's tmpfs. The daemon creates them (space
// reserved up front so a full /dev/shm is an error at allocation rather than a SIGBUS on first
// touch) in a directory of its own and removes them when it is done; the trainer opens and maps
// them by path.
//
// The directory is "/dev/shm/paramd.<uid>.<pid>.<tag>": the creating daemon's user and process, so
// a daemon starting after a crash can find and remove what a dead daemon of its user left behind.
// It is owner-only (0700), or 0710 with the daemon's listen group: a member may open a segment
// whose path it was told (mode 0660) but cannot list the others, whose names carry 128 random
// bits of their job's. A trainer learns only its own job's paths (Attach), so one job's trainers
// cannot map another job's memory.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace paramd {

class ShmSegment {
 public:
  // Creates and maps a new segment of `bytes` bytes at `path`, mode 0600, or 0660 owned by
  // `group`. ALREADY_EXISTS when the path is taken, RESOURCE_EXHAUSTED when /dev/shm cannot hold
  // it.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& path, int64_t bytes,
                                                            std::optional<gid_t> group = {});
  // Opens and maps an existing segment (whole size).
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& path, bool writable);

  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  // Unmaps; the creator also removes the file.
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

// A daemon's directory of segments; removed, with whatever is left in it, when destroyed.
class ShmDirectory {
 public:
  // Creates "/dev/shm/paramd.<uid>.<pid>.<tag>", mode 0700, or 0710 owned by `group`.
  static absl::StatusOr<std::unique_ptr<ShmDirectory>> Create(uid_t uid, pid_t pid,
                                                              const std::string& tag,
                                                              std::optional<gid_t> group = {});
  ShmDirectory(const ShmDirectory&) = delete;
  ShmDirectory& operator=(const ShmDirectory&) = delete;
  ~ShmDirectory();

  const std::string& path() const { return path_; }
  // The group its segments are shared with, if any.
  std::optional<gid_t> group() const { return group_; }

 private:
  ShmDirectory(std::string path, std::optional<gid_t> group)
      : path_(std::move(path)), group_(group) {}
  const std::string path_;
  const std::optional<gid_t> group_;
};

// 32 hex digits drawn at random: the unguessable part of a segment's name.
std::string RandomShmTag();

// Removes the segment directories (and the bare segments older daemons made) of user `uid` whose
// creating process no longer runs (a daemon that was killed). Returns how many segments were
// removed.
int ReclaimStaleShmSegments(uid_t uid);

}  // namespace paramd
