// The reading half of server/state/checkpoint.h: a checkpoint's manifest, and its files read back
// as the state's stream.
#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "server/state/checkpoint.h"
#include "server/state/checkpoint_io.h"

namespace paramd {
namespace {

constexpr int64_t kMaxManifestBytes = int64_t{64} << 20;
// A chunk's message beyond its data: names, header, field description.
constexpr int64_t kChunkOverhead = 64 << 10;
// O_DIRECT reads: whole blocks at block-aligned offsets into block-aligned memory.
constexpr int64_t kBlock = static_cast<int64_t>(kDirectAlign);
// Read buffers: the one being filled, and those whose records the caller is taking or has yet to:
// at least 3, and as many as make kReadAheadBytes. The caller's import can stall on a field whose
// staging memory is still being faulted in (64 MiB for a 4096 x 4096 FP32 field, at 1-3 GB/s;
// StateImport's staging thread): the disk reads on into the buffers meanwhile.
constexpr size_t kMinReadBuffers = 3;
constexpr int64_t kReadAheadBytes = int64_t{64} << 20;
// Records queued for the caller at most (where they are small, many fit in a buffer).
constexpr size_t kQueuedRecords = 1024;
// A read asks for at least this much where the record it completes is smaller: small records come
// many to a read.
constexpr int64_t kLeastRead = int64_t{1} << 20;

int64_t RoundUp(int64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }
int64_t RoundDown(int64_t n) { return n / kBlock * kBlock; }

absl::Status Lost(const std::string& path, const std::string& what) {
  // The whole path (Quoted shortens long ones): the user has to find the file.
  return absl::DataLossError(
      absl::StrCat("checkpoint file \"", path, "\" ", what, "; this checkpoint cannot be used"));
}

// Reads file bytes [offset, offset + size) into `out`; fewer only at the file's end. Where
// `*direct`, the offset, the size and `out` are block-aligned: a direct read that ends off a block
// has met the file's end, and one the filesystem refuses goes through the page cache from then on.
absl::StatusOr<int64_t> ReadAt(int fd, bool* direct, uint8_t* out, int64_t size, int64_t offset,
                               const std::string& path) {
  int64_t got = 0;
  while (got < size) {
    const ssize_t n = pread(fd, out + got, static_cast<size_t>(size - got), offset + got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && *direct) {
      PARAMD_RETURN_IF_ERROR(EndDirect(fd, "cannot end direct reads of", path));
      *direct = false;
      continue;
    }
    if (n < 0) return FileError("cannot read", path);
    if (n == 0) break;
    got += n;
    if (*direct && (offset + got) % kBlock != 0) break;
  }
  return got;
}

// Parses `record` into `chunk` but for its `data`, which it leaves a view into the record (the
// writer puts it last: the bytes before it are parsed, not copied); false where the record is not a
// StateChunk's serialization.
bool ParseRecord(std::string_view record, v1::StateChunk* chunk, std::string_view* data) {
  using google::protobuf::internal::WireFormatLite;
  constexpr uint32_t kDataTag = WireFormatLite::MakeTag(v1::StateChunk::kDataFieldNumber,
                                                        WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  const auto* bytes = reinterpret_cast<const uint8_t*>(record.data());
  const int size = static_cast<int>(record.size());
  // The top-level fields, to find the last `data` (the one a parse keeps).
  google::protobuf::io::CodedInputStream fields(bytes, size);
  int data_tag = size;  // where the data field's tag starts, and where its bytes end
  int data_end = size;
  *data = {};
  while (fields.CurrentPosition() < size) {
    const int at = fields.CurrentPosition();
    const uint32_t tag = fields.ReadTag();
    if (tag == 0) return false;
    if (tag != kDataTag) {
      if (!WireFormatLite::SkipField(&fields, tag)) return false;
      continue;
    }
    uint32_t length = 0;
    if (!fields.ReadVarint32(&length) ||
        length > static_cast<uint32_t>(size - fields.CurrentPosition())) {
      return false;
    }
    data_tag = at;
    *data = record.substr(static_cast<size_t>(fields.CurrentPosition()), length);
    data_end = fields.CurrentPosition() + static_cast<int>(length);
    fields.Skip(static_cast<int>(length));
  }
  if (!chunk->ParseFromArray(bytes, data_tag)) return false;
  // Fields after the data: not what the writer writes, but a StateChunk all the same.
  if (data_end < size) {
    google::protobuf::io::CodedInputStream rest(bytes + data_end, size - data_end);
    if (!chunk->MergeFromCodedStream(&rest) || !rest.ConsumedEntireMessage()) return false;
  }
  chunk->clear_data();  // an earlier `data` than the last
  return true;
}

// Reads a checkpoint's files while the caller parses and imports the records before: a reading
// thread reads them and checks their records' bounds, a hashing thread checks each file's CRC
// (so the disk does not wait for it). Files are read with O_DIRECT where the filesystem takes it
// (no copy through the page cache) into a few aligned buffers, and the records are handed out of
// those in place. A record that does not fit in the rest of a buffer moves to the next one with its
// bytes read so far (reads end on the block after a record, so that is mostly less than a block).
class RecordReader {
 public:
  // A record (a view into a read buffer, valid until that buffer is given back), a buffer to give
  // back (its records all came before), or the end of file `file` with its verdict (its structure,
  // then its CRC).
  struct Item {
    std::string_view framed;  // the record's 4-byte length and the record (what the CRC covers)
    int64_t at = 0;           // the record's offset in its file
    int file = 0;
    uint8_t* give_back = nullptr;
    bool end = false;
    absl::Status status;

    std::string_view record() const { return framed.substr(4); }
  };

  RecordReader(std::string dir, const v1::CheckpointManifest& manifest, int64_t max_record,
               const CheckpointReadOptions& options)
      : dir_(std::move(dir)),
        manifest_(manifest),
        max_record_(max_record),
        // The largest record, its length and the block it starts in fit in one buffer.
        capacity_(std::max(RoundUp(options.buffer_bytes), RoundUp(kBlock - 1 + 4 + max_record))),
        buffers_wanted_(
            std::max(kMinReadBuffers, static_cast<size_t>(kReadAheadBytes / capacity_))),
        direct_(options.direct) {
    reading_ = std::thread([this] { Read(); });
    hashing_ = std::thread([this] { Hash(); });
  }
  ~RecordReader() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      cv_.SignalAll();
    }
    reading_.join();
    hashing_.join();
  }
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  std::string Path(int file) const { return absl::StrCat(dir_, "/", manifest_.files(file).name()); }

