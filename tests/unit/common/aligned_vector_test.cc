// common/aligned_vector.h: small arrays on cache lines; large ones on 2 MiB boundaries, marked
// for transparent huge pages in the kernel's own account of the mapping (/proc/self/smaps).
#include "common/aligned_vector.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace paramd {
namespace {

// The VmFlags line of the mapping of /proc/self/smaps that holds `p`, or "" if none does.
std::string VmFlagsOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= address && address < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(AlignedVectorTest, SmallArraysStartOnACacheLine) {
  for (size_t n : {1, 17, 1000, 100000}) {
    AlignedVector<float> v(n, 1.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u) << n;
    EXPECT_EQ(v[n - 1], 1.0f);
  }
}

TEST(AlignedVectorTest, LargeArraysStartOnAHugePageAndAskForHugePages) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string setting;
  std::getline(thp, setting);
  AlignedVector<float> v((size_t{5} << 20) + 3, 2.0f);  // 20 MiB and a bit
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % (size_t{2} << 20), 0u);
  EXPECT_EQ(v.back(), 2.0f);
  if (setting.empty() || setting.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are off on this kernel ("
                 << (setting.empty() ? "no setting" : setting) << "): the advice is refused";
  }
  const std::string flags = VmFlagsOf(v.data());
  ASSERT_FALSE(flags.empty()) << "no mapping in /proc/self/smaps holds the array";
  EXPECT_NE((flags + " ").find(" hg "), std::string::npos) << flags;
}

}  // namespace
}  // namespace paramd
