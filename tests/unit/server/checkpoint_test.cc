// server/state/checkpoint.h: a job's state written to a checkpoint directory and read back
// continues bit for bit; the writing runs ahead of the disk by its buffer and no further, so steps
// go on while a buffered checkpoint of their version is written; only complete checkpoints are
// listed; a truncated, altered or missing file is refused naming it, and the checkpoint before it
// stays usable.
#include "server/state/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "server/job/job.h"
#include "server/state/state_transfer.h"
#include "tests/unit/server/policy_cases.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/registry_job_harness.h"

namespace paramd {
namespace {

using testing::BitIdentical;
using testing::Cases;
using testing::kDirections;
using testing::kRecipes;
using testing::PolicySpec;
using testing::PolicyWeights;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::RegistryJobHarness;

constexpr int64_t kChunkBytes = 4096;
// The writer's buffer where a test does not say: a few chunks.
constexpr int64_t kBufferBytes = 3 * kChunkBytes;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/paramd-checkpoint-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
  }
  void TearDown() override { std::system(("rm -rf " + root_).c_str()); }

  // The fp8 policy (scaled moments, stochastic rounding, every serve format).
  static v1::RegisterRequest Spec() {
    for (const testing::PolicyCase& c : Cases()) {
      if (c.name == "Fp8BothWithDefaultRounding") return PolicySpec(c);
    }
    return {};
  }

  // Writes `h`'s state as a checkpoint, in files of `file_bytes`.
  absl::StatusOr<std::string> Write(RegistryJobHarness& h, int64_t file_bytes) {
    absl::StatusOr<std::unique_ptr<StateExport>> exporting =
        StateExport::BeginAndWait(ExportOf(h.shared(), [](const StepWork&) {}), kChunkBytes);
    if (!exporting.ok()) return exporting.status();
    absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer =
        CheckpointWriter::Start(root_, h.job().spec(), file_bytes, kBufferBytes);
    if (!writer.ok()) return writer.status();
    for (;;) {
      v1::StateChunk chunk;
      absl::StatusOr<bool> more = (*exporting)->Next(&chunk);
      if (!more.ok()) return more.status();
      if (!*more) break;
      if (absl::Status s = (*writer)->Add(&chunk); !s.ok()) return s;
    }
    return (*writer)->Finish();
  }

  // Reads the checkpoint in `dir` into `h`'s job.
  absl::Status Restore(const std::string& dir, RegistryJobHarness& h) {
    StateImport import(h.job().spec(), kChunkBytes);
    absl::StatusOr<v1::CheckpointManifest> manifest =
        ReadCheckpoint(dir, kChunkBytes, [&](const v1::StateChunk& chunk, std::string_view data) {
          return import.Add(chunk, data);
        });
    if (!manifest.ok()) return manifest.status();
    absl::StatusOr<StagedState> staged = import.Finish();
    if (!staged.ok()) return staged.status();
    return h.job().Import(*std::move(staged)).status();
  }

  static void ExpectSameServed(const RegistryJobHarness& a, const RegistryJobHarness& b,
                               const v1::RegisterRequest& spec) {
    for (int i = 0; i < spec.tensors_size(); ++i) {
      for (v1::Recipe recipe : kRecipes) {
        for (v1::Direction direction : kDirections) {
          EXPECT_TRUE(BitIdentical(a.Served(i, recipe, direction), b.Served(i, recipe, direction)))
              << spec.tensors(i).name() << " " << v1::Recipe_Name(recipe);
        }
      }
    }
  }

  std::string root_;
};

TEST(Crc32cTest, IsTheCastagnoliCrcAndContinuesAcrossPieces) {
  const std::string text = "123456789";
  EXPECT_EQ(Crc32c(0, text.data(), text.size()), 0xE3069283u);  // the standard check value
  EXPECT_EQ(Crc32c(Crc32c(0, text.data(), 4), text.data() + 4, 5), 0xE3069283u);
  EXPECT_EQ(Crc32c(0, nullptr, 0), 0u);
}

