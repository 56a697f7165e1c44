// common/aligned_vector.h: small arrays on cache lines; large ones on 2 MiB boundaries, marked
// for transparent huge pages in the kernel's own account of the mapping (/proc/self/smaps); sizing
// leaves the pages untouched, ResizeZeroed zero-fills.
#include "common/aligned_vector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace paramd {
namespace {

// The line starting with `key` of the mapping of /proc/self/smaps that holds `p`, or "" if none
// does.
std::string SmapsLineOf(const void* p, const std::string& key) {
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
    } else if (inside && line.rfind(key, 0) == 0) {
      return line;
    }
  }
  return "";
}

std::string VmFlagsOf(const void* p) { return SmapsLineOf(p, "VmFlags:"); }

// The resident KiB of the mapping that holds `p`, or -1 where smaps does not say.
int64_t ResidentKibOf(const void* p) {
  std::istringstream line(SmapsLineOf(p, "Rss:"));
  std::string key;
  int64_t kib = -1;
  line >> key >> kib;
  return kib;
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

TEST(AlignedVectorTest, SizingLeavesThePagesUntouchedAndResizeZeroedFills) {
  // 64 MiB: a mapping of its own. Sizing writes nothing, so at most the allocator's header page
  // (a huge page where the kernel gives one) is resident; the pass that writes the array faults
  // it in, on whichever threads run it.
  constexpr size_t kBytes = size_t{64} << 20;
  AlignedVector<uint8_t> v;
  v.resize(kBytes);
  const int64_t sized = ResidentKibOf(v.data());
  if (sized < 0) GTEST_SKIP() << "/proc/self/smaps gives no Rss for the array's mapping";
  EXPECT_LE(sized, 4096) << "sizing touched the array's pages";
  std::fill(v.begin(), v.end(), uint8_t{7});
  EXPECT_GE(ResidentKibOf(v.data()), 60 * 1024);

  AlignedVector<int16_t> z(3, 5);
  ResizeZeroed(z, 1000);
  ASSERT_EQ(z.size(), 1000u);
  EXPECT_EQ(z[0], 5);
  EXPECT_EQ(z[2], 5);
  for (size_t i = 3; i < z.size(); ++i) ASSERT_EQ(z[i], 0) << i;
}

}  // namespace
}  // namespace paramd
