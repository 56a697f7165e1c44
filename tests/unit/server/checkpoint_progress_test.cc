// CheckpointProgress on its own, with an injected clock: what Status reports of a checkpoint
// being written or restored (JobStatus.checkpoint_progress), per job, for as long as its Tracked
// lives.
#include "server/state/checkpoint_progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <utility>

namespace paramd {
namespace {

using namespace std::chrono_literals;

class CheckpointProgressTest : public ::testing::Test {
 protected:
  std::chrono::steady_clock::time_point now_{};
  CheckpointProgress progress_{[this] { return now_; }};
};

TEST_F(CheckpointProgressTest, NothingUnderWayReportsNothing) {
  EXPECT_FALSE(progress_.Of("job").has_value());
}

TEST_F(CheckpointProgressTest, ReportsTheOperationItsBytesAndTheTimeSinceItBegan) {
  CheckpointProgress::Tracked write = progress_.Begin("job", v1::CHECKPOINT_OPERATION_WRITE, 1000);
  now_ += 1500ms;
  write.Update(250);
  std::optional<v1::CheckpointProgress> p = progress_.Of("job");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->operation(), v1::CHECKPOINT_OPERATION_WRITE);
  EXPECT_EQ(p->bytes_done(), 250);
  EXPECT_EQ(p->bytes_total(), 1000);
  EXPECT_DOUBLE_EQ(p->seconds(), 1.5);
  EXPECT_FALSE(progress_.Of("other").has_value());
}

TEST_F(CheckpointProgressTest, BytesDoneStayBetweenZeroAndTheTotal) {
  CheckpointProgress::Tracked restore =
      progress_.Begin("job", v1::CHECKPOINT_OPERATION_RESTORE, 1000);
  restore.Update(1200);  // a write's stream has a few bytes beyond the job's state bytes
  EXPECT_EQ(progress_.Of("job")->bytes_done(), 1000);
  restore.Update(-5);
  EXPECT_EQ(progress_.Of("job")->bytes_done(), 0);
  CheckpointProgress::Tracked empty = progress_.Begin("none", v1::CHECKPOINT_OPERATION_WRITE, -1);
  empty.Update(10);
  EXPECT_EQ(progress_.Of("none")->bytes_total(), 0);
  EXPECT_EQ(progress_.Of("none")->bytes_done(), 0);
}

TEST_F(CheckpointProgressTest, TheEntryGoesWithItsTrackedAndMovesWithIt) {
  std::optional<CheckpointProgress::Tracked> outer;
  {
    CheckpointProgress::Tracked tracked =
        progress_.Begin("job", v1::CHECKPOINT_OPERATION_WRITE, 10);
    tracked.Update(3);
    outer.emplace(std::move(tracked));
  }  // the moved-from one leaves the entry alone
  ASSERT_TRUE(progress_.Of("job").has_value());
  outer->Update(7);
  EXPECT_EQ(progress_.Of("job")->bytes_done(), 7);
  outer.reset();
  EXPECT_FALSE(progress_.Of("job").has_value());
}

TEST_F(CheckpointProgressTest, AJobReportsTheOperationThatBeganFirst) {
  CheckpointProgress::Tracked first = progress_.Begin("a", v1::CHECKPOINT_OPERATION_WRITE, 100);
  CheckpointProgress::Tracked other = progress_.Begin("b", v1::CHECKPOINT_OPERATION_RESTORE, 5);
  std::optional<CheckpointProgress::Tracked> second =
      progress_.Begin("a", v1::CHECKPOINT_OPERATION_RESTORE, 200);
  EXPECT_EQ(progress_.Of("a")->bytes_total(), 100);
  EXPECT_EQ(progress_.Of("b")->operation(), v1::CHECKPOINT_OPERATION_RESTORE);
  { CheckpointProgress::Tracked gone = std::move(first); }
  EXPECT_EQ(progress_.Of("a")->bytes_total(), 200);
  second.reset();
  EXPECT_FALSE(progress_.Of("a").has_value());
  EXPECT_TRUE(progress_.Of("b").has_value());
}

}  // namespace
}  // namespace paramd
