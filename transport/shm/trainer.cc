// The trainer's end of `shm`: a placed transport (transport/placed.h) whose regions are the
// daemon's POSIX shared-memory segments, mapped by name, and whose mover copies with memcpy.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/copy_bytes.h"
#include "transport/placed.h"
#include "transport/shm/segment.h"
#include "transport/shm/shm.h"

namespace paramd {
namespace {

class MappedSegment final : public MappedRegion {
 public:
  explicit MappedSegment(std::unique_ptr<ShmSegment> segment) : segment_(std::move(segment)) {}
  uint8_t* data() const override { return segment_->data(); }
  int64_t size() const override { return segment_->size(); }
  const std::string& name() const { return segment_->name(); }

 private:
  std::unique_ptr<ShmSegment> segment_;
};

class ShmTransport final : public PlacedTransport {
 public:
  explicit ShmTransport(const TransportContext& context)
      : PlacedTransport(context, "shm", Memory::kHost, "segment") {}
  ~ShmTransport() override { Stop(); }

  // The daemon's segments are mapped here: host memory, read and viewed where it lies.
  TransportTraits traits() const override {
    return {.reads_device_memory = false, .views_in_place = true, .memory = Memory::kHost};
  }

 private:
  int RegionCount(const v1::AttachResponse& response) const override {
    return response.shm().segments_size();
  }

  absl::StatusOr<std::unique_ptr<DaemonRegion>> Map(const v1::AttachResponse& response,
                                                    int index) override {
    absl::StatusOr<std::unique_ptr<ShmSegment>> segment =
        ShmSegment::Open(response.shm().segments(index), true);
    if (!segment.ok()) return segment.status();
    return std::make_unique<MappedSegment>(*std::move(segment));
  }

  // The probe the daemon wrote at the start of segment 0 proves this process maps its memory.
  absl::Status CheckProbe(const v1::AttachResponse& response, Deadline deadline) override {
    absl::StatusOr<DaemonRegion*> region = Region(context().job, 0, 0, deadline);
    if (!region.ok()) return region.status();
    const auto* first = static_cast<const MappedSegment*>(*region);  // Map made it
    uint64_t probe = 0;
    if (first->size() >= static_cast<int64_t>(sizeof(probe))) {
      std::memcpy(&probe, first->data(), sizeof(probe));
    }
    if (probe != response.shm().probe()) {
      return absl::FailedPreconditionError(
          absl::StrCat("segment ", first->name(),
                       " here is not the daemon's (another host or another /dev/shm)"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> PlaceHolds(const std::string&, const PlacedBytes& slot,
                                  std::span<const std::byte> data) override {
    return std::memcmp(slot.mapped, data.data(), data.size()) == 0;
  }

  absl::Status MoveToPlaces(const std::string&, std::span<const ToPlace> moves) override {
    for (const ToPlace& move : moves) {
      CopyBytes(move.slot.mapped, move.item->data.data(), move.item->data.size());
    }
    return absl::OkStatus();
  }

  absl::Status MoveFromPlace(const std::string&, const PlacedBytes& from,
                             std::vector<std::byte>* out) override {
    // Keeps the buffer's memory, faulted in already: only a larger pull grows it.
    out->resize(from.bytes);
    CopyBytes(out->data(), from.mapped, from.bytes);
    return absl::OkStatus();
  }
};

}  // namespace

std::string ShmWhyNotViable(const TransportContext& context) {
  ShmTransport probe(context);
  absl::Status status = probe.Probe(Soon());
  return status.ok() ? std::string() : std::string(status.message());
}

absl::StatusOr<std::unique_ptr<Transport>> MakeShmTransport(const TransportContext& context) {
  auto transport = std::make_unique<ShmTransport>(context);
  if (absl::Status s = transport->Probe(Soon()); !s.ok()) return s;
  return transport;
}

}  // namespace paramd
