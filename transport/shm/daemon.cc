// The daemon's end of `shm`: it offers the transport with shared_memory on, on a backend that keeps
// its bytes in host memory (TransportHost::host_memory_backend: the cpu backend), and
// keeps each job's gradient slots and served bytes in an arena of the job's own, in a directory of
// this daemon's (transport/shm/segment.h). An Attach naming a job is answered with that job's
// segments only; a probe (no job) with a small segment of its own that holds the probe alone.
#include <unistd.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "transport/shm/arena.h"
#include "transport/shm/shm.h"

namespace paramd {
namespace {

constexpr int64_t kSegmentGranule = 2 << 20;

class ShmDaemonEnd final : public DaemonEnd {
 public:
  explicit ShmDaemonEnd(TransportHost& host) : host_(host) {
    // A GPU backend's host buffers are page-locked staging of its own, and same-node GPU trainers
    // map its exported GPU memory instead (DESIGN.md §6).
    if (!host.config().shared_memory() || !host.host_memory_backend()) return;
    if (const int removed = ReclaimStaleShmSegments(getuid()); removed > 0) {
      PARAMD_LOG(WARNING) << "removed " << removed
                          << " shared-memory segments left by a daemon of this user that was "
                             "killed";
    }
    if (absl::Status s = Open(); !s.ok()) {
      probe_.reset();
      directory_.reset();
      PARAMD_LOG(WARNING) << "no shared memory (" << s
                          << "); jobs keep their buffers on the heap and the shm transport is off";
    }
  }

  ~ShmDaemonEnd() override {
    absl::MutexLock lock(&mu_);
    current_.clear();
    arenas_.clear();
  }

  std::string why_not_offered() const override {
    if (probe_ != nullptr) return std::string();
    return absl::StrCat("this daemon keeps no buffers in shared memory (backend ",
                        host_.backend_name(), ", shared_memory ",
                        host_.config().shared_memory() ? "true" : "false",
                        "); use another transport");
  }

  std::optional<Memory> memory() const override { return Memory::kHost; }

  absl::Status Attach(const v1::AttachRequest& request, v1::AttachResponse* response) override {
    return AttachPlaced(
        host_, Memory::kHost, request,
        [this](const std::string& job, v1::AttachResponse* r) -> absl::Status {
          const ShmArena* arena = probe_.get();
          absl::MutexLock lock(&mu_);
          if (!job.empty()) {
            auto it = current_.find(job);
            if (it == current_.end()) {
              return absl::NotFoundError(
                  absl::StrCat("no job ", Quoted(job),
                               " keeps buffers in this daemon's shared memory; register it first"));
            }
            arena = arenas_.at(it->second).arena.get();
          }
          v1::ShmRegions* regions = r->mutable_shm();
          regions->clear_segments();
          for (const std::string& name : arena->segment_names()) regions->add_segments(name);
          regions->set_probe(arena->probe());
          return absl::OkStatus();
        },
        response);
  }

  // An arena of the job's own, its first segment sized for `bytes` (up to shm_segment_bytes). The
  // arena stays while the handle returned lives and then while any buffer of it is held.
  std::shared_ptr<BufferAllocator> JobBuffers(const std::string& job, int64_t bytes) override {
    if (probe_ == nullptr) return nullptr;
    const int64_t granules = std::max<int64_t>(1, (bytes + kSegmentGranule - 1) / kSegmentGranule);
    const int64_t first = std::min(host_.config().shm_segment_bytes(), granules * kSegmentGranule);
    absl::StatusOr<std::unique_ptr<ShmArena>> made =
        ShmArena::Create(absl::StrCat(directory_->path(), "/", RandomShmTag(), "."), first,
                         host_.instance(), directory_->group());
    if (!made.ok()) {
      PARAMD_LOG(WARNING) << "job " << Quoted(job) << " gets no shared memory (" << made.status()
                          << "); its buffers come from the heap";
      return nullptr;
    }
    ShmArena* arena = made->get();
    absl::MutexLock lock(&mu_);
    const uint64_t key = next_key_++;
    arenas_.emplace(key, JobArena{job, false, *std::move(made)});
    current_[job] = key;  // a job of this name that is going keeps its own until it has gone
    // The job's handle: when the job lets it go, its arena goes as soon as no buffer of it is held.
    return std::shared_ptr<BufferAllocator>(arena, [this, key](BufferAllocator*) {
      absl::MutexLock lock(&mu_);
      JobArena& a = arenas_.at(key);
      a.released = true;
      if (auto it = current_.find(a.job); it != current_.end() && it->second == key) {
        current_.erase(it);
      }
      ReapLocked();
    });
  }

  void AddStatus(v1::StatusResponse* status) const override {
    if (probe_ == nullptr) return;
    int32_t segments = 0;
    ForEachArena(
        [&](const ShmArena& a) { segments += static_cast<int32_t>(a.segment_names().size()); });
    const Bytes bytes = *own_bytes();
    status->set_shm_segments(segments);
    status->set_shm_reserved_bytes(bytes.reserved);
    status->set_shm_used_bytes(bytes.used);
  }

  std::optional<Bytes> own_bytes() const override {
    if (probe_ == nullptr) return std::nullopt;
    Bytes bytes;
    ForEachArena([&](const ShmArena& a) {
      bytes.reserved += a.reserved_bytes();
      bytes.used += a.used_bytes();
    });
    return bytes;
  }

 private:
  struct JobArena {
    std::string job;
    bool released = false;  // the job has let its handle go
    std::unique_ptr<ShmArena> arena;
  };

  absl::Status Open() {
    std::optional<gid_t> group;
    if (!host_.config().listen_group().empty()) {
      PARAMD_ASSIGN_OR_RETURN(group, GroupId(host_.config().listen_group()));
    }
    // The instance tags the directory: two daemons' stay apart even where process ids repeat
    // (containers).
    PARAMD_ASSIGN_OR_RETURN(
        directory_,
        ShmDirectory::Create(getuid(), getpid(),
                             absl::StrCat(absl::Hex(host_.instance(), absl::kZeroPad16)), group));
    PARAMD_ASSIGN_OR_RETURN(probe_, ShmArena::Create(absl::StrCat(directory_->path(), "/probe."),
                                                     kSegmentGranule, host_.instance(), group));
    return absl::OkStatus();
  }

  // Removes the arenas of jobs that have gone once no buffer of theirs is held (their segments
  // go with them).
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = arenas_.begin(); it != arenas_.end();) {
      it = it->second.released && it->second.arena->idle() ? arenas_.erase(it) : std::next(it);
    }
  }

  void ForEachArena(const std::function<void(const ShmArena&)>& each) const {
    each(*probe_);
    absl::MutexLock lock(&mu_);
    for (const auto& [key, a] : arenas_) each(*a.arena);
  }

  TransportHost& host_;
  std::unique_ptr<ShmDirectory> directory_;  // removed after every arena in it
  std::unique_ptr<ShmArena> probe_;          // what a trainer without a job maps
  mutable absl::Mutex mu_;
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
  // Every job's arena, kept after its job has gone while a buffer of it is held (a lease, a
  // checkpoint being written), and the newest arena of each job name.
  std::map<uint64_t, JobArena> arenas_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<DaemonEnd> MakeShmDaemonEnd(TransportHost& host) {
  return std::make_unique<ShmDaemonEnd>(host);
}

}  // namespace paramd
