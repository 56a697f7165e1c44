// ReadCheckpoint (server/state/checkpoint.h) on its own: a checkpoint's records come back whole and
// in order through read buffers they do not line up with, with O_DIRECT on a disk, through the page
// cache, and on tmpfs; their data is handed on as a view; a file cut inside a record, a record of
// impossible length, a record that does not parse and a flipped bit are refused naming the file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "server/state/checkpoint.h"

namespace paramd {
namespace {

// The data of a chunk at most; records are this and a little more.
constexpr int64_t kMaxData = 64 << 10;

// Where a test's checkpoints are, and how they are read.
struct Place {
  const char* name;
  const char* parent;
  bool direct;  // CheckpointReadOptions::direct
};

void PrintTo(const Place& place, std::ostream* os) { *os << place.name; }

class CheckpointReadTest : public ::testing::TestWithParam<Place> {
 protected:
  void SetUp() override {
    std::string dir = std::string(GetParam().parent) + "/paramd-checkpoint-read-test-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) GTEST_SKIP() << "no " << GetParam().parent << " here";
    root_ = dir;
  }
  void TearDown() override {
    if (!root_.empty()) std::system(("rm -rf " + root_).c_str());
  }

  // The smallest read buffers (one record's worth), so the records cross from one into the next.
  CheckpointReadOptions Options() const { return {.buffer_bytes = 1, .direct = GetParam().direct}; }

  // The header, then `count` chunks whose data sizes line up with neither blocks nor buffers (0 to
  // kMaxData bytes, primes among them), of random bytes.
  static std::vector<v1::StateChunk> Stream(int count) {
    std::vector<v1::StateChunk> chunks(1);
    chunks[0].mutable_header()->set_job("reader");
    chunks[0].mutable_header()->set_next_step(7);
    const int64_t sizes[] = {1, 4093, 4096, 4099, kMaxData, 30011, 0, 8191, kMaxData - 1, 17};
    std::mt19937 random(1);
    for (int i = 0; i < count; ++i) {
      v1::StateChunk& chunk = chunks.emplace_back();
      chunk.mutable_field()->set_tensor("t" + std::to_string(i));
      chunk.mutable_field()->set_field("master");
      chunk.set_offset(i);
      std::string data(static_cast<size_t>(sizes[i % std::size(sizes)]), '\0');
      for (char& byte : data) byte = static_cast<char>(random());
      chunk.set_data(std::move(data));
    }
    return chunks;
  }

  // Writes `chunks` as a checkpoint with the daemon's writer, in files of about `file_bytes`.
  absl::StatusOr<std::string> Write(std::vector<v1::StateChunk> chunks, int64_t file_bytes) {
    v1::RegisterRequest registration;
    registration.set_job("reader");
    absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer =
        CheckpointWriter::Start(root_, registration, file_bytes, 4 * kMaxData);
    if (!writer.ok()) return writer.status();
    for (v1::StateChunk& chunk : chunks) {
      if (absl::Status added = (*writer)->Add(&chunk); !added.ok()) return added;
    }
    return (*writer)->Finish();
  }

  // The bytes of a state file holding `records` (serialized chunks, or any bytes).
  static std::string FileOf(const std::vector<std::string>& records) {
    std::string file;
    for (const std::string& record : records) {
      const uint32_t size = static_cast<uint32_t>(record.size());
      for (int shift = 0; shift < 32; shift += 8) file.push_back(static_cast<char>(size >> shift));
      file += record;
    }
    return file;
  }

  // A checkpoint directory holding `files` as they are, its manifest listing their true sizes
  // and CRCs: damage in them is for the reader's own checks of their records to find.
  std::string WriteDir(const std::vector<std::string>& files) {
    const std::string dir = root_ + "/step-000000000007";
    EXPECT_EQ(mkdir(dir.c_str(), 0700), 0);
    v1::CheckpointManifest manifest;
    manifest.set_format(kCheckpointFormat);
    for (size_t i = 0; i < files.size(); ++i) {
      v1::CheckpointFile* file = manifest.add_files();
      file->set_name("state-0000" + std::to_string(i) + ".bin");
      file->set_bytes(static_cast<int64_t>(files[i].size()));
      file->set_crc32c(Crc32c(0, files[i].data(), files[i].size()));
      std::ofstream(dir + "/" + file->name(), std::ios::binary) << files[i];
    }
    std::ofstream(dir + "/" + kCheckpointManifest, std::ios::binary)
        << manifest.SerializeAsString();
    return dir;
  }

  // The checkpoint's chunks as ReadCheckpoint hands them on, each with its data put back.
  absl::StatusOr<std::vector<v1::StateChunk>> Read(const std::string& dir) {
    std::vector<v1::StateChunk> read;
    absl::StatusOr<v1::CheckpointManifest> manifest = ReadCheckpoint(
        dir, kMaxData,
        [&](const v1::StateChunk& chunk, std::string_view data) {
          EXPECT_TRUE(chunk.data().empty()) << "the data comes apart, as a view";
          read.push_back(chunk);
          read.back().set_data(std::string(data));
          return absl::OkStatus();
        },
        Options());
    if (!manifest.ok()) return manifest.status();
    return read;
  }

