// A job's state on disk: one directory per checkpoint, holding the state's stream (the StateChunk
// messages ExportState sends, every field in its stored dtype with its scales) in files of bounded
// size and a manifest (v1::CheckpointManifest: the registration, the state's header, each file's
// size and CRC-32C).
//
// Layout: ROOT/JOB/step-NNNNNNNNNNNN/{state-00000.bin, ..., manifest.pb}, NNN the step the state
// consumes next (the version it holds). A checkpoint is written into ROOT/JOB/.partial-NNN-XXXXXX:
// every file is fsynced, the manifest is written and fsynced last, the directory is renamed into
// place atomically and ROOT/JOB is fsynced. So a directory named step-* is complete, and a crash
// at any point leaves the previous checkpoints as they were (and at most a .partial-* directory,
// which the next writer of that job removes).
//
// Plain C++ and POSIX files: the Control service and the daemon's schedule drive it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "paramd/v1/checkpoint.pb.h"
#include "paramd/v1/control.pb.h"

namespace paramd {

inline constexpr int kCheckpointFormat = 1;
inline constexpr char kCheckpointManifest[] = "manifest.pb";

// Writes one checkpoint, chunk by chunk. A thread of its own writes each chunk (its CRC, the file
// write, the fsync of each full file) while the caller exports the next: the chunks queued and the
// one being written hold at most `buffer_bytes` (or one chunk, where bigger), so the caller runs
// that far ahead of the disk.
class CheckpointWriter {
 public:
  // Starts a checkpoint of `registration`'s job under `root` (created if missing), its state in
  // files of about `file_bytes` each, the caller at most `buffer_bytes` of chunks ahead of the
  // disk. Removes .partial-* directories that earlier writers of the job left.
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Start(
      const std::string& root, const v1::RegisterRequest& registration, int64_t file_bytes,
      int64_t buffer_bytes);
  ~CheckpointWriter();  // a checkpoint not finished is removed
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Appends the stream's next chunk; the first carries the state's header. Returns once the chunk
  // is queued (waiting while the buffer is full), its data taken (not copied: the chunk gets an
  // empty buffer to fill next); an error of an earlier chunk's write is returned here or by
  // Finish.
  absl::Status Add(v1::StateChunk* chunk);
  // Makes the checkpoint durable and complete; returns its directory. An existing checkpoint of
  // the same version is replaced.
  absl::StatusOr<std::string> Finish();

  // Tests: called on the writer thread before each chunk is written (to hold the disk back).
  void set_before_write_for_test(std::function<void()> hook) {
    before_write_for_test_ = std::move(hook);
  }

 private:
  CheckpointWriter(std::string job_dir, std::string partial, v1::CheckpointManifest manifest,
                   int64_t file_bytes, int64_t buffer_bytes);
  absl::Status OpenFile();
  absl::Status CloseFile();
  // The writer thread: writes the queued records in order until stopped.
  void WriteQueued();
  // One chunk as written: its message without `data`, serialized, then `data` (the last field,
  // so the two are the message's own serialization).
  struct Record {
    std::string head;
    std::string data;
  };
  absl::Status WriteRecord(const Record& record);
  // Ends the writer thread once it has written what is queued (or at once, `discard`ing it); the
  // first error of its writes.
  absl::Status StopWriting(bool discard);

  const std::string job_dir_;
  const std::string partial_;
  v1::CheckpointManifest manifest_;
  const int64_t file_bytes_;
  const int64_t buffer_bytes_;
  std::function<void()> before_write_for_test_;
  int fd_ = -1;
  // Files are written with O_DIRECT where the filesystem takes it (no copy into the page cache):
  // the writer thread stages records into this aligned buffer and writes whole blocks of it; a
  // file's last partial block goes through the page cache at its close.
  bool direct_ = false;
  std::unique_ptr<uint8_t, void (*)(void*)> staging_{nullptr, nullptr};
  size_t staged_ = 0;
  absl::Status Stage(const void* bytes, size_t size, const std::string& path);
  absl::Status WriteStaged(size_t size, const std::string& path);
  v1::CheckpointFile* file_ = nullptr;  // the file being written
  bool started_ = false;                // the header was seen (Add)
  bool finished_ = false;

  absl::Mutex mu_;
  absl::CondVar cv_;
  // Chunks the thread has yet to write.
  std::deque<Record> queue_ ABSL_GUARDED_BY(mu_);
  // Their data, and the data of the one being written.
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Record> spare_ ABSL_GUARDED_BY(mu_);  // buffers of written chunks, reused
  absl::Status write_status_ ABSL_GUARDED_BY(mu_);  // the thread's first error
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started with the first chunk
};

// The complete checkpoints of `job` under `root`, newest version first (directories only: each
// is verified when read).
absl::StatusOr<std::vector<std::string>> ListCheckpoints(const std::string& root,
                                                         const std::string& job);

// The manifest of the checkpoint in `dir` alone (its files are not read): DATA_LOSS naming it
// when it is missing, does not parse or has an unknown format.
absl::StatusOr<v1::CheckpointManifest> ReadCheckpointManifest(const std::string& dir);

// How ReadCheckpoint reads a checkpoint's files.
struct CheckpointReadOptions {
  // Bytes of each of its few read buffers; raised to hold the largest record where smaller.
  int64_t buffer_bytes = int64_t{8} << 20;
  // With O_DIRECT where the filesystem takes it (the bytes do not pass through the page cache);
  // false: through the page cache.
  bool direct = true;
};

// Takes a checkpoint's chunks one by one: the message without its `data`, and the data, a view
// into the reader's buffer that is valid during the call.
using CheckpointChunkFn =
    std::function<absl::Status(const v1::StateChunk& chunk, std::string_view data)>;

// Reads the checkpoint in `dir`: the manifest, then every file's chunks in order, each handed to
// `chunk`, with every file's size and CRC-32C checked as it is read. A missing, truncated,
// altered or unknown file is DATA_LOSS naming it; a chunk over `max_chunk_bytes` of data is
// DATA_LOSS too. `chunk`'s error ends the read. The manifest read is returned.
absl::StatusOr<v1::CheckpointManifest> ReadCheckpoint(const std::string& dir,
                                                      int64_t max_chunk_bytes,
                                                      const CheckpointChunkFn& chunk,
                                                      const CheckpointReadOptions& options = {});

}  // namespace paramd