  // The next item; false once every file has ended.
  bool Next(Item* item) { return Pop(&hashed_, &hashed_all_, item); }

  // Gives a buffer back for the next reads (Item::give_back).
  void GiveBack(uint8_t* buffer) {
    absl::MutexLock lock(&mu_);
    free_.push_back(buffer);
    cv_.SignalAll();
  }

 private:
  // A thread was told to stop: what it returns then (nobody reads it).
  static absl::Status Stopped() { return absl::CancelledError("the reader was stopped"); }

  // Queues `item` on `queue`; false when the reader is told to stop.
  bool Push(std::deque<Item>* queue, Item item) {
    absl::MutexLock lock(&mu_);
    while (queue->size() >= kQueuedRecords && !stopping_) cv_.Wait(&mu_);
    if (stopping_) return false;
    queue->push_back(std::move(item));
    cv_.SignalAll();
    return true;
  }

  // The next item of `queue`; false once it is empty and `*all` (no more come), or when the reader
  // is told to stop.
  bool Pop(std::deque<Item>* queue, const bool* all, Item* item) {
    absl::MutexLock lock(&mu_);
    while (queue->empty() && !*all && !stopping_) cv_.Wait(&mu_);
    if (stopping_ || queue->empty()) return false;
    *item = std::move(queue->front());
    queue->pop_front();
    cv_.SignalAll();
    return true;
  }

  // No more items come on a queue: `*all` is set.
  void End(bool* all) {
    absl::MutexLock lock(&mu_);
    *all = true;
    cv_.SignalAll();
  }

