#include <grpcpp/client_context.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/daemon_instance.h"
#include "common/grpc_status.h"
#include "paramd/v1/data.grpc.pb.h"
#include "transport/async_calls.h"
#include "transport/inline/inline.h"
#include "transport/shm/segment.h"
#include "transport/shm/shm.h"
#include "transport/slot_places.h"

namespace paramd {
namespace {

// A copy-out pull holds its lease only while it copies, then releases it without waiting for the
// answer; the lease expires after this long if the trainer dies first.
constexpr std::chrono::milliseconds kCopyLease{10000};

// Asks only for the segment names and the probe.
v1::AttachRequest ProbeRequest() {
  v1::AttachRequest request;
  request.set_transport("shm");
  return request;
}

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(const TransportContext& context)
      : context_(context),
        stub_(v1::Data::NewStub(context.channel)),
        inline_(MakeInlineTransport(context)),
        slots_(stub_.get(), "shm", [this](const v1::AttachResponse& r) { Remember(r); }) {}

  ~ShmTransport() override {
    slots_.WaitIdle();
    async_.WaitIdle();
  }

  std::string name() const override { return "shm"; }

  absl::Status Push(const PushTarget& target, std::span<const PushItem> items,
                    Deadline deadline) override {
    if (target.kind == v1::PUSH_KIND_INITIAL_WEIGHTS) {
      return inline_->Push(target, items, deadline);  // once per job, from rank 0
    }
    return slots_.PushFollowingRestarts([&] { return PushPlaced(target, items, deadline); });
  }

  absl::Status PushPlaced(const PushTarget& target, std::span<const PushItem> items,
                          Deadline deadline) {
    absl::StatusOr<std::shared_ptr<SlotCache>> slots = slots_.ForPush(target, items, deadline);
    if (!slots.ok()) return slots.status();
    auto locate = [&](const v1::ShmPlace& place) -> absl::StatusOr<uint8_t*> {
      absl::StatusOr<ShmSegment*> segment = Segment(place.segment(), (*slots)->instance, deadline);
      if (!segment.ok()) return segment.status();
      if (place.offset() + place.bytes() > (*segment)->size()) {
        return absl::DataLossError(
            absl::StrCat("slot of ", place.tensor(), " lies outside segment ", (*segment)->name()));
      }
      return (*segment)->data() + place.offset();
    };
    auto same = [](const uint8_t* slot, std::span<const std::byte> data) -> absl::StatusOr<bool> {
      return std::memcmp(slot, data.data(), data.size()) == 0;
    };
    absl::StatusOr<PushPlan> plan = PlanPush(**slots, target, items, locate, same);
    if (!plan.ok()) return plan.status();
    for (size_t i = 0; i < plan->placed.size(); ++i) {
      if (plan->slots[i] == nullptr) continue;  // there already: marked again only
      std::memcpy(plan->slots[i], plan->placed[i]->data.data(), plan->placed[i]->data.size());
    }
    if (!plan->placed.empty()) {
      if (absl::Status s = Mark(target, (*slots)->instance, plan->placed, deadline); !s.ok()) {
        return s;
      }
      slots_.MarkReceived(**slots, plan->placed);
      slots_.LookAhead(target);
    }
    if (!plan->inline_items.empty()) return inline_->Push(target, plan->inline_items, deadline);
    return absl::OkStatus();
  }

  absl::Status Pull(const PullTarget& target, Deadline deadline, Pulled* out) override {
    return PullOneOfMany(*this, target, deadline, out);
  }

  absl::Status PullInPlace(const PullTarget& target, Deadline deadline,
                           std::chrono::milliseconds lease, PulledView* out) override {
    return PullInPlaceOneOfMany(*this, target, deadline, lease, out);
  }

  absl::Status PullMany(const PullManyTarget& target, Deadline deadline,
                        std::vector<Pulled>* out) override {
    // The caller's buffers are kept: copies land in memory a previous pull already faulted in.
    out->resize(target.tensors.size());
    std::vector<uint64_t> leases;
    absl::Status status = PullPlacesEach(
        *stub_, target, kCopyLease, deadline, [&](size_t i, Pulled&& pulled) -> absl::Status {
          if (!pulled.header.has_place()) {
            (*out)[i] = std::move(pulled);
            return absl::OkStatus();
          }
          leases.push_back(pulled.header.lease());
          absl::StatusOr<std::span<const std::byte>> bytes = View(pulled.header, deadline);
          if (!bytes.ok()) return bytes.status();
          (*out)[i].data.assign(bytes->begin(), bytes->end());
          (*out)[i].header = std::move(pulled.header);
          return absl::OkStatus();
        });
    if (!leases.empty()) ReleaseSoon(*stub_, async_, leases);  // one call for all, not waited for
    return status;
  }

