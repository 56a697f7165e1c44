// ChunkBuffer: chunks of one tensor's bytes arriving in any order, idempotent re-sends, refused
// conflicts and overlaps (DESIGN.md §2, idempotent pushes).
#include "server/job/chunk_buffer.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/unit/server/status_assertions.h"

namespace paramd {
namespace {

using testing::HasStatus;
using Stored = ChunkBuffer::Stored;

std::string Filled(size_t n, char c) { return std::string(n, c); }

TEST(ChunkBufferTest, StoresNewChunksAtTheirOffsets) {
  ChunkBuffer buffer;
  buffer.Reset(HeapBuffer(12));
  EXPECT_EQ(buffer.size(), 12);
  EXPECT_EQ(buffer.received(), 0);
  ASSERT_EQ(buffer.Store(8, "cccc").value(), Stored::kNew);
  ASSERT_EQ(buffer.Store(0, "aaaa").value(), Stored::kNew);
  EXPECT_EQ(buffer.received(), 8);
  EXPECT_FALSE(buffer.complete());
  ASSERT_EQ(buffer.Store(4, "bbbb").value(), Stored::kNew);
  EXPECT_TRUE(buffer.complete());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(buffer.data()), 12), "aaaabbbbcccc");
}

// A buffer that only counts marks of bytes written elsewhere holds no memory, is complete when
// they cover its size, and takes memory again when reset with a buffer.
TEST(ChunkBufferTest, ACountingBufferHoldsNoMemoryAndCountsMarks) {
  ChunkBuffer b;
  b.ResetCounting(64);
  EXPECT_FALSE(b.holds_memory());
  EXPECT_EQ(b.size(), 64);
  EXPECT_EQ(b.data(), nullptr);
  ASSERT_EQ(*b.MarkWritten(0, 64), Stored::kNew);
  EXPECT_TRUE(b.complete());
  EXPECT_EQ(*b.MarkWritten(0, 64), Stored::kDuplicate);
  b.Reset(*HeapAllocator()->Allocate(64));
  EXPECT_TRUE(b.holds_memory());
  EXPECT_EQ(b.received(), 0);
  EXPECT_EQ(b.size(), 64);
}

TEST(ChunkBufferTest, IdenticalChunkIsADuplicateWithoutEffect) {
  ChunkBuffer buffer;
  buffer.Reset(HeapBuffer(8));
  ASSERT_EQ(buffer.Store(0, "abcd").value(), Stored::kNew);
  EXPECT_EQ(buffer.Store(0, "abcd").value(), Stored::kDuplicate);
  EXPECT_EQ(buffer.received(), 4);
  EXPECT_FALSE(buffer.complete());
}

TEST(ChunkBufferTest, DifferentBytesAtTheSamePlaceAreFailedPreconditionAndChangeNothing) {
  ChunkBuffer buffer;
  buffer.Reset(HeapBuffer(8));
  ASSERT_EQ(buffer.Store(4, "abcd").value(), Stored::kNew);
  EXPECT_TRUE(HasStatus(buffer.Store(4, "abce"), absl::StatusCode::kFailedPrecondition,
                        "different chunk of 4 bytes at offset 4"));
  EXPECT_EQ(buffer.received(), 4);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(buffer.data()) + 4, 4), "abcd");
  // The original is still acknowledged as a duplicate.
  EXPECT_EQ(buffer.Store(4, "abcd").value(), Stored::kDuplicate);
}

TEST(ChunkBufferTest, OverlappingChunksAtOtherBoundariesAreFailedPrecondition) {
  ChunkBuffer buffer;
  buffer.Reset(HeapBuffer(16));
  ASSERT_EQ(buffer.Store(4, Filled(8, 'x')).value(), Stored::kNew);  // [4, 12)
  // Overlaps the stored chunk from before, from inside, from after, and around it; and the same
  // offset with another length, even when the overlapping bytes agree.
  EXPECT_TRUE(HasStatus(buffer.Store(0, Filled(8, 'x')), absl::StatusCode::kFailedPrecondition,
                        "overlaps the stored chunk [4, 12)"));
  EXPECT_TRUE(HasStatus(buffer.Store(6, Filled(2, 'x')), absl::StatusCode::kFailedPrecondition,
                        "overlaps"));
  EXPECT_TRUE(HasStatus(buffer.Store(10, Filled(6, 'x')), absl::StatusCode::kFailedPrecondition,
                        "overlaps"));
  EXPECT_TRUE(HasStatus(buffer.Store(0, Filled(16, 'x')), absl::StatusCode::kFailedPrecondition,
                        "overlaps"));
  EXPECT_TRUE(HasStatus(buffer.Store(4, Filled(4, 'x')), absl::StatusCode::kFailedPrecondition,
                        "overlaps"));
  EXPECT_EQ(buffer.received(), 8);
  // Adjacent chunks touch but do not overlap.
  EXPECT_EQ(buffer.Store(0, Filled(4, 'a')).value(), Stored::kNew);
  EXPECT_EQ(buffer.Store(12, Filled(4, 'b')).value(), Stored::kNew);
  EXPECT_TRUE(buffer.complete());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(buffer.data()), 16), "aaaaxxxxxxxxbbbb");
}

TEST(ChunkBufferTest, CompleteOnlyOnceEveryByteArrived) {
  ChunkBuffer buffer;
  buffer.Reset(HeapBuffer(6));
  EXPECT_FALSE(buffer.complete());
  ASSERT_TRUE(buffer.Store(0, "ab").ok());
  ASSERT_TRUE(buffer.Store(4, "ef").ok());
  EXPECT_FALSE(buffer.complete());
  ASSERT_TRUE(buffer.Store(2, "cd").ok());
  EXPECT_TRUE(buffer.complete());
  EXPECT_EQ(buffer.received(), 6);
}

TEST(ChunkBufferTest, ClearForgetsChunksAndKeepsTheMemory) {
  ChunkBuffer buffer;
  buffer.Reset(HeapBuffer(1024));
  ASSERT_TRUE(buffer.Store(0, Filled(1024, 'a')).ok());
  ASSERT_TRUE(buffer.complete());
  const uint8_t* data = buffer.data();

  buffer.Clear();
  EXPECT_EQ(buffer.received(), 0);
  EXPECT_FALSE(buffer.complete());
  EXPECT_EQ(buffer.size(), 1024);
  EXPECT_EQ(buffer.data(), data);  // no reallocation
  // The old chunk is forgotten: other bytes at its place are new, not a conflict.
  EXPECT_EQ(buffer.Store(0, Filled(1024, 'b')).value(), Stored::kNew);
}

TEST(ChunkBufferTest, InPlaceMarksFollowTheChunkRules) {
  ChunkBuffer buffer;
  buffer.Reset(HeapBuffer(16));
  EXPECT_EQ(buffer.MarkWritten(0, 8).value(), Stored::kNew);
  EXPECT_EQ(buffer.MarkWritten(0, 8).value(), Stored::kDuplicate);  // a retry
  EXPECT_EQ(buffer.MarkWritten(4, 8).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(buffer.Store(8, Filled(8, 'x')).value(), Stored::kNew);
  EXPECT_TRUE(buffer.complete());
}

TEST(ChunkBufferTest, EmptyBufferIsComplete) {
  ChunkBuffer buffer;
  buffer.Reset(HeapBuffer(0));
  EXPECT_TRUE(buffer.complete());
  EXPECT_EQ(buffer.size(), 0);
}

}  // namespace
}  // namespace paramd
