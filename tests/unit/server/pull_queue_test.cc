// PullQueue on its own: a pull's tensors begin in the order they were published, the last one is
// told, and removing the waiters leaves those whose callbacks are on their way.
#include "server/rpc/pull_queue.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <set>

namespace paramd {
namespace {

TEST(PullQueueTest, BeginsTensorsInTheOrderTheyArePublishedAndTellsTheLast) {
  PullQueue queue(3);
  queue.Ready(1);
  queue.Wait(0, 10);
  queue.Wait(2, 12);
  EXPECT_TRUE(queue.waiting());

  std::optional<PullQueue::Next> next = queue.Take();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->index, 1u);
  EXPECT_FALSE(next->last);
  EXPECT_FALSE(queue.Take().has_value());  // none ready

  queue.Fired(2);
  queue.Ready(2);
  queue.Fired(0);
  queue.Ready(0);
  EXPECT_FALSE(queue.waiting());
  next = queue.Take();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->index, 2u);
  EXPECT_FALSE(next->last);
  EXPECT_FALSE(queue.all_begun());
  next = queue.Take();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->index, 0u);
  EXPECT_TRUE(next->last);
  EXPECT_TRUE(queue.all_begun());
}

TEST(PullQueueTest, RemovingWaitersKeepsThoseWhoseCallbacksAreOnTheirWay) {
  PullQueue queue(3);
  queue.Wait(0, 10);
  queue.Wait(1, 11);
  queue.Wait(2, 12);
  const std::set<uint64_t> fired = {11};  // the job no longer has it: its callback runs
  std::set<uint64_t> asked;
  const auto remove = [&](uint64_t waiter) {
    asked.insert(waiter);
    return !fired.contains(waiter);
  };
  EXPECT_FALSE(queue.RemoveWaiters(remove));
  EXPECT_EQ(asked, (std::set<uint64_t>{10, 11, 12}));
  EXPECT_TRUE(queue.waiting());

  asked.clear();
  queue.Fired(1);  // the callback arrived
  EXPECT_TRUE(queue.RemoveWaiters(remove));
  EXPECT_TRUE(asked.empty());  // nothing left to remove
  EXPECT_FALSE(queue.waiting());
}

TEST(PullQueueTest, AnEmptyQueueHasNothingToBeginOrRemove) {
  PullQueue queue(1);
  EXPECT_FALSE(queue.Take().has_value());
  EXPECT_FALSE(queue.waiting());
  EXPECT_TRUE(queue.RemoveWaiters([](uint64_t) { return true; }));
  EXPECT_FALSE(queue.all_begun());
}

}  // namespace
}  // namespace paramd
