#include "server/state/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "server/state/checkpoint_io.h"

namespace paramd {
namespace {

constexpr char kPartialPrefix[] = ".partial-";
constexpr char kStepPrefix[] = "step-";
constexpr int kStepDigits = 12;
// Written chunks' buffers kept for the exporting caller to fill next.
constexpr size_t kSpareRecords = 2;
// O_DIRECT writes: the staging buffer they are written from.
constexpr size_t kStagingBytes = size_t{8} << 20;

absl::Status MakeDirs(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at < path.size() && path[at] != '/') continue;
    const std::string prefix = path.substr(0, at);
    if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST)
      return FileError("cannot create", prefix);
  }
  return absl::OkStatus();
}

absl::Status Fsync(const std::string& path, bool directory) {
  const int fd = open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return FileError("cannot open", path);
  const int rc = fsync(fd);
  close(fd);
  return rc == 0 ? absl::OkStatus() : FileError("cannot fsync", path);
}

absl::Status WriteAll(int fd, const void* bytes, size_t size, const std::string& path) {
  const auto* p = static_cast<const char*>(bytes);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FileError("cannot write", path);
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

// A directory of plain files (what a checkpoint holds), gone.
void RemoveDir(const std::string& dir) {
  for (const std::string& name : Entries(dir)) unlink((dir + "/" + name).c_str());
  rmdir(dir.c_str());
}

bool IsStepName(const std::string& name) {
  const size_t prefix = std::strlen(kStepPrefix);
  return name.size() == prefix + kStepDigits && name.compare(0, prefix, kStepPrefix) == 0 &&
         std::all_of(name.begin() + static_cast<ptrdiff_t>(prefix), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Start(
    const std::string& root, const v1::RegisterRequest& registration, int64_t file_bytes,
    int64_t buffer_bytes) {
  if (registration.job().empty() || registration.job().find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("job name ", Quoted(registration.job()), " cannot name a directory"));
  }
  const std::string job_dir = absl::StrCat(root, "/", registration.job());
  PARAMD_RETURN_IF_ERROR(MakeDirs(job_dir));
  for (const std::string& name : Entries(job_dir)) {
    if (name.rfind(kPartialPrefix, 0) == 0) RemoveDir(job_dir + "/" + name);
  }
  std::string partial = absl::StrCat(job_dir, "/", kPartialPrefix, "XXXXXX");
  if (mkdtemp(partial.data()) == nullptr) return FileError("cannot create", partial);
  v1::CheckpointManifest manifest;
  manifest.set_format(kCheckpointFormat);
  *manifest.mutable_registration() = registration;
  manifest.set_written_unix_s(static_cast<int64_t>(std::time(nullptr)));
  return std::unique_ptr<CheckpointWriter>(
      new CheckpointWriter(job_dir, std::move(partial), std::move(manifest),
                           std::max<int64_t>(file_bytes, 1), std::max<int64_t>(buffer_bytes, 0)));
}

CheckpointWriter::CheckpointWriter(std::string job_dir, std::string partial,
                                   v1::CheckpointManifest manifest, int64_t file_bytes,
                                   int64_t buffer_bytes)
    : job_dir_(std::move(job_dir)),
      partial_(std::move(partial)),
      manifest_(std::move(manifest)),
      file_bytes_(file_bytes),
      buffer_bytes_(buffer_bytes) {}

CheckpointWriter::~CheckpointWriter() {
  (void)StopWriting(/*discard=*/true);  // an unfinished checkpoint's error no longer matters
  if (fd_ >= 0) close(fd_);
  if (!finished_) RemoveDir(partial_);
}

absl::Status CheckpointWriter::OpenFile() {
  file_ = manifest_.add_files();
  file_->set_name(absl::StrFormat("state-%05d.bin", manifest_.files_size() - 1));
  const std::string path = partial_ + "/" + file_->name();
  fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  direct_ = fd_ >= 0;
  if (fd_ < 0 && errno == EINVAL) {  // a filesystem without O_DIRECT (tmpfs): the page cache
    fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  }
  if (fd_ < 0) return FileError("cannot create", path);
  if (direct_ && staging_ == nullptr) {
    staging_ = {static_cast<uint8_t*>(std::aligned_alloc(kDirectAlign, kStagingBytes)), &std::free};
    if (staging_ == nullptr) return absl::ResourceExhaustedError("no memory for a write buffer");
  }
  staged_ = 0;
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Stage(const void* bytes, size_t size, const std::string& path) {
  if (!direct_) return WriteAll(fd_, bytes, size, path);
  const auto* p = static_cast<const uint8_t*>(bytes);
  while (size > 0) {
    const size_t n = std::min(size, kStagingBytes - staged_);
    std::memcpy(staging_.get() + staged_, p, n);
    staged_ += n;
    p += n;
    size -= n;
    if (staged_ == kStagingBytes) PARAMD_RETURN_IF_ERROR(WriteStaged(kStagingBytes, path));
  }
  return absl::OkStatus();
}

// Writes the first `size` staged bytes (whole blocks, or the file's tail at its close) and keeps
// the rest at the buffer's start. A tail, or a filesystem that refuses a direct write, goes
// through the page cache from then on.
absl::Status CheckpointWriter::WriteStaged(size_t size, const std::string& path) {
  if (size % kDirectAlign != 0 || !direct_) {
    PARAMD_RETURN_IF_ERROR(EndDirect(fd_, "cannot end direct writes to", path));
    direct_ = false;
  }
  absl::Status written = WriteAll(fd_, staging_.get(), size, path);
  if (!written.ok() && direct_ && errno == EINVAL) {
    direct_ = false;
    return WriteStaged(size, path);
  }
  PARAMD_RETURN_IF_ERROR(written);
  std::memmove(staging_.get(), staging_.get() + size, staged_ - size);
  staged_ -= size;
  return absl::OkStatus();
}

absl::Status CheckpointWriter::CloseFile() {
  if (fd_ < 0) return absl::OkStatus();
  const std::string path = partial_ + "/" + file_->name();
  if (staged_ > 0) {
    const size_t blocks = staged_ / kDirectAlign * kDirectAlign;
    absl::Status written = blocks > 0 ? WriteStaged(blocks, path) : absl::OkStatus();
    if (written.ok() && staged_ > 0) written = WriteStaged(staged_, path);
    if (!written.ok()) {
      close(fd_);
      fd_ = -1;
      return written;
    }
  }
  const int rc = fsync(fd_);
  close(fd_);
  fd_ = -1;
  return rc == 0 ? absl::OkStatus() : FileError("cannot fsync", path);
}

absl::Status CheckpointWriter::Add(v1::StateChunk* chunk) {
  if (finished_) return absl::FailedPreconditionError("the checkpoint is already finished");
  if (!started_) {
    if (!chunk->has_header()) {
      return absl::InvalidArgumentError("a state stream starts with its header");
    }
    *manifest_.mutable_header() = chunk->header();  // before the thread touches the manifest
    started_ = true;
  }
  Record record;
  {
    absl::MutexLock lock(&mu_);
    // One chunk is always taken, so a chunk bigger than the buffer still goes.
    const int64_t bytes = static_cast<int64_t>(chunk->data().size());
    while (!queue_.empty() && queued_bytes_ + bytes > buffer_bytes_ && write_status_.ok()) {
      cv_.Wait(&mu_);
    }
    if (!write_status_.ok()) return write_status_;
    if (!spare_.empty()) {
      record = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  // The data changes hands with a written chunk's buffer, which the exporter fills next.
  record.data.clear();
  record.data.swap(*chunk->mutable_data());
  record.head.clear();
  chunk->AppendToString(&record.head);  // without data: names, header, offset
  if (!record.data.empty()) {
    // Field 4 (`data`), length-delimited: its tag, then the length as a varint.
    record.head.push_back(static_cast<char>((4 << 3) | 2));
    for (uint64_t n = record.data.size();; n >>= 7) {
      record.head.push_back(static_cast<char>(n < 0x80 ? n : (n & 0x7f) | 0x80));
      if (n < 0x80) break;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    queued_bytes_ += static_cast<int64_t>(record.data.size());
    queue_.push_back(std::move(record));
    cv_.SignalAll();
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { WriteQueued(); });
  return absl::OkStatus();
}

void CheckpointWriter::WriteQueued() {
  mu_.Lock();
  while (true) {
    while (queue_.empty() && !stopping_) cv_.Wait(&mu_);
    if (queue_.empty()) break;
    Record record = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    if (before_write_for_test_) before_write_for_test_();
    const absl::Status written = WriteRecord(record);
    mu_.Lock();
    // Counted until written: the buffer's bytes are the queued chunks and the one being written.
    queued_bytes_ -= static_cast<int64_t>(record.data.size());
    if (spare_.size() < kSpareRecords) spare_.push_back(std::move(record));
    if (!written.ok() && write_status_.ok()) write_status_ = written;
    if (!write_status_.ok()) {  // nothing after a failed write is kept
      queue_.clear();
      queued_bytes_ = 0;
    }
    cv_.SignalAll();
  }
  mu_.Unlock();
}

absl::Status CheckpointWriter::WriteRecord(const Record& record) {
  if (fd_ < 0 || file_->bytes() >= file_bytes_) {
    PARAMD_RETURN_IF_ERROR(CloseFile());
    PARAMD_RETURN_IF_ERROR(OpenFile());
  }
  const size_t bytes = record.head.size() + record.data.size();
  const uint32_t size = static_cast<uint32_t>(bytes);
  const unsigned char prefix[4] = {
      static_cast<unsigned char>(size), static_cast<unsigned char>(size >> 8),
      static_cast<unsigned char>(size >> 16), static_cast<unsigned char>(size >> 24)};
  const std::string path = partial_ + "/" + file_->name();
  PARAMD_RETURN_IF_ERROR(Stage(prefix, sizeof(prefix), path));
  PARAMD_RETURN_IF_ERROR(Stage(record.head.data(), record.head.size(), path));
  PARAMD_RETURN_IF_ERROR(Stage(record.data.data(), record.data.size(), path));
  uint32_t crc = Crc32c(file_->crc32c(), prefix, sizeof(prefix));
  crc = Crc32c(crc, record.head.data(), record.head.size());
  file_->set_crc32c(Crc32c(crc, record.data.data(), record.data.size()));
  file_->set_bytes(file_->bytes() + static_cast<int64_t>(sizeof(prefix) + bytes));
  return absl::OkStatus();
}

absl::Status CheckpointWriter::StopWriting(bool discard) {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (discard) {
      for (const Record& r : queue_) queued_bytes_ -= static_cast<int64_t>(r.data.size());
      queue_.clear();
    }
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  return write_status_;
}

absl::StatusOr<std::string> CheckpointWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError("the checkpoint is already finished");
  PARAMD_RETURN_IF_ERROR(StopWriting(/*discard=*/false));
  if (manifest_.files_size() == 0) {
    return absl::FailedPreconditionError("a checkpoint of no state chunk");
  }
  PARAMD_RETURN_IF_ERROR(CloseFile());
  const std::string manifest_path = absl::StrCat(partial_, "/", kCheckpointManifest);
  const std::string bytes = manifest_.SerializeAsString();
  const int fd = open(manifest_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return FileError("cannot create", manifest_path);
  absl::Status written = WriteAll(fd, bytes.data(), bytes.size(), manifest_path);
  if (written.ok() && fsync(fd) != 0) written = FileError("cannot fsync", manifest_path);
  close(fd);
  PARAMD_RETURN_IF_ERROR(written);
  PARAMD_RETURN_IF_ERROR(Fsync(partial_, /*directory=*/true));
  const std::string final_dir = absl::StrFormat("%s/%s%0*d", job_dir_, kStepPrefix, kStepDigits,
                                                manifest_.header().next_step());
  struct stat existing;
  if (stat(final_dir.c_str(), &existing) == 0) {
    // The same version is already on disk, and holds the same state: keep it.
    RemoveDir(partial_);
  } else if (rename(partial_.c_str(), final_dir.c_str()) != 0) {
    return FileError("cannot rename the checkpoint to", final_dir);
  }
  finished_ = true;
  PARAMD_RETURN_IF_ERROR(Fsync(job_dir_, /*directory=*/true));
  return final_dir;
}

absl::StatusOr<std::vector<std::string>> ListCheckpoints(const std::string& root,
                                                         const std::string& job) {
  const std::string job_dir = absl::StrCat(root, "/", job);
  std::vector<std::string> names;
  for (const std::string& name : Entries(job_dir)) {
    if (IsStepName(name)) names.push_back(name);
  }
  std::sort(names.rbegin(), names.rend());  // fixed-width numbers: newest first
  for (std::string& name : names) name = job_dir + "/" + name;
  return names;
}

}  // namespace paramd