TEST_F(CheckpointTest, AWrittenCheckpointRestoresAndTrainingContinuesBitForBit) {
  const v1::RegisterRequest spec = Spec();
  RegistryJobHarness a(spec);
  ASSERT_TRUE(a.Start(PolicyWeights(spec)).ok());
  for (int64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE(a.RunStep(step, RandomGradients(spec, 40 + static_cast<uint64_t>(step))).ok());
  }
  // Small files: the stream spans several.
  absl::StatusOr<std::string> dir = Write(a, 16 << 10);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root_ + "/policy/step-000000000002");

  RegistryJobHarness b(spec);
  ASSERT_TRUE(b.Start(RandomWeights(spec, 9)).ok());  // other weights: the restore replaces them
  ASSERT_TRUE(Restore(*dir, b).ok());
  EXPECT_EQ(b.job().Status().next_step(), 2);
  ExpectSameServed(a, b, spec);
  for (int64_t step = 2; step < 4; ++step) {
    const auto grads = RandomGradients(spec, 40 + static_cast<uint64_t>(step));
    ASSERT_TRUE(a.RunStep(step, grads).ok());
    ASSERT_TRUE(b.RunStep(step, grads).ok());
  }
  ExpectSameServed(a, b, spec);

  // The manifest names the registration and the version, and the files it lists.
  std::vector<v1::StateChunk> chunks;
  absl::StatusOr<v1::CheckpointManifest> manifest =
      ReadCheckpoint(*dir, kChunkBytes, [&](const v1::StateChunk& c, std::string_view) {
        chunks.push_back(c);
        return absl::OkStatus();
      });
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->registration().SerializeAsString(), a.job().spec().SerializeAsString());
  EXPECT_EQ(manifest->header().next_step(), 2);
  EXPECT_GT(manifest->files_size(), 1);
  ASSERT_FALSE(chunks.empty());
  EXPECT_TRUE(chunks.front().has_header());
}

TEST_F(CheckpointTest, AnEarlyStepJobKeepsTheOptionAndContinuesBitForBitAfterARestore) {
  // The option is part of the registration the manifest keeps; a job restored from it steps
  // early from the imported state, and the same bits come out as from a job without it.
  v1::RegisterRequest spec = Spec();
  spec.set_early_step(true);
  v1::RegisterRequest plain_spec = spec;
  plain_spec.set_early_step(false);
  RegistryJobHarness a(spec);
  ASSERT_TRUE(a.Start(PolicyWeights(spec)).ok());
  RegistryJobHarness plain(plain_spec);
  ASSERT_TRUE(plain.Start(PolicyWeights(spec)).ok());
  for (int64_t step = 0; step < 2; ++step) {
    const auto grads = RandomGradients(spec, 60 + static_cast<uint64_t>(step));
    ASSERT_TRUE(a.RunStep(step, grads).ok());
    ASSERT_TRUE(plain.RunStep(step, grads).ok());
  }
  absl::StatusOr<std::string> dir = Write(a, 16 << 10);
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadCheckpoint(
      *dir, kChunkBytes, [](const v1::StateChunk&, std::string_view) { return absl::OkStatus(); });
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_TRUE(manifest->registration().early_step());

  RegistryJobHarness b(manifest->registration());
  ASSERT_TRUE(b.Start(RandomWeights(spec, 9)).ok());
  // A step before the restore leaves its shadow states behind: the restore replaces the state.
  ASSERT_TRUE(b.RunStep(0, RandomGradients(spec, 99)).ok());
  ASSERT_TRUE(Restore(*dir, b).ok());
  for (int64_t step = 2; step < 4; ++step) {
    const auto grads = RandomGradients(spec, 60 + static_cast<uint64_t>(step));
    ASSERT_TRUE(plain.RunStep(step, grads).ok());
    ASSERT_TRUE(b.RunStep(step, grads).ok());
  }
  ExpectSameServed(plain, b, spec);
  // Step 0 before the restore and steps 2 and 3 after it, every tensor adopted.
  EXPECT_EQ(b.job().Status().early_steps_adopted(), 3 * spec.tensors_size());
  EXPECT_EQ(b.job().Status().early_steps_discarded(), 0);

  // A restarted daemon's job: registered, never given initial weights, its state the restore's
  // (the early steps' second states are made with the imported ones).
  RegistryJobHarness c(manifest->registration());
  ASSERT_TRUE(c.Register().ok());
  ASSERT_TRUE(Restore(*dir, c).ok());
  for (int64_t step = 2; step < 4; ++step) {
    ASSERT_TRUE(c.RunStep(step, RandomGradients(spec, 60 + static_cast<uint64_t>(step))).ok());
  }
  ExpectSameServed(plain, c, spec);
  EXPECT_EQ(c.job().Status().early_steps_adopted(), 2 * spec.tensors_size());
}

