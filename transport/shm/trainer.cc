// The trainer's end of `shm`: a placed transport (transport/placed.h) whose regions are the
// daemon's POSIX shared-memory segments, mapped by name, and whose mover copies host memory with
// memcpy and, for a trainer with a GPU (TransportContext::cuda_device), GPU memory by DMA
// (transport/shm/gpu_copies.h): its segments are page-locked as they are mapped.
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/copy_bytes.h"
#include "transport/placed.h"
#include "transport/shm/gpu_copies.h"
#include "transport/shm/segment.h"
#include "transport/shm/shm.h"

namespace paramd {
namespace {

class MappedSegment final : public MappedRegion {
 public:
  MappedSegment(std::unique_ptr<ShmSegment> segment,
                std::unique_ptr<GpuCopies::Registration> registration)
      : segment_(std::move(segment)), registration_(std::move(registration)) {}
  uint8_t* data() const override { return segment_->data(); }
  int64_t size() const override { return segment_->size(); }
  const std::string& name() const { return segment_->name(); }
  // A past start's segment stays mapped while views may point into it; its pages are unlocked.
  void Retire() override { registration_.reset(); }

 private:
  std::unique_ptr<ShmSegment> segment_;
  std::unique_ptr<GpuCopies::Registration> registration_;  // page-locked for the GPU; or null
};

class ShmTransport final : public PlacedTransport {
 public:
  explicit ShmTransport(const TransportContext& context)
      : PlacedTransport(context, "shm", Memory::kHost, "segment") {
    if (context.cuda_device < 0) return;
    absl::StatusOr<std::unique_ptr<GpuCopies>> gpu =
        GpuCopies::Make(context.cuda_device, context.cuda_stream);
    // Without the GPU (a build without CUDA, a device not visible), GPU memory is not read and
    // traits() says so: the caller copies it to the host first.
    if (gpu.ok()) gpu_ = *std::move(gpu);
  }
  ~ShmTransport() override { Stop(); }

  // The daemon's segments are mapped here: host memory, read and viewed where it lies; with the
  // trainer's GPU, its memory is moved by DMA.
  TransportTraits traits() const override {
    return {
        .reads_device_memory = gpu_ != nullptr, .views_in_place = true, .memory = Memory::kHost};
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
    std::unique_ptr<GpuCopies::Registration> registration;
    if (gpu_ != nullptr) {
      absl::StatusOr<std::unique_ptr<GpuCopies::Registration>> r =
          gpu_->Register((*segment)->data(), static_cast<size_t>((*segment)->size()));
      if (!r.ok()) {
        return absl::Status(r.status().code(),
                            absl::StrCat("page-locking segment ", (*segment)->name(),
                                         " for the GPU: ", r.status().message()));
      }
      registration = *std::move(r);
    }
    return std::make_unique<MappedSegment>(*std::move(segment), std::move(registration));
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

  // The gradients in GPU memory may still be being written on the trainer's stream.
  absl::Status BeforePush(uintptr_t ready_event) override {
    return gpu_ == nullptr ? absl::OkStatus() : gpu_->AfterCallersWork(ready_event);
  }

  bool OnGpu(std::span<const std::byte> data) const {
    return gpu_ != nullptr && !data.empty() && gpu_->IsGpuMemory(data.data());
  }

  absl::StatusOr<bool> PlaceHolds(const std::string&, const PlacedBytes& slot,
                                  std::span<const std::byte> data) override {
    if (OnGpu(data)) return gpu_->Holds(slot.mapped, data.data(), data.size());
    return std::memcmp(slot.mapped, data.data(), data.size()) == 0;
  }

  // GPU items are queued on the copy engines first, host items copied meanwhile; returns once
  // every copy is done (the marks follow).
  absl::Status MoveToPlaces(const std::string&, std::span<const ToPlace> moves) override {
    absl::Status s;
    bool queued = false;
    std::vector<const ToPlace*> host;  // each item's memory asked once (a driver call)
    host.reserve(moves.size());
    for (const ToPlace& move : moves) {
      const std::span<const std::byte> data = move.item->data;
      if (!OnGpu(data)) {
        host.push_back(&move);
        continue;
      }
      s = gpu_->QueueToHost(move.slot.mapped, data.data(), data.size());
      queued = true;
      if (!s.ok()) break;
    }
    if (s.ok()) {
      for (const ToPlace* move : host) {
        CopyBytes(move->slot.mapped, move->item->data.data(), move->item->data.size());
      }
    }
    if (queued) {
      if (absl::Status waited = gpu_->Wait(); s.ok()) s = waited;
    }
    return s;
  }

  absl::Status ToHost(std::span<const PushItem> items, std::vector<PushItem>* host,
                      std::vector<std::vector<std::byte>>* storage) override {
    if (gpu_ == nullptr) return PlacedTransport::ToHost(items, host, storage);
    return gpu_->ToHost(items, host, storage);
  }

  absl::Status MoveFromPlace(const std::string&, const PlacedBytes& from,
                             std::vector<std::byte>* out) override {
    // Keeps the buffer's memory, faulted in already: only a larger pull grows it.
    out->resize(from.bytes);
    CopyBytes(out->data(), from.mapped, from.bytes);
    return absl::OkStatus();
  }

  std::unique_ptr<GpuCopies> gpu_;  // the trainer's GPU's copies; null: host memory only
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
