// The shared-memory arena: buffers carved from POSIX segments, aligned, reused after free with
// neighbours coalesced, a new segment only when none has room, every name removed at the end.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "transport/shm/arena.h"

namespace paramd {
namespace {

constexpr int64_t kMiB = 1 << 20;

// This process's directory of segments (removed at exit).
const ShmDirectory& Directory() {
  static const std::unique_ptr<ShmDirectory> directory = [] {
    absl::StatusOr<std::unique_ptr<ShmDirectory>> made =
        ShmDirectory::Create(getuid(), getpid(), RandomShmTag());
    PARAMD_CHECK(made.ok()) << made.status();
    return *std::move(made);
  }();
  return *directory;
}

std::unique_ptr<ShmArena> NewArena(int64_t segment_bytes, uint64_t probe = 42) {
  absl::StatusOr<std::unique_ptr<ShmArena>> arena = ShmArena::Create(
      absl::StrCat(Directory().path(), "/", RandomShmTag(), "."), segment_bytes, probe);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return arena.ok() ? *std::move(arena) : nullptr;
}

HostBuffer Take(ShmArena& arena, int64_t bytes) {
  absl::StatusOr<HostBuffer> buffer = arena.Allocate(bytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  return buffer.ok() ? *std::move(buffer) : HostBuffer();
}

TEST(ShmArenaTest, TheFirstSegmentHoldsTheProbe) {
  std::unique_ptr<ShmArena> arena = NewArena(2 * kMiB, 0x1234567890abcdefull);
  ASSERT_NE(arena, nullptr);
  ASSERT_EQ(arena->segment_names().size(), 1u);
  absl::StatusOr<std::unique_ptr<ShmSegment>> mapped =
      ShmSegment::Open(arena->segment_names()[0], /*writable=*/false);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  uint64_t probe = 0;
  std::memcpy(&probe, (*mapped)->data(), sizeof(probe));
  EXPECT_EQ(probe, arena->probe());
}

TEST(ShmArenaTest, BuffersAreAlignedZeroedDisjointAndVisibleThroughTheSegment) {
  std::unique_ptr<ShmArena> arena = NewArena(4 * kMiB);
  ASSERT_NE(arena, nullptr);
  std::vector<HostBuffer> buffers;
  for (int64_t bytes : {1, 63, 64, 1000, 65536, 100000, 7}) {
    buffers.push_back(Take(*arena, bytes));
    const HostBuffer& b = buffers.back();
    ASSERT_NE(b.place(), nullptr);
    EXPECT_EQ(b.size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (bytes >= 65536 ? 4096 : 64), 0u) << bytes;
    for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(b.data()[i], 0) << bytes;
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    std::memset(buffers[i].data(), static_cast<int>(i + 1), static_cast<size_t>(buffers[i].size()));
  }
  // Each buffer is where its place says, with only its own bytes.
  absl::StatusOr<std::unique_ptr<ShmSegment>> mapped =
      ShmSegment::Open(arena->segment_names()[0], /*writable=*/false);
  ASSERT_TRUE(mapped.ok());
  for (size_t i = 0; i < buffers.size(); ++i) {
    const uint8_t* there = (*mapped)->data() + buffers[i].place()->offset;
    for (int64_t j = 0; j < buffers[i].size(); ++j) ASSERT_EQ(there[j], i + 1) << i;
  }
}

TEST(ShmArenaTest, FreedNeighboursCoalesceAndAreReusedBeforeANewSegment) {
  std::unique_ptr<ShmArena> arena = NewArena(2 * kMiB);
  ASSERT_NE(arena, nullptr);
  const int64_t before = arena->used_bytes();
  {
    HostBuffer a = Take(*arena, 512 * 1024);
    HostBuffer b = Take(*arena, 512 * 1024);
    HostBuffer c = Take(*arena, 512 * 1024);
    EXPECT_EQ(arena->segment_names().size(), 1u);
  }
  EXPECT_EQ(arena->used_bytes(), before);
  // The three freed ranges merged: one buffer of their joint size fits without a new segment.
  HostBuffer joint = Take(*arena, 3 * 512 * 1024);
  EXPECT_EQ(arena->segment_names().size(), 1u);
  EXPECT_EQ(joint.place()->region, 0);
}

TEST(ShmArenaTest, ABufferBiggerThanASegmentGetsASegmentOfItsOwnAndNamesGoAtTheEnd) {
  std::vector<std::string> names;
  {
    std::unique_ptr<ShmArena> arena = NewArena(2 * kMiB);
    ASSERT_NE(arena, nullptr);
    HostBuffer big = Take(*arena, 5 * kMiB + 3);
    EXPECT_EQ(big.place()->region, 1);
    EXPECT_GE(arena->reserved_bytes(), 2 * kMiB + 5 * kMiB);
    names = arena->segment_names();
    ASSERT_EQ(names.size(), 2u);
    for (const std::string& name : names) {
      EXPECT_TRUE(std::filesystem::exists(name)) << name;
    }
  }
  for (const std::string& name : names) {
    EXPECT_FALSE(std::filesystem::exists(name)) << name;
  }
}

TEST(ShmArenaTest, AReservationLargerThanSharedMemoryIsResourceExhausted) {
  std::unique_ptr<ShmArena> arena = NewArena(2 * kMiB);
  ASSERT_NE(arena, nullptr);
  // Far beyond any /dev/shm: refused at allocation, not a SIGBUS on first touch.
  absl::StatusOr<HostBuffer> huge = arena->Allocate(int64_t{1} << 50);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_EQ(arena->segment_names().size(), 1u);
}

TEST(ShmDirectoryTest, IsOwnerOnlyOrTraversableByItsGroupAndItsSegmentsFollow) {
  const std::string tag = RandomShmTag();
  EXPECT_EQ(tag.size(), 32u);
  EXPECT_NE(tag, RandomShmTag());
  struct stat st;
  {
    absl::StatusOr<std::unique_ptr<ShmDirectory>> own =
        ShmDirectory::Create(getuid(), getpid(), tag);
    ASSERT_TRUE(own.ok()) << own.status();
    ASSERT_EQ(stat((*own)->path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    absl::StatusOr<std::unique_ptr<ShmSegment>> segment =
        ShmSegment::Create((*own)->path() + "/s.0", 2 * kMiB);
    ASSERT_TRUE(segment.ok()) << segment.status();
    ASSERT_EQ(stat((*segment)->name().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  // The group may traverse the directory and open a segment it is told of, never list them.
  absl::StatusOr<std::unique_ptr<ShmDirectory>> shared =
      ShmDirectory::Create(getuid(), getpid(), RandomShmTag(), getgid());
  ASSERT_TRUE(shared.ok()) << shared.status();
  ASSERT_EQ(stat((*shared)->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0710u);
  EXPECT_EQ(st.st_gid, getgid());
  absl::StatusOr<std::unique_ptr<ShmSegment>> segment =
      ShmSegment::Create((*shared)->path() + "/s.0", 2 * kMiB, getgid());
  ASSERT_TRUE(segment.ok()) << segment.status();
  ASSERT_EQ(stat((*segment)->name().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, getgid());
  const std::string path = (*shared)->path();
  segment->reset();
  shared->reset();
  EXPECT_FALSE(std::filesystem::exists(path)) << "a directory outlived its owner";
}

}  // namespace
}  // namespace paramd