  absl::Status PullInPlaceMany(const PullManyTarget& target, Deadline deadline,
                               std::chrono::milliseconds lease,
                               std::vector<PulledView>* out) override {
    out->assign(target.tensors.size(), PulledView{});
    std::vector<uint64_t> leases;
    absl::Status status = PullPlacesEach(
        *stub_, target, lease, deadline, [&](size_t i, Pulled&& pulled) -> absl::Status {
          if (!pulled.header.has_place()) {
            return absl::FailedPreconditionError(
                absl::StrCat("the daemon keeps ", pulled.header.tensor(),
                             " out of shared memory (it ran out of room); use a pull that copies "
                             "(Pull, PullMany)"));
          }
          leases.push_back(pulled.header.lease());
          absl::StatusOr<std::span<const std::byte>> bytes = View(pulled.header, deadline);
          if (!bytes.ok()) return bytes.status();
          PulledView& view = (*out)[i];
          view.header = std::move(pulled.header);
          view.data = *bytes;
          view.lease = view.header.lease();
          return absl::OkStatus();
        });
    if (!status.ok() && !leases.empty()) ReleaseSoon(*stub_, async_, leases);  // nothing handed out
    return status;
  }

  absl::Status ReleaseMany(std::span<const uint64_t> leases, Deadline deadline) override {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    v1::ReleaseRequest request;
    for (uint64_t lease : leases) request.add_leases(lease);
    v1::ReleaseResponse response;
    return FromGrpcStatus(stub_->Release(&context, request, &response));
  }

  absl::Status Release(uint64_t lease, Deadline deadline) override {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    v1::ReleaseRequest request;
    request.add_leases(lease);
    v1::ReleaseResponse response;
    return FromGrpcStatus(stub_->Release(&context, request, &response));
  }

  // Maps segment 0 and checks the probe the daemon wrote there.
  absl::Status Probe(Deadline deadline) {
    v1::AttachResponse response;
    if (absl::Status s = AttachCall(*stub_, ProbeRequest(), deadline, &response); !s.ok()) {
      return s;
    }
    Remember(response);
    absl::StatusOr<ShmSegment*> first = Segment(0, 0, deadline);
    if (!first.ok()) return first.status();
    uint64_t probe = 0;
    if ((*first)->size() >= static_cast<int64_t>(sizeof(probe))) {
      std::memcpy(&probe, (*first)->data(), sizeof(probe));
    }
    if (probe != response.probe()) {
      return absl::FailedPreconditionError(
          absl::StrCat("segment ", (*first)->name(),
                       " here is not the daemon's (another host or another "
                       "/dev/shm)"));
    }
    return absl::OkStatus();
  }

 private:
  // Marks the placed items written, in one Push stream, naming the daemon start whose places
  // they are.
  absl::Status Mark(const PushTarget& target, uint64_t instance,
                    const std::vector<const PushItem*>& placed, Deadline deadline) {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    context.set_initial_metadata_corked(true);  // sent with the first write: one batch less
    v1::PushResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::PushChunk>> writer = stub_->Push(&context, &response);
    v1::PushChunk chunk;
    chunk.set_job(target.job);
    chunk.set_rank(target.rank);
    chunk.set_step(target.step);
    chunk.set_kind(target.kind);
    chunk.set_instance(instance);
    for (size_t i = 0; i < placed.size(); ++i) {
      chunk.set_tensor(placed[i]->tensor);
      chunk.set_in_place_bytes(static_cast<int64_t>(placed[i]->data.size()));
      if (i + 1 == placed.size()) {
        writer->WriteLast(chunk, grpc::WriteOptions());  // also closes the stream: one write less
      } else if (!writer->Write(chunk, grpc::WriteOptions().set_buffer_hint())) {
        break;  // the daemon ended the stream: Finish says why (the marks may go in batches)
      }
    }
    return FromGrpcStatus(writer->Finish());
  }

