#include "transport/shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

}  // namespace

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name,
                                                               int64_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, S_IRUSR | S_IWUSR);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("shm_open(", name, ", O_CREAT | O_EXCL)"));
  // The mode given to shm_open is masked by the umask; set it exactly.
  int error = fchmod(fd, S_IRUSR | S_IWUSR) == 0 ? 0 : errno;
  // posix_fallocate reserves the pages now: a /dev/shm too small fails here with ENOSPC.
  if (error == 0) error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* data = MAP_FAILED;
  if (error == 0) {
    data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) error = errno;
  }
  close(fd);
  if (error != 0) {
    shm_unlink(name.c_str());
    return ErrnoError(error, absl::StrCat("reserving ", bytes, " bytes of shared memory for ", name,
                                          " (is /dev/shm large enough?)"));
  }
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(name, static_cast<uint8_t*>(data), bytes, /*owner=*/true));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& name,
                                                             bool writable) {
  const int fd = shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("shm_open(", name, ")"));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoError(error, absl::StrCat("fstat(", name, ")"));
  }
  void* data = mmap(nullptr, static_cast<size_t>(st.st_size),
                    writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (data == MAP_FAILED) return ErrnoError(error, absl::StrCat("mmap(", name, ")"));
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(name, static_cast<uint8_t*>(data), st.st_size, /*owner=*/false));
}

ShmSegment::~ShmSegment() {
  munmap(data_, static_cast<size_t>(size_));
  if (owner_) shm_unlink(name_.c_str());
}

std::string ShmSegmentPrefix(uid_t uid, pid_t pid, const std::string& tag) {
  return absl::StrCat("/paramd.", uid, ".", pid, ".", tag, ".");
}

int ReclaimStaleShmSegments(uid_t uid) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  const std::string mine = absl::StrCat("paramd.", uid, ".");
  int removed = 0;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(mine, 0) != 0) continue;
    const std::vector<std::string> parts = absl::StrSplit(name, '.');
    int pid = 0;
    if (parts.size() != 5 || !absl::SimpleAtoi(parts[2], &pid) || pid <= 0) continue;
    // ESRCH: no such process, so nobody owns the segment any more. (EPERM means it runs.)
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace paramd
