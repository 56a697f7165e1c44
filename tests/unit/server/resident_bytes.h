// This process's resident set, for the tests that hold memory to a formula.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>

namespace paramd::testing {

// Resident bytes of this process: the second field of /proc/self/statm, in pages; -1 where it
// cannot be read.
inline int64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long long size = 0, resident = 0;
  const int read = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return read == 2 ? resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : -1;
}

}  // namespace paramd::testing