  // A free buffer: a new one while fewer than buffers_wanted_ exist, else the next one given back.
  absl::StatusOr<uint8_t*> Take() {
    absl::MutexLock lock(&mu_);
    if (free_.empty() && buffers_.size() < buffers_wanted_) {
      auto* bytes =
          static_cast<uint8_t*>(std::aligned_alloc(kBlock, static_cast<size_t>(capacity_)));
      if (bytes == nullptr) return absl::ResourceExhaustedError("no memory for a read buffer");
      buffers_.emplace_back(bytes, &std::free);
      return bytes;
    }
    while (free_.empty() && !stopping_) cv_.Wait(&mu_);
    if (stopping_) return Stopped();
    uint8_t* bytes = free_.back();
    free_.pop_back();
    return bytes;
  }

  // The reading thread: every file's records, then its end, until a file is damaged.
  void Read() {
    for (int i = 0; i < manifest_.files_size(); ++i) {
      Item end;
      end.end = true;
      end.file = i;
      end.status = ReadFile(i);
      const bool failed = !end.status.ok();
      if (!Push(&read_, std::move(end)) || failed) break;
    }
    End(&read_all_);
  }

  // The hashing thread: passes the items on, each file's end with the CRC's verdict where its
  // structure's was fine.
  void Hash() {
    uint32_t crc = 0;
    Item item;
    while (Pop(&read_, &read_all_, &item)) {
      if (item.end) {
        const v1::CheckpointFile& file = manifest_.files(item.file);
        if (item.status.ok() && crc != file.crc32c()) {
          item.status =
              Lost(Path(item.file), absl::StrFormat("has CRC-32C %08x, the manifest says %08x "
                                                    "(altered)",
                                                    crc, file.crc32c()));
        }
        crc = 0;
      } else if (item.give_back == nullptr) {
        crc = Crc32c(crc, item.framed.data(), item.framed.size());
      }
      if (!Push(&hashed_, std::move(item))) return;
    }
    End(&hashed_all_);
  }

  // Queues file `i`'s records; its structure's verdict.
  absl::Status ReadFile(int i) {
    const v1::CheckpointFile& file = manifest_.files(i);
    if (file.name().empty() || file.name().find('/') != std::string::npos) {
      return Lost(absl::StrCat(dir_, "/", kCheckpointManifest),
                  absl::StrCat("names a file ", Quoted(file.name())));
    }
    const std::string path = Path(i);
    bool direct = direct_;
    int fd = -1;
    if (direct) {
      fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (fd < 0 && errno == EINVAL) direct = false;  // a filesystem without O_DIRECT
    }
    if (!direct) fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Lost(path, "is missing");
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size != file.bytes()) {
      close(fd);
      return Lost(path, absl::StrCat("has ", st.st_size, " bytes, the manifest says ", file.bytes(),
                                     " (truncated or replaced)"));
    }
    const absl::Status status = ReadRecords(i, fd, direct);
    close(fd);
    return status;
  }