// Holds a writer thread before each chunk it writes until Release (or a deadline, so a test whose
// writer waits forever fails instead of hanging).
class HeldDisk {
 public:
  std::function<void()> Hook() {
    return [this] {
      writes_.fetch_add(1);
      (void)released_.wait_for(std::chrono::seconds(20));
    };
  }
  void Release() { release_.set_value(); }
  int writes() const { return writes_.load(); }

 private:
  std::promise<void> release_;
  std::shared_future<void> released_ = release_.get_future().share();
  std::atomic<int> writes_{0};
};

// With a buffer the size of the state, the whole state is copied out while the disk is held, the
// job's next steps run at once, and the checkpoint written afterwards holds exactly the version
// the export began at (compared with a job that stopped there).
TEST_F(CheckpointTest, StepsGoOnWhileABufferedCheckpointOfTheirVersionIsWritten) {
  const v1::RegisterRequest spec = Spec();
  RegistryJobHarness a(spec), stopped(spec);
  ASSERT_TRUE(a.Start(PolicyWeights(spec)).ok());
  ASSERT_TRUE(stopped.Start(PolicyWeights(spec)).ok());
  for (int64_t step = 0; step < 2; ++step) {
    const auto grads = RandomGradients(spec, 60 + static_cast<uint64_t>(step));
    ASSERT_TRUE(a.RunStep(step, grads).ok());
    ASSERT_TRUE(stopped.RunStep(step, grads).ok());
  }
  absl::StatusOr<std::unique_ptr<StateExport>> exporting =
      StateExport::BeginAndWait(ExportOf(a.shared(), [](const StepWork&) {}), kChunkBytes);
  ASSERT_TRUE(exporting.ok()) << exporting.status();
  absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer =
      CheckpointWriter::Start(root_, spec, 16 << 10, int64_t{64} << 20);
  ASSERT_TRUE(writer.ok()) << writer.status();
  HeldDisk disk;
  (*writer)->set_before_write_for_test(disk.Hook());
  int chunks = 0;
  for (;;) {
    v1::StateChunk chunk;
    absl::StatusOr<bool> more = (*exporting)->Next(&chunk);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    ASSERT_TRUE((*writer)->Add(&chunk).ok());
    ++chunks;
  }
  exporting->reset();
  EXPECT_GT(chunks, 3);
  EXPECT_LE(disk.writes(), 1) << "the disk was held: at most the first chunk is being written";
  // The export is over while the disk is still held: the job steps on.
  for (int64_t step = 2; step < 4; ++step) {
    ASSERT_TRUE(a.RunStep(step, RandomGradients(spec, 60 + static_cast<uint64_t>(step))).ok());
  }
  EXPECT_EQ(a.job().Status().next_step(), 4);
  EXPECT_LE(disk.writes(), 1);
  disk.Release();
  absl::StatusOr<std::string> dir = (*writer)->Finish();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, root_ + "/policy/step-000000000002");
  RegistryJobHarness b(spec);
  ASSERT_TRUE(b.Start(RandomWeights(spec, 9)).ok());
  ASSERT_TRUE(Restore(*dir, b).ok());
  ExpectSameServed(stopped, b, spec);
  const auto grads = RandomGradients(spec, 62);
  ASSERT_TRUE(stopped.RunStep(2, grads).ok());
  ASSERT_TRUE(b.RunStep(2, grads).ok());
  ExpectSameServed(stopped, b, spec);
}