  // A refusal of the checkpoint in `dir`: DATA_LOSS, its message holding `what`.
  void ExpectRefused(const std::string& dir, const std::string& what) {
    absl::StatusOr<std::vector<v1::StateChunk>> read = Read(dir);
    ASSERT_FALSE(read.ok());
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
    EXPECT_NE(read.status().message().find(what), std::string::npos)
        << read.status() << "\nexpected: " << what;
  }

  static std::vector<std::string> Serialized(const std::vector<v1::StateChunk>& chunks) {
    std::vector<std::string> records;
    for (const v1::StateChunk& chunk : chunks) records.push_back(chunk.SerializeAsString());
    return records;
  }

  // Where each of `records` starts in FileOf(records).
  static std::vector<int64_t> Offsets(const std::vector<std::string>& records) {
    std::vector<int64_t> at;
    int64_t offset = 0;
    for (const std::string& record : records) {
      at.push_back(offset);
      offset += 4 + static_cast<int64_t>(record.size());
    }
    return at;
  }

  std::string root_;
};

TEST_P(CheckpointReadTest, RecordsComeBackWholeAndInOrderAcrossReadBuffers) {
  // About 3.5 MiB in files of 1 MiB, read through buffers of about 132 KiB.
  const std::vector<v1::StateChunk> chunks = Stream(200);
  absl::StatusOr<std::string> dir = Write(chunks, 1 << 20);
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::vector<v1::StateChunk>> read = Read(*dir);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ((*read)[i].SerializeAsString(), chunks[i].SerializeAsString()) << "chunk " << i;
  }
  // Buffers of the default size (several records each) read the same.
  std::vector<v1::StateChunk> default_read;
  ASSERT_TRUE(
      ReadCheckpoint(*dir, kMaxData, [&](const v1::StateChunk& chunk, std::string_view data) {
        default_read.push_back(chunk);
        default_read.back().set_data(std::string(data));
        return absl::OkStatus();
      }).ok());
  EXPECT_EQ(Serialized(default_read), Serialized(chunks));
}

TEST_P(CheckpointReadTest, AFileCutInsideARecordIsRefusedNamingItAndTheRecord) {
  const std::vector<std::string> records = Serialized(Stream(20));
  const std::vector<int64_t> at = Offsets(records);
  const std::string file = FileOf(records);
  const std::string named = "state-00000.bin\" ";
  // The manifest agrees with the cut file: the records' bounds tell. Cut inside record 5's bytes
  // (it runs past the end), then inside its length.
  std::string dir = WriteDir({file.substr(0, static_cast<size_t>(at[5] + 4 + 1000))});
  ExpectRefused(dir, named + "has a record of " + std::to_string(records[5].size()) +
                         " bytes at byte " + std::to_string(at[5]));
  std::system(("rm -rf " + dir).c_str());
  dir = WriteDir({file.substr(0, static_cast<size_t>(at[5] + 2))});
  ExpectRefused(dir, named + "ends inside a record at byte " + std::to_string(at[5]));
}

TEST_P(CheckpointReadTest, ARecordLongerThanTheLimitOrTheFileIsRefused) {
  const std::vector<std::string> records = Serialized(Stream(20));
  const std::vector<int64_t> at = Offsets(records);
  // Over the limit (the largest chunk and its message); then one byte past the file's end, where
  // record 5 is the file's last.
  for (const uint32_t length : {0x7fffffffu, static_cast<uint32_t>(records[5].size() + 1)}) {
    SCOPED_TRACE(length);
    std::string file = FileOf(records);
    if (length < 0x7fffffffu) file.resize(static_cast<size_t>(at[6]));
    for (int shift = 0; shift < 32; shift += 8) {
      file[static_cast<size_t>(at[5] + shift / 8)] = static_cast<char>(length >> shift);
    }
    const std::string dir = WriteDir({file});
    ExpectRefused(dir, "state-00000.bin\" has a record of " + std::to_string(length) +
                           " bytes at byte " + std::to_string(at[5]));
    std::system(("rm -rf " + dir).c_str());
  }
}

TEST_P(CheckpointReadTest, ARecordThatDoesNotParseIsRefusedNamingItsOffset) {
  std::vector<std::string> records = Serialized(Stream(8));
  // A field of wire type 7 (there is none), and a `data` (field 4) of 16 bytes with 2 left.
  const std::string no_wire_type = "\x0f";
  const std::string data_past_the_end = {'\x22', '\x10', 'a', 'b'};
  for (const std::string& bad : {no_wire_type, data_past_the_end}) {
    records[4] = bad;
    const std::string dir = WriteDir({FileOf(records)});
    ExpectRefused(dir, "state-00000.bin\" has a record at byte " +
                           std::to_string(Offsets(records)[4]) + " that does not parse");
    std::system(("rm -rf " + dir).c_str());
  }
}

TEST_P(CheckpointReadTest, AFlippedBitIsRefusedNamingTheFile) {
  std::vector<v1::StateChunk> chunks = Stream(40);
  absl::StatusOr<std::string> dir = Write(chunks, 1 << 20);
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string path = *dir + "/state-00000.bin";
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // In the middle (records there cross buffers), in the last byte, in a record's length.
  const std::vector<int64_t> at = Offsets(Serialized(chunks));
  for (const int64_t flip : {static_cast<int64_t>(bytes.size() / 2),
                             static_cast<int64_t>(bytes.size() - 1), at[20] + 1}) {
    SCOPED_TRACE(flip);
    std::string flipped = bytes;
    flipped[static_cast<size_t>(flip)] ^= 0x10;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << flipped;
    ExpectRefused(*dir, "state-00000.bin\" ");
  }
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x01;  // inside a record's data: only the CRC-32C tells
  std::ofstream(path, std::ios::binary | std::ios::trunc) << flipped;
  ExpectRefused(*dir, "state-00000.bin\" has CRC-32C");
}

// The writer puts `data` last; a record with fields after it, or two of them, is a StateChunk all
// the same and reads as a parse of it does (the last `data` counts).
TEST_P(CheckpointReadTest, DataAnywhereInARecordReadsAsAParse) {
  v1::StateChunk head, tail, first_data, last_data;
  head.mutable_field()->set_tensor("w");
  head.mutable_field()->set_field("exp_avg");
  first_data.set_data("first");
  tail.set_offset(12);
  last_data.set_data(std::string(5000, 'x'));
  const std::vector<std::string> records = {
      last_data.SerializeAsString() + head.SerializeAsString(),
      head.SerializeAsString() + first_data.SerializeAsString() + tail.SerializeAsString() +
          last_data.SerializeAsString(),
      first_data.SerializeAsString() + tail.SerializeAsString()};
  const std::string dir = WriteDir({FileOf(records)});
  absl::StatusOr<std::vector<v1::StateChunk>> read = Read(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    v1::StateChunk parsed;
    ASSERT_TRUE(parsed.ParseFromString(records[i]));
    EXPECT_EQ((*read)[i].SerializeAsString(), parsed.SerializeAsString()) << "record " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Places, CheckpointReadTest,
                         ::testing::Values(Place{"DiskDirect", "/tmp", true},
                                           Place{"DiskThroughThePageCache", "/tmp", false},
                                           Place{"Tmpfs", "/dev/shm", true}),
                         [](const ::testing::TestParamInfo<Place>& p) { return p.param.name; });

// The pages of `path` in the page cache.
int64_t CachedPages(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) return -1;
  void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return -1;
  const long page = sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> resident(static_cast<size_t>((st.st_size + page - 1) / page));
  const int rc = mincore(map, static_cast<size_t>(st.st_size), resident.data());
  munmap(map, static_cast<size_t>(st.st_size));
  if (rc != 0) return -1;
  int64_t pages = 0;
  for (unsigned char r : resident) pages += r & 1;
  return pages;
}

// Dropped from the page cache (clean pages).
void Evict(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  close(fd);
}

TEST(CheckpointReadPageCacheTest, DirectReadsLeaveThePageCacheAlone) {
  char root[] = "/tmp/paramd-checkpoint-read-test-XXXXXX";
  ASSERT_NE(mkdtemp(root), nullptr);
  struct statfs fs;
  ASSERT_EQ(statfs(root, &fs), 0);
  const std::string probe = std::string(root) + "/probe";
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
  if (fd >= 0) close(fd);
  if (fs.f_type == TMPFS_MAGIC || fd < 0) {
    std::system((std::string("rm -rf ") + root).c_str());
    GTEST_SKIP() << "/tmp is not a filesystem that reads with O_DIRECT";
  }
  v1::RegisterRequest registration;
  registration.set_job("reader");
  absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer =
      CheckpointWriter::Start(root, registration, 1 << 20, 1 << 20);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int i = 0; i < 40; ++i) {
    v1::StateChunk chunk;
    if (i == 0) chunk.mutable_header()->set_next_step(7);
    chunk.set_data(std::string(static_cast<size_t>(50000 + i), static_cast<char>(i)));
    ASSERT_TRUE((*writer)->Add(&chunk).ok());
  }
  absl::StatusOr<std::string> dir = (*writer)->Finish();
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string file = *dir + "/state-00000.bin";
  const auto read = [&](bool direct) {
    CheckpointReadOptions options;
    options.direct = direct;
    return ReadCheckpoint(
               *dir, kMaxData,
               [](const v1::StateChunk&, std::string_view) { return absl::OkStatus(); }, options)
        .status();
  };
  Evict(file);
  ASSERT_TRUE(read(/*direct=*/true).ok());
  EXPECT_EQ(CachedPages(file), 0);
  ASSERT_TRUE(read(/*direct=*/false).ok());
  EXPECT_GT(CachedPages(file), 0);
  std::system((std::string("rm -rf ") + root).c_str());
}

}  // namespace
}  // namespace paramd