  // Queues the records of file `i` (open as `fd`, `direct` as opened); an error of their
  // structure or of a read.
  absl::Status ReadRecords(int i, int fd, bool direct) {
    const std::string path = Path(i);
    const int64_t size = manifest_.files(i).bytes();
    PARAMD_ASSIGN_OR_RETURN(uint8_t * buffer, Take());
    int64_t base = 0;  // the file offset of buffer[0] (block-aligned)
    int64_t end = 0;   // the file's bytes read so far
    int64_t at = 0;    // the next record's offset
    absl::Status status;
    while (status.ok() && at < size) {
      int64_t need = at + 4;  // the record's end, once its length is read
      if (end >= need) {
        const uint8_t* p = buffer + (at - base);
        const uint32_t length = p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24;
        if (static_cast<int64_t>(length) > max_record_ || need + length > size) {
          status = Lost(path, absl::StrCat("has a record of ", length, " bytes at byte ", at));
          break;
        }
        need += length;
      } else if (need > size) {
        status = Lost(path, absl::StrCat("ends inside a record at byte ", at));
        break;
      }
      if (end >= need) {
        Item item;
        item.framed = {reinterpret_cast<const char*>(buffer + (at - base)),
                       static_cast<size_t>(need - at)};
        item.at = at;
        item.file = i;
        if (!Push(&read_, std::move(item))) return Stopped();
        at = need;
        continue;
      }
      if (RoundUp(need) - base > capacity_) {
        // The record does not fit in the rest of this buffer: it moves to the next one.
        absl::StatusOr<uint8_t*> next = Take();
        if (!next.ok()) {
          status = next.status();
          break;
        }
        const int64_t next_base = RoundDown(at);
        std::memcpy(*next + (at - next_base), buffer + (at - base), static_cast<size_t>(end - at));
        Item give_back;
        give_back.give_back = buffer;
        if (!Push(&read_, std::move(give_back))) return Stopped();
        buffer = *next;
        base = next_base;
      }
      // To the block after the record, or further where it is small.
      const int64_t want = std::min(
          std::max(RoundUp(need), std::min(end + kLeastRead, base + capacity_)), RoundUp(size));
      absl::StatusOr<int64_t> got =
          ReadAt(fd, &direct, buffer + (end - base), want - end, end, path);
      if (!got.ok()) {
        status = got.status();
        break;
      }
      end += *got;
      if (end < need) status = Lost(path, absl::StrCat("ends inside a record at byte ", at));
    }
    Item give_back;
    give_back.give_back = buffer;
    if (!Push(&read_, std::move(give_back))) return Stopped();
    return status;
  }

  const std::string dir_;
  const v1::CheckpointManifest& manifest_;
  const int64_t max_record_;
  const int64_t capacity_;       // of each buffer
  const size_t buffers_wanted_;  // at most
  const bool direct_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Item> read_ ABSL_GUARDED_BY(mu_);    // from the reading thread to the hashing one
  bool read_all_ ABSL_GUARDED_BY(mu_) = false;    // no more come
  std::deque<Item> hashed_ ABSL_GUARDED_BY(mu_);  // from the hashing thread to the caller
  bool hashed_all_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> buffers_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t*> free_ ABSL_GUARDED_BY(mu_);  // buffers given back
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Started in the constructor's body, once the rest is ready.
  std::thread reading_;
  std::thread hashing_;
};

}  // namespace

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
  bool direct = false;
  absl::StatusOr<int64_t> got =
      ReadAt(fd, &direct, reinterpret_cast<uint8_t*>(bytes.data()), st.st_size, 0, manifest_path);
  close(fd);
  if (!got.ok()) return got.status();
  if (*got != st.st_size || !manifest.ParseFromString(bytes)) {
    return Lost(manifest_path, "does not parse");
  }
  if (manifest.format() != kCheckpointFormat) {
    return Lost(manifest_path, absl::StrCat("has format ", manifest.format(),
                                            ", this daemon reads ", kCheckpointFormat));
  }
  return manifest;
}

absl::StatusOr<v1::CheckpointManifest> ReadCheckpoint(const std::string& dir,
                                                      int64_t max_chunk_bytes,
                                                      const CheckpointChunkFn& chunk,
                                                      const CheckpointReadOptions& options) {
  PARAMD_ASSIGN_OR_RETURN(v1::CheckpointManifest manifest, ReadCheckpointManifest(dir));
  RecordReader reader(dir, manifest, max_chunk_bytes + kChunkOverhead, options);
  // A file's damage (its structure, its CRC) is named before what the consumer said of its
  // records: the reader still hashes the rest of a file whose record the consumer refused.
  absl::Status consumer;
  RecordReader::Item item;
  v1::StateChunk message;
  std::string_view data;
  while (reader.Next(&item)) {
    if (item.give_back != nullptr) {
      reader.GiveBack(item.give_back);
      continue;
    }
    if (item.end) {
      PARAMD_RETURN_IF_ERROR(item.status);
      PARAMD_RETURN_IF_ERROR(consumer);
      continue;
    }
    if (!consumer.ok()) continue;
    if (!ParseRecord(item.record(), &message, &data)) {
      consumer = Lost(reader.Path(item.file),
                      absl::StrCat("has a record at byte ", item.at, " that does not parse"));
    } else {
      consumer = chunk(message, data);
    }
  }
  return manifest;
}

}  // namespace paramd
