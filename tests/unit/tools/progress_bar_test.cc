// paramctl's progress bar rendered from bytes done, in all, and seconds: the whole line, and its
// edges (nothing done, all done, more than all, nothing to do, no time yet, no bar).
#include "tools/progress_bar.h"

#include <gtest/gtest.h>

namespace paramd {
namespace {

TEST(ProgressLineTest, DrawsTheBarPercentMegabytesAndRate) {
  EXPECT_EQ(ProgressLine("checkpoint mlp", 512'000'000, 1'024'000'000, 2.0, 10),
            "checkpoint mlp [#####-----]  50.0%  512.0/1024.0 MB  256.0 MB/s");
}

TEST(ProgressLineTest, FillsACellOnlyOnceItIsWhollyDone) {
  EXPECT_EQ(ProgressLine("restore j", 199, 1000, 1.0, 5),
            "restore j [-----]  19.9%  0.0/0.0 MB  0.0 MB/s");
  EXPECT_EQ(ProgressLine("restore j", 200, 1000, 1.0, 5),
            "restore j [#----]  20.0%  0.0/0.0 MB  0.0 MB/s");
}

TEST(ProgressLineTest, ReadsOneHundredPercentOnlyWhenAllIsDone) {
  EXPECT_EQ(ProgressLine("x", 9'999, 10'000, 1.0, 4), "x [###-]  99.9%  0.0/0.0 MB  0.0 MB/s");
}

TEST(ProgressLineTest, StartsEmptyAndEndsFull) {
  EXPECT_EQ(ProgressLine("x", 0, 3'000'000, 0.5, 4), "x [----]   0.0%  0.0/3.0 MB  0.0 MB/s");
  EXPECT_EQ(ProgressLine("x", 3'000'000, 3'000'000, 0.5, 4),
            "x [####] 100.0%  3.0/3.0 MB  6.0 MB/s");
}

TEST(ProgressLineTest, DoneIsTakenBetweenZeroAndTheTotal) {
  EXPECT_EQ(ProgressLine("x", 5'000'000, 3'000'000, 1.0, 4),
            ProgressLine("x", 3'000'000, 3'000'000, 1.0, 4));
  EXPECT_EQ(ProgressLine("x", -1, 3'000'000, 1.0, 4), ProgressLine("x", 0, 3'000'000, 1.0, 4));
}

TEST(ProgressLineTest, NothingToDoAndNoTimeYetReadZero) {
  EXPECT_EQ(ProgressLine("x", 10, 0, 1.0, 4), "x [----]   0.0%  0.0/0.0 MB  0.0 MB/s");
  EXPECT_EQ(ProgressLine("x", 1'000'000, 2'000'000, 0.0, 4),
            "x [##--]  50.0%  1.0/2.0 MB  0.0 MB/s");
}

TEST(ProgressLineTest, AWidthOfZeroDrawsNoCells) {
  EXPECT_EQ(ProgressLine("x", 1, 2, 1.0, 0), "x []  50.0%  0.0/0.0 MB  0.0 MB/s");
}

TEST(ProgressLineTest, TheDefaultBarHasThirtyCells) {
  const std::string line = ProgressLine("x", 1, 2, 1.0);
  EXPECT_EQ(line.substr(0, 34), "x [###############---------------]");
}

}  // namespace
}  // namespace paramd