// A buffer of one chunk: while the disk is held, the next chunk waits for room.
TEST_F(CheckpointTest, TheWriterRunsAheadOfTheDiskByItsBufferOnly) {
  const v1::RegisterRequest spec = Spec();
  RegistryJobHarness a(spec);
  ASSERT_TRUE(a.Start(PolicyWeights(spec)).ok());
  absl::StatusOr<std::unique_ptr<StateExport>> exporting =
      StateExport::BeginAndWait(ExportOf(a.shared(), [](const StepWork&) {}), kChunkBytes);
  ASSERT_TRUE(exporting.ok()) << exporting.status();
  absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer =
      CheckpointWriter::Start(root_, spec, 1 << 20, kChunkBytes);
  ASSERT_TRUE(writer.ok()) << writer.status();
  HeldDisk disk;
  (*writer)->set_before_write_for_test(disk.Hook());
  std::vector<v1::StateChunk> chunks;
  for (;;) {
    v1::StateChunk chunk;
    absl::StatusOr<bool> more = (*exporting)->Next(&chunk);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    chunks.push_back(std::move(chunk));
  }
  exporting->reset();
  ASSERT_GT(chunks.size(), 3u);
  // The header chunk, then a full data chunk: the buffer holds one of them.
  ASSERT_TRUE((*writer)->Add(&chunks[0]).ok());
  std::future<absl::Status> added = std::async(std::launch::async, [&] {
    absl::Status s = absl::OkStatus();
    for (size_t i = 1; i < chunks.size() && s.ok(); ++i) s = (*writer)->Add(&chunks[i]);
    return s;
  });
  EXPECT_EQ(added.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "every chunk was taken while the disk was held";
  disk.Release();
  ASSERT_TRUE(added.get().ok());
  absl::StatusOr<std::string> dir = (*writer)->Finish();
  ASSERT_TRUE(dir.ok()) << dir.status();
  RegistryJobHarness b(spec);
  ASSERT_TRUE(b.Start(RandomWeights(spec, 9)).ok());
  ASSERT_TRUE(Restore(*dir, b).ok());
  ExpectSameServed(a, b, spec);
}

TEST_F(CheckpointTest, OnlyCompleteCheckpointsAreListedNewestFirst) {
  const v1::RegisterRequest spec = Spec();
  RegistryJobHarness a(spec);
  ASSERT_TRUE(a.Start(PolicyWeights(spec)).ok());
  ASSERT_TRUE(Write(a, 1 << 20).ok());
  ASSERT_TRUE(a.RunStep(0, RandomGradients(spec, 50)).ok());
  ASSERT_TRUE(Write(a, 1 << 20).ok());
  {
    // A writer that never finishes (a crash mid-write) leaves nothing listed...
    absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer =
        CheckpointWriter::Start(root_, a.job().spec(), 1 << 20, kBufferBytes);
    ASSERT_TRUE(writer.ok());
  }
  // ...and neither does a partial directory a killed process left.
  ASSERT_EQ(mkdir((root_ + "/policy/.partial-crashed").c_str(), 0700), 0);
  absl::StatusOr<std::vector<std::string>> listed = ListCheckpoints(root_, "policy");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, (std::vector<std::string>{root_ + "/policy/step-000000000001",
                                               root_ + "/policy/step-000000000000"}));
  // The next writer of the job clears what a crashed one left.
  absl::StatusOr<std::unique_ptr<CheckpointWriter>> next =
      CheckpointWriter::Start(root_, a.job().spec(), 1 << 20, kBufferBytes);
  ASSERT_TRUE(next.ok());
  struct stat st;
  EXPECT_NE(stat((root_ + "/policy/.partial-crashed").c_str(), &st), 0);
}

TEST_F(CheckpointTest, AFailedWriteOnTheWriterThreadIsReturnedAndLeavesNoCheckpoint) {
  const v1::RegisterRequest spec = Spec();
  RegistryJobHarness a(spec);
  ASSERT_TRUE(a.Start(PolicyWeights(spec)).ok());
  // Files of this process may grow to 8 KiB only: a later chunk's write fails (EFBIG).
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit small = saved;
  small.rlim_cur = 8 << 10;
  std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::StatusOr<std::string> failed = Write(a, 1 << 20);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("cannot write"), std::string::npos) << failed.status();
  absl::StatusOr<std::vector<std::string>> listed = ListCheckpoints(root_, "policy");
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  // The next checkpoint is written whole.
  absl::StatusOr<std::string> written = Write(a, 1 << 20);
  ASSERT_TRUE(written.ok()) << written.status();
  RegistryJobHarness b(spec);
  ASSERT_TRUE(b.Start(RandomWeights(spec, 9)).ok());
  ASSERT_TRUE(Restore(*written, b).ok());
  ExpectSameServed(a, b, spec);
}

