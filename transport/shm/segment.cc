#include "transport/shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"

namespace paramd {
namespace {

absl::Status ErrnoError(int error, const std::string& what) {
  const std::string text = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(text);
    case EEXIST:
      return absl::AlreadyExistsError(text);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(text);
    case ENOSPC:
    case ENOMEM:
    case EFBIG:
      return absl::ResourceExhaustedError(text);
    default:
      return absl::InternalError(text);
  }
}

// Where segment directories live.
constexpr char kShmRoot[] = "/dev/shm";

// Removes every entry of directory `path` (segments: plain files) and then the directory; returns
// how many files went.
int RemoveDirectory(const std::string& path) {
  int removed = 0;
  if (DIR* dir = opendir(path.c_str()); dir != nullptr) {
    while (const dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      if (unlink(absl::StrCat(path, "/", name).c_str()) == 0) ++removed;
    }
    closedir(dir);
  }
  rmdir(path.c_str());
  return removed;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& path,
                                                               int64_t bytes,
                                                               std::optional<gid_t> group) {
  const int fd =
      open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, S_IRUSR | S_IWUSR);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("open(", path, ", O_CREAT | O_EXCL)"));
  // The mode given to open is masked by the umask; set it exactly.
  int error = 0;
  if (group.has_value() && fchown(fd, static_cast<uid_t>(-1), *group) != 0) error = errno;
  const mode_t mode =
      group.has_value() ? (S_IRUSR | S_IWUSR | S_IRGRP | S_IWGRP) : (S_IRUSR | S_IWUSR);
  if (error == 0 && fchmod(fd, mode) != 0) error = errno;
  // posix_fallocate reserves the pages now: a /dev/shm too small fails here with ENOSPC.
  if (error == 0) error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* data = MAP_FAILED;
  if (error == 0) {
    data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) error = errno;
  }
  close(fd);
  if (error != 0) {
    unlink(path.c_str());
    return ErrnoError(error, absl::StrCat("reserving ", bytes, " bytes of shared memory for ", path,
                                          " (is /dev/shm large enough?)"));
  }
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(path, static_cast<uint8_t*>(data), bytes, /*owner=*/true));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& path,
                                                             bool writable) {
  const int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("open(", path, ")"));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoError(error, absl::StrCat("fstat(", path, ")"));
  }
  void* data = mmap(nullptr, static_cast<size_t>(st.st_size),
                    writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (data == MAP_FAILED) return ErrnoError(error, absl::StrCat("mmap(", path, ")"));
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(path, static_cast<uint8_t*>(data), st.st_size, /*owner=*/false));
}

ShmSegment::~ShmSegment() {
  munmap(data_, static_cast<size_t>(size_));
  if (owner_) unlink(name_.c_str());
}

absl::StatusOr<std::unique_ptr<ShmDirectory>> ShmDirectory::Create(uid_t uid, pid_t pid,
                                                                   const std::string& tag,
                                                                   std::optional<gid_t> group) {
  const std::string path = absl::StrCat(kShmRoot, "/paramd.", uid, ".", pid, ".", tag);
  if (mkdir(path.c_str(), S_IRWXU) != 0) {
    return ErrnoError(errno, absl::StrCat("mkdir(", path, ")"));
  }
  int error = 0;
  if (group.has_value() && chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0) error = errno;
  // Members of the group may open what they are told of, never list it.
  const mode_t mode = group.has_value() ? (S_IRWXU | S_IXGRP) : S_IRWXU;
  if (error == 0 && chmod(path.c_str(), mode) != 0) error = errno;
  if (error != 0) {
    rmdir(path.c_str());
    return ErrnoError(error, absl::StrCat("setting the owner and mode of ", path));
  }
  return std::unique_ptr<ShmDirectory>(new ShmDirectory(path, group));
}

ShmDirectory::~ShmDirectory() { RemoveDirectory(path_); }

std::string RandomShmTag() {
  std::random_device random;
  std::string tag;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&tag, absl::Hex(static_cast<uint32_t>(random()), absl::kZeroPad8));
  }
  return tag;
}

int ReclaimStaleShmSegments(uid_t uid) {
  DIR* dir = opendir(kShmRoot);
  if (dir == nullptr) return 0;
  const std::string mine = absl::StrCat("paramd.", uid, ".");
  int removed = 0;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(mine, 0) != 0) continue;
    // A directory "paramd.<uid>.<pid>.<tag>", or a bare segment "paramd.<uid>.<pid>.<tag>.<index>"
    // of an older daemon.
    const std::vector<std::string> parts = absl::StrSplit(name, '.');
    int pid = 0;
    if ((parts.size() != 4 && parts.size() != 5) || !absl::SimpleAtoi(parts[2], &pid) || pid <= 0) {
      continue;
    }
    // ESRCH: no such process, so nobody owns the segment any more. (EPERM means it runs.)
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    const std::string path = absl::StrCat(kShmRoot, "/", name);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || st.st_uid != uid) continue;
    if (S_ISDIR(st.st_mode)) {
      removed += RemoveDirectory(path);
    } else if (S_ISREG(st.st_mode) && unlink(path.c_str()) == 0) {
      ++removed;
    }
  }
  closedir(dir);
  return removed;
}

}  // namespace paramd