  absl::StatusOr<std::span<const std::byte>> View(const v1::PullHeader& header, Deadline deadline) {
    if (absl::Status s = FollowStart(header.instance(), deadline); !s.ok()) return s;
    absl::StatusOr<ShmSegment*> segment =
        Segment(header.place().segment(), header.instance(), deadline);
    if (!segment.ok()) return segment.status();
    const v1::ShmPlace& place = header.place();
    if (place.offset() < 0 || place.bytes() != header.data_bytes() + header.scale_bytes() ||
        place.offset() + place.bytes() > (*segment)->size()) {
      return absl::DataLossError(absl::StrCat("pulled place [", place.offset(), ", +",
                                              place.bytes(), ") does not fit segment ",
                                              (*segment)->name()));
    }
    return std::span<const std::byte>(
        reinterpret_cast<const std::byte*>((*segment)->data() + place.offset()),
        static_cast<size_t>(place.bytes()));
  }

  // Takes the segment names of an Attach answer. From a new start of the daemon (it restarted at
  // the same address), they replace the old ones, whose mappings stay until the transport goes
  // (a view may still point into them); a late answer of a past start is ignored.
  void Remember(const v1::AttachResponse& response) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const DaemonStarts::Seen seen = starts_.See(response.instance());
      if (seen == DaemonStarts::Seen::kPast) return;
      if (seen == DaemonStarts::Seen::kNew) {
        for (auto& [index, segment] : mapped_) retired_.push_back(std::move(segment));
        mapped_.clear();
        names_.clear();
      }
      if (response.segments_size() > static_cast<int>(names_.size())) {
        names_.assign(response.segments().begin(), response.segments().end());
      }
    }
    slots_.Observe(response.instance());
  }

  // Makes sure the segments mapped are those of daemon start `instance` (a pull's).
  absl::Status FollowStart(uint64_t instance, Deadline deadline) {
    return paramd::FollowStart(
        *stub_, ProbeRequest(), instance, deadline,
        [this] {
          std::lock_guard<std::mutex> lock(mu_);
          return starts_.current();
        },
        [this](const v1::AttachResponse& response) { Remember(response); });
  }

  // The mapping of segment `index` of daemon start `instance` (0: the current one), made on first
  // use (asking for new names when needed). A place of another start than the current one is
  // refused as such (the push then asks for its places again), never looked up in the current
  // start's segments.
  absl::StatusOr<ShmSegment*> Segment(int index, uint64_t instance, Deadline deadline) {
    if (index < 0) return absl::DataLossError(absl::StrCat("segment index ", index));
    std::string name;
    uint64_t start = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (instance != 0 && instance != starts_.current())
        return PlaceFromAnotherDaemonStart(absl::StrCat("segment ", index));
      auto it = mapped_.find(index);
      if (it != mapped_.end()) return it->second.get();
      if (index < static_cast<int>(names_.size())) name = names_[static_cast<size_t>(index)];
      start = starts_.current();
    }
    if (name.empty()) {
      v1::AttachResponse response;
      if (absl::Status s = AttachCall(*stub_, ProbeRequest(), deadline, &response); !s.ok()) {
        return s;
      }
      if (index >= response.segments_size()) {
        return absl::DataLossError(
            absl::StrCat("the daemon named segment ", index, " of ", response.segments_size()));
      }
      Remember(response);
      name = response.segments(index);
      start = response.instance();
    }
    absl::StatusOr<std::unique_ptr<ShmSegment>> segment = ShmSegment::Open(name, true);
    if (!segment.ok()) return segment.status();
    std::lock_guard<std::mutex> lock(mu_);
    // The daemon restarted while the segment was opened: it is the old start's (unmapped here).
    if (start != starts_.current() || (instance != 0 && instance != start)) {
      return PlaceFromAnotherDaemonStart(absl::StrCat("segment ", index));
    }
    auto [it, inserted] = mapped_.emplace(index, *std::move(segment));
    return it->second.get();
  }

  const TransportContext context_;
  std::unique_ptr<v1::Data::Stub> stub_;
  std::unique_ptr<Transport> inline_;

  std::mutex mu_;
  std::vector<std::string> names_;
  std::map<int, std::unique_ptr<ShmSegment>> mapped_;
  DaemonStarts starts_;                               // whose segments names_ and mapped_ are
  std::vector<std::unique_ptr<ShmSegment>> retired_;  // mappings of past starts
  StepSlots slots_;                                   // after what Remember uses
  AsyncCalls async_;                                  // releases in flight
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
