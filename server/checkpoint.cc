#include "server/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/quoted.h"
#include "common/status_macros.h"

namespace paramd {
namespace {

constexpr char kPartialPrefix[] = ".partial-";
constexpr char kStepPrefix[] = "step-";
constexpr int kStepDigits = 12;
constexpr int64_t kMaxManifestBytes = int64_t{64} << 20;
// A chunk's message beyond its data: names, header, field description.
constexpr int64_t kChunkOverhead = 64 << 10;

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " \"", path, "\": ", std::strerror(errno)));
}

absl::Status MakeDirs(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at < path.size() && path[at] != '/') continue;
    const std::string prefix = path.substr(0, at);
    if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) return Errno("cannot create", prefix);
  }
  return absl::OkStatus();
}

absl::Status Fsync(const std::string& path, bool directory) {
  const int fd = open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  const int rc = fsync(fd);
  close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("cannot fsync", path);
}

absl::Status WriteAll(int fd, const void* bytes, size_t size, const std::string& path) {
  const auto* p = static_cast<const char*>(bytes);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot write", path);
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

// Reads exactly `size` bytes, or fewer at the file's end.
absl::StatusOr<size_t> ReadUpTo(int fd, void* out, size_t size, const std::string& path) {
  auto* p = static_cast<char*>(out);
  size_t got = 0;
  while (got < size) {
    const ssize_t n = read(fd, p + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", path);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  return got;
}

absl::Status Lost(const std::string& path, const std::string& what) {
  // The whole path (Quoted shortens long ones): the user has to find the file.
  return absl::DataLossError(
      absl::StrCat("checkpoint file \"", path, "\" ", what, "; this checkpoint cannot be used"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Start(
    const std::string& root, const v1::RegisterRequest& registration, int64_t file_bytes) {
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
  if (mkdtemp(partial.data()) == nullptr) return Errno("cannot create", partial);
  v1::CheckpointManifest manifest;
  manifest.set_format(kCheckpointFormat);
  *manifest.mutable_registration() = registration;
  manifest.set_written_unix_s(static_cast<int64_t>(std::time(nullptr)));
  return std::unique_ptr<CheckpointWriter>(new CheckpointWriter(
      job_dir, std::move(partial), std::move(manifest), std::max<int64_t>(file_bytes, 1)));
}

CheckpointWriter::CheckpointWriter(std::string job_dir, std::string partial,
                                   v1::CheckpointManifest manifest, int64_t file_bytes)
    : job_dir_(std::move(job_dir)),
      partial_(std::move(partial)),
      manifest_(std::move(manifest)),
      file_bytes_(file_bytes) {}

CheckpointWriter::~CheckpointWriter() {
  if (fd_ >= 0) close(fd_);
  if (!finished_) RemoveDir(partial_);
}

absl::Status CheckpointWriter::OpenFile() {
  file_ = manifest_.add_files();
  file_->set_name(absl::StrFormat("state-%05d.bin", manifest_.files_size() - 1));
  const std::string path = partial_ + "/" + file_->name();
  fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  return fd_ >= 0 ? absl::OkStatus() : Errno("cannot create", path);
}

absl::Status CheckpointWriter::CloseFile() {
  if (fd_ < 0) return absl::OkStatus();
  const std::string path = partial_ + "/" + file_->name();
  const int rc = fsync(fd_);
  close(fd_);
  fd_ = -1;
  return rc == 0 ? absl::OkStatus() : Errno("cannot fsync", path);
}

absl::Status CheckpointWriter::Add(const v1::StateChunk& chunk) {
  if (finished_) return absl::FailedPreconditionError("the checkpoint is already finished");
  if (manifest_.files_size() == 0) {
    if (!chunk.has_header()) {
      return absl::InvalidArgumentError("a state stream starts with its header");
    }
    *manifest_.mutable_header() = chunk.header();
  }
  if (fd_ < 0 || file_->bytes() >= file_bytes_) {
    PARAMD_RETURN_IF_ERROR(CloseFile());
    PARAMD_RETURN_IF_ERROR(OpenFile());
  }
  record_.clear();
  chunk.AppendToString(&record_);
  const uint32_t size = static_cast<uint32_t>(record_.size());
  const unsigned char prefix[4] = {
      static_cast<unsigned char>(size), static_cast<unsigned char>(size >> 8),
      static_cast<unsigned char>(size >> 16), static_cast<unsigned char>(size >> 24)};
  const std::string path = partial_ + "/" + file_->name();
  PARAMD_RETURN_IF_ERROR(WriteAll(fd_, prefix, sizeof(prefix), path));
  PARAMD_RETURN_IF_ERROR(WriteAll(fd_, record_.data(), record_.size(), path));
  uint32_t crc = Crc32c(file_->crc32c(), prefix, sizeof(prefix));
  file_->set_crc32c(Crc32c(crc, record_.data(), record_.size()));
  file_->set_bytes(file_->bytes() + static_cast<int64_t>(sizeof(prefix) + record_.size()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError("the checkpoint is already finished");
  if (manifest_.files_size() == 0) {
    return absl::FailedPreconditionError("a checkpoint of no state chunk");
  }
  PARAMD_RETURN_IF_ERROR(CloseFile());
  const std::string manifest_path = absl::StrCat(partial_, "/", kCheckpointManifest);
  const std::string bytes = manifest_.SerializeAsString();
  const int fd = open(manifest_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", manifest_path);
  absl::Status written = WriteAll(fd, bytes.data(), bytes.size(), manifest_path);
  if (written.ok() && fsync(fd) != 0) written = Errno("cannot fsync", manifest_path);
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
    return Errno("cannot rename the checkpoint to", final_dir);
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

absl::StatusOr<v1::CheckpointManifest> ReadCheckpointManifest(const std::string& dir) {
  const std::string manifest_path = absl::StrCat(dir, "/", kCheckpointManifest);
  v1::CheckpointManifest manifest;
  const int fd = open(manifest_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Lost(manifest_path, "cannot be opened");
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size > kMaxManifestBytes) {
    close(fd);
    return Lost(manifest_path, "is too large");
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  absl::StatusOr<size_t> got = ReadUpTo(fd, bytes.data(), bytes.size(), manifest_path);
  close(fd);
  if (!got.ok()) return got.status();
  if (*got != bytes.size() || !manifest.ParseFromString(bytes)) {
    return Lost(manifest_path, "does not parse");
  }
  if (manifest.format() != kCheckpointFormat) {
    return Lost(manifest_path, absl::StrCat("has format ", manifest.format(),
                                            ", this daemon reads ", kCheckpointFormat));
  }
  return manifest;
}

absl::StatusOr<v1::CheckpointManifest> ReadCheckpoint(
    const std::string& dir, int64_t max_chunk_bytes,
    const std::function<absl::Status(const v1::StateChunk&)>& chunk) {
  const std::string manifest_path = absl::StrCat(dir, "/", kCheckpointManifest);
  PARAMD_ASSIGN_OR_RETURN(v1::CheckpointManifest manifest, ReadCheckpointManifest(dir));
  const int64_t max_record = max_chunk_bytes + kChunkOverhead;
  std::string record;
  for (const v1::CheckpointFile& file : manifest.files()) {
    if (file.name().empty() || file.name().find('/') != std::string::npos) {
      return Lost(manifest_path, absl::StrCat("names a file ", Quoted(file.name())));
    }
    const std::string path = absl::StrCat(dir, "/", file.name());
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Lost(path, "is missing");
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size != file.bytes()) {
      close(fd);
      return Lost(path, absl::StrCat("has ", st.st_size, " bytes, the manifest says ", file.bytes(),
                                     " (truncated or replaced)"));
    }
    uint32_t crc = 0;
    int64_t offset = 0;
    absl::Status status;    // of the file's structure: ends the read at once
    absl::Status consumer;  // of `chunk`: the rest is still hashed, so damage is named as such
    while (status.ok() && offset < file.bytes()) {
      unsigned char prefix[4];
      absl::StatusOr<size_t> got = ReadUpTo(fd, prefix, sizeof(prefix), path);
      if (!got.ok() || *got != sizeof(prefix)) {
        status = got.ok() ? Lost(path, absl::StrCat("ends inside a record at byte ", offset))
                          : got.status();
        break;
      }
      const uint32_t size =
          prefix[0] | prefix[1] << 8 | prefix[2] << 16 | static_cast<uint32_t>(prefix[3]) << 24;
      if (static_cast<int64_t>(size) > max_record ||
          offset + 4 + static_cast<int64_t>(size) > file.bytes()) {
        status = Lost(path, absl::StrCat("has a record of ", size, " bytes at byte ", offset));
        break;
      }
      record.resize(size);
      got = ReadUpTo(fd, record.data(), size, path);
      if (!got.ok() || *got != size) {
        status = got.ok() ? Lost(path, absl::StrCat("ends inside a record at byte ", offset))
                          : got.status();
        break;
      }
      crc = Crc32c(Crc32c(crc, prefix, sizeof(prefix)), record.data(), record.size());
      const int64_t at = offset;
      offset += 4 + static_cast<int64_t>(size);
      if (!consumer.ok()) continue;
      v1::StateChunk message;
      if (!message.ParseFromString(record)) {
        consumer = Lost(path, absl::StrCat("has a record at byte ", at, " that does not parse"));
        continue;
      }
      consumer = chunk(message);
    }
    close(fd);
    PARAMD_RETURN_IF_ERROR(status);
    if (crc != file.crc32c()) {
      return Lost(path, absl::StrFormat("has CRC-32C %08x, the manifest says %08x (altered)", crc,
                                        file.crc32c()));
    }
    PARAMD_RETURN_IF_ERROR(consumer);
  }
  return manifest;
}

}  // namespace paramd
