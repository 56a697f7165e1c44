// What the checkpoint's writing (checkpoint.cc) and reading (checkpoint_read.cc) halves share of
// POSIX files: the error of a failed call, and leaving O_DIRECT for the page cache.
#pragma once

#include <fcntl.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace paramd {

// O_DIRECT transfers: block-aligned offsets, sizes and memory.
inline constexpr size_t kDirectAlign = 4096;

// INTERNAL for a failed call on `path`, with errno's text: "cannot read "PATH": ...".
inline absl::Status FileError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " \"", path, "\": ", std::strerror(errno)));
}

// Turns O_DIRECT off on `fd`: later transfers go through the page cache.
inline absl::Status EndDirect(int fd, const std::string& what, const std::string& path) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) return FileError(what, path);
  return absl::OkStatus();
}

}  // namespace paramd