TEST_F(CheckpointTest, AFilesystemWithoutODirectIsWrittenThroughThePageCache) {
  // tmpfs refuses O_DIRECT: the writer falls back to buffered writes, same bytes.
  char dir[] = "/dev/shm/paramd-checkpoint-test-XXXXXX";
  if (mkdtemp(dir) == nullptr) GTEST_SKIP() << "no /dev/shm here";
  const std::string disk_root = root_;
  root_ = dir;
  const v1::RegisterRequest spec = Spec();
  RegistryJobHarness a(spec);
  ASSERT_TRUE(a.Start(PolicyWeights(spec)).ok());
  ASSERT_TRUE(a.RunStep(0, RandomGradients(spec, 60)).ok());
  absl::StatusOr<std::string> on_tmpfs = Write(a, 16 << 10);
  std::string on_disk_root = disk_root;
  std::swap(root_, on_disk_root);
  absl::StatusOr<std::string> on_disk = Write(a, 16 << 10);
  ASSERT_TRUE(on_tmpfs.ok()) << on_tmpfs.status();
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  RegistryJobHarness b(spec);
  ASSERT_TRUE(b.Start(RandomWeights(spec, 9)).ok());
  ASSERT_TRUE(Restore(*on_tmpfs, b).ok());
  ExpectSameServed(a, b, spec);
  // The files are the same bytes, whichever way they were written (the manifests differ only in
  // their time).
  absl::StatusOr<v1::CheckpointManifest> x = ReadCheckpointManifest(*on_tmpfs);
  absl::StatusOr<v1::CheckpointManifest> y = ReadCheckpointManifest(*on_disk);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_GT(x->files_size(), 1);
  ASSERT_EQ(x->files_size(), y->files_size());
  for (int f = 0; f < x->files_size(); ++f) {
    EXPECT_EQ(x->files(f).bytes(), y->files(f).bytes());
    EXPECT_EQ(x->files(f).crc32c(), y->files(f).crc32c());
    std::ifstream a_file(*on_tmpfs + "/" + x->files(f).name(), std::ios::binary);
    std::ifstream b_file(*on_disk + "/" + y->files(f).name(), std::ios::binary);
    const std::string a_bytes((std::istreambuf_iterator<char>(a_file)),
                              std::istreambuf_iterator<char>());
    const std::string b_bytes((std::istreambuf_iterator<char>(b_file)),
                              std::istreambuf_iterator<char>());
    EXPECT_EQ(static_cast<int64_t>(a_bytes.size()), x->files(f).bytes());
    EXPECT_EQ(a_bytes, b_bytes) << x->files(f).name();
  }
  std::system((std::string("rm -rf ") + dir).c_str());
}

TEST_F(CheckpointTest, TruncatedAlteredOrMissingFilesAreRefusedNamingThemAndTheOlderOneStillWorks) {
  const v1::RegisterRequest spec = Spec();
  RegistryJobHarness a(spec);
  ASSERT_TRUE(a.Start(PolicyWeights(spec)).ok());
  absl::StatusOr<std::string> older = Write(a, 1 << 20);
  ASSERT_TRUE(older.ok());
  ASSERT_TRUE(a.RunStep(0, RandomGradients(spec, 60)).ok());
  absl::StatusOr<std::string> newer = Write(a, 16 << 10);
  ASSERT_TRUE(newer.ok());
  const std::string file = *newer + "/state-00001.bin";

  auto read_into_fresh_job = [&](const std::string& dir) {
    RegistryJobHarness b(spec);
    EXPECT_TRUE(b.Start(RandomWeights(spec, 9)).ok());
    const v1::JobStatus before = b.job().Status();
    absl::Status status = Restore(dir, b);
    if (!status.ok()) {
      // Nothing was applied: the job still serves what it served.
      EXPECT_EQ(b.job().Status().next_step(), before.next_step());
    }
    return status;
  };

  // One bit flipped in the middle of a file.
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 100u);
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x10;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << flipped;
  absl::Status status = read_into_fresh_job(*newer);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("state-00001.bin"), std::string::npos) << status;

  // One bit flipped in the last record's data: it parses and imports, only the CRC-32C tells.
  flipped = bytes;
  flipped.back() ^= 0x01;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << flipped;
  status = read_into_fresh_job(*newer);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("state-00001.bin\" has CRC-32C"), std::string::npos) << status;

  // Truncated.
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 7);
  status = read_into_fresh_job(*newer);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("truncated"), std::string::npos) << status;

  // Missing.
  ASSERT_EQ(unlink(file.c_str()), 0);
  status = read_into_fresh_job(*newer);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("is missing"), std::string::npos) << status;

  // A manifest that does not parse.
  std::ofstream(*newer + "/manifest.pb", std::ios::binary | std::ios::trunc) << "not a manifest";
  status = read_into_fresh_job(*newer);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("manifest.pb"), std::string::npos) << status;

  // The older checkpoint is untouched and restores.
  EXPECT_TRUE(read_into_fresh_job(*older).ok());
}

}  // namespace
}  // namespace paramd
