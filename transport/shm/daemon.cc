// The daemon's end of `shm`: it offers the transport on the cpu backend with shared_memory on,
// keeps jobs' gradient slots and served bytes in its arena of segments, and names the segments and
// the probe in every Attach answer.
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "transport/shm/arena.h"
#include "transport/shm/shm.h"

namespace paramd {
namespace {

class ShmDaemonEnd final : public DaemonEnd {
 public:
  explicit ShmDaemonEnd(TransportHost& host) : host_(host) {
    // A cuda:N job's host buffers are page-locked staging for the GPU, and same-node GPU trainers
    // map its exported GPU memory instead (DESIGN.md §6).
    if (!host.config().shared_memory() || !absl::StartsWith(host.backend_name(), "cpu")) return;
    if (const int removed = ReclaimStaleShmSegments(getuid()); removed > 0) {
      PARAMD_LOG(WARNING) << "removed " << removed
                          << " shared-memory segments left by a daemon of this user that was "
                             "killed";
    }
    // The instance tags the segment names: two daemons' names stay apart even where process ids
    // repeat (containers).
    absl::StatusOr<std::unique_ptr<ShmArena>> arena = ShmArena::Create(
        ShmSegmentPrefix(getuid(), getpid(),
                         absl::StrCat(absl::Hex(host.instance(), absl::kZeroPad16))),
        host.config().shm_segment_bytes(), host.instance());
    if (arena.ok()) {
      arena_ = *std::move(arena);
    } else {
      PARAMD_LOG(WARNING) << "no shared memory (" << arena.status()
                          << "); jobs keep their buffers on the heap and the shm transport is off";
    }
  }

  std::string why_not_offered() const override {
    if (arena_ != nullptr) return std::string();
    return absl::StrCat("this daemon keeps no buffers in shared memory (backend ",
                        host_.backend_name(), ", shared_memory ",
                        host_.config().shared_memory() ? "true" : "false",
                        "); use another transport");
  }

  std::optional<Memory> memory() const override { return Memory::kHost; }

  absl::Status Attach(const v1::AttachRequest& request, v1::AttachResponse* response) override {
    return AttachPlaced(
        host_, Memory::kHost, request,
        [this](v1::AttachResponse* r) {
          v1::ShmRegions* regions = r->mutable_shm();
          regions->clear_segments();
          for (const std::string& name : arena_->segment_names()) {
            regions->add_segments(name);
          }
          regions->set_probe(arena_->probe());
        },
        response);
  }

  BufferAllocator* host_buffers() override { return arena_.get(); }

  void AddStatus(v1::StatusResponse* status) const override {
    if (arena_ == nullptr) return;
    status->set_shm_segments(static_cast<int32_t>(arena_->segment_names().size()));
    status->set_shm_reserved_bytes(arena_->reserved_bytes());
    status->set_shm_used_bytes(arena_->used_bytes());
  }

  std::optional<Bytes> own_bytes() const override {
    if (arena_ == nullptr) return std::nullopt;
    return Bytes{arena_->reserved_bytes(), arena_->used_bytes()};
  }

 private:
  TransportHost& host_;
  std::unique_ptr<ShmArena> arena_;  // outlives every buffer carved from it (the daemon's last)
};

}  // namespace

std::unique_ptr<DaemonEnd> MakeShmDaemonEnd(TransportHost& host) {
  return std::make_unique<ShmDaemonEnd>(host);
}

}  // namespace paramd
