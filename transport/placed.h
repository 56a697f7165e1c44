// The trainer's end of a placed transport: one whose daemon keeps gradient slots and served bytes
// in regions of its memory it names in Attach (`shm`: shared-memory segments; `cuda_ipc` and
// `nccl`: exported GPU allocations). The lifecycle is written here once: attaching and probing,
// the slot places of a step (asked once per step, and for the next step as soon as a push is
// done), following a daemon that restarted at the same address, the placed push and its marks,
// the copy-out and in-place pulls, releasing leases. A transport fills in the hooks: how to reach
// a region the daemon names, and a mover: how to move bytes into places and out of them.
//
// The base never reads or writes a place itself. A place (PlacedBytes) is either mapped memory of
// this process (shm's segments, cuda_ipc's opened IPC handles), which the mover copies into and
// out of, or an address in the daemon's memory that this process never dereferences (nccl's
// allocations, moved over a communicator; a network transport's remote memory, moved by RMA). The
// base decides which bytes go to which place and when; only the in-place pulls hand mapped places
// out as they are, and a transport whose places are not mapped refuses them (CanViewInPlace).
//
// Every transport's pulls mean the same: Pull and PullMany copy the served bytes out (holding a
// lease only while they copy); PullInPlace and PullInPlaceMany lease them where they lie, and the
// view stays valid and unchanged until Release or ReleaseMany is called or the lease expires.
// Release sends the end of the leases without waiting for the answer, which has nothing to report
// (unknown and expired leases are no error): the trainer has stopped reading, and a pull needs no
// round trip more. The daemon ends them as the call arrives; the transport waits for the call
// when it closes.
#pragma once

#include <grpcpp/support/sync_stream.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/place.h"
#include "paramd/v1/data.grpc.pb.h"
#include "transport/transport.h"

namespace paramd {

// Ten seconds from now: the deadline of a transport's own bookkeeping calls.
Deadline Soon();

// Which start of the daemon (AttachResponse.instance) a transport's mappings and places belong
// to. Answers come from the newest start seen, from a new one (the daemon restarted at the same
// address: forget what the old one handed out), or late from a past one (ignore them). Not
// thread-safe: its owner's lock guards it.
class DaemonStarts {
 public:
  enum class Seen { kCurrent, kNew, kPast };
  Seen See(uint64_t instance);
  uint64_t current() const;

 private:
  uint64_t current_ = 0;
  std::set<uint64_t> past_;
};

// Bytes at a place in the daemon's memory, as this process reaches them: at `mapped`, where the
// region is mapped here, else (mapped null) at `address` in the daemon's own memory, which only
// the transport's mover reaches.
struct PlacedBytes {
  uint8_t* mapped = nullptr;
  uint64_t address = 0;  // the daemon's address of the bytes (a region that is not mapped)
  size_t bytes = 0;
};

// One region of the daemon's memory as this process reaches it (a segment, an IPC allocation, an
// allocation known by its address); let go of when destroyed.
class DaemonRegion {
 public:
  virtual ~DaemonRegion() = default;
  // Its length; -1 where the transport is not told (places in it are then not bounds-checked).
  virtual int64_t size() const = 0;
  // The `bytes` bytes at `offset` (checked against size() by the caller).
  virtual PlacedBytes At(int64_t offset, size_t bytes) const = 0;
  // The daemon restarted: the region is kept (a view may still point into it) but lets go of
  // whatever it holds beyond that (shm: its page-locking for the GPU).
  virtual void Retire() {}
};

// A region mapped in this process: its places are addresses here.
class MappedRegion : public DaemonRegion {
 public:
  virtual uint8_t* data() const = 0;
  PlacedBytes At(int64_t offset, size_t bytes) const final { return {data() + offset, 0, bytes}; }
};

// A region known only by its address in the daemon's memory and its size: nothing is mapped, and
// its places are never dereferenced here.
class RemoteRegion final : public DaemonRegion {
 public:
  RemoteRegion(uint64_t base, int64_t size) : base_(base), size_(size) {}
  int64_t size() const override { return size_; }
  PlacedBytes At(int64_t offset, size_t bytes) const override {
    return {nullptr, base_ + static_cast<uint64_t>(offset), bytes};
  }

 private:
  const uint64_t base_;
  const int64_t size_;
};

// An item of a push and the slot it is moved into.
struct ToPlace {
  const PushItem* item;
  PlacedBytes slot;
};

// A push sorted: items to mark written in their slots (`placed`), of which those to move there
// first (`moves`: a retried item whose slot holds its bytes already is marked only), and items to
// push inline (unknown tensors, sizes that do not match, slots outside the region: the daemon
// then answers as for any other transport).
struct PushPlan {
  std::string job;  // whose slots they are
  std::vector<const PushItem*> placed;
  std::vector<ToPlace> moves;
  std::vector<PushItem> inline_items;
};

// The in-place push that marks placed bytes written: one Push stream, opened with the first
// message, naming the daemon start whose places they are. Marks travel together
// (PushChunk.marks): a push of many tensors is one message, or a few where they would not fit one
// of at most `max_bytes` (the daemon's max_chunk_bytes, below its largest message).
class Marks {
 public:
  Marks(v1::Data::Stub& stub, const PushTarget& target, uint64_t instance, Memory memory,
        Deadline deadline, int64_t max_bytes);
  // Marks [offset, offset + bytes) of `tensor` written (`lent`: where the trainer lent it, see
  // InPlaceMark.lent); `last` also sends the marks held and closes the stream. False when the
  // daemon ended the stream (Finish says why).
  bool Mark(const std::string& tensor, int64_t offset, int64_t bytes, bool last,
            const v1::LentMemory* lent = nullptr);
  // Marks every item of `items` written whole, the last closing the stream, and finishes it (a
  // placed push, once its moves are done).
  absl::Status MarkWhole(std::span<const PushItem* const> items);
  absl::Status Finish();

 private:
  // Sends the marks held (the last message also closes the stream); false as Mark.
  bool Send(bool last);

  v1::Data::Stub& stub_;
  const Deadline deadline_;
  grpc::ClientContext context_;
  v1::PushResponse response_;
  std::unique_ptr<grpc::ClientWriter<v1::PushChunk>> writer_;
  v1::PushChunk chunk_;   // the marks held, not sent yet
  v1::InPlaceMark mark_;  // what every mark of this push shares
  const int64_t max_bytes_;
  int64_t held_bytes_ = 0;
};

class AsyncCalls;

class PlacedTransport : public Transport {
 public:
  ~PlacedTransport() override;

  std::string name() const final { return name_; }
  absl::Status Push(const PushTarget& target, std::span<const PushItem> items,
                    Deadline deadline) final;
  absl::Status Pull(const PullTarget& target, Deadline deadline, Pulled* out) final;
  absl::Status PullInPlace(const PullTarget& target, Deadline deadline,
                           std::chrono::milliseconds lease, PulledView* out) final;
  absl::Status PullMany(const PullManyTarget& target, Deadline deadline,
                        std::vector<Pulled>* out) final;
  absl::Status PullInPlaceMany(const PullManyTarget& target, Deadline deadline,
                               std::chrono::milliseconds lease, std::vector<PulledView>* out) final;
  absl::Status Release(uint64_t lease, Deadline deadline) final;
  absl::Status ReleaseMany(std::span<const uint64_t> leases, Deadline deadline) final;

  // Asks Attach for the daemon's regions and lets the transport judge the answer (CheckProbe):
  // OK when it can work with this daemon.
  absl::Status Probe(Deadline deadline);

 protected:
  // `region_noun` names a region in messages ("segment").
  PlacedTransport(const TransportContext& context, std::string name, Memory memory,
                  std::string region_noun);
  // Waits for the calls in flight, which reach the hooks: a transport's destructor calls it
  // first.
  void Stop();
  const TransportContext& context() const { return context_; }
  // Region `index` of job `job`'s regions ("": those a probe names) of daemon start `instance`
  // (0: the current one), reached (Map) on first use. Each job's places lie in regions of its own.
  absl::StatusOr<DaemonRegion*> Region(const std::string& job, int index, uint64_t instance,
                                       Deadline deadline);

  // The hooks. How a region is reached:
  // How many regions an Attach answer names (segment names, IPC handles, addresses).
  virtual int RegionCount(const v1::AttachResponse& response) const = 0;
  // Reaches region `index` of those `response` names: maps it (a MappedRegion), or keeps its
  // address (a RemoteRegion).
  virtual absl::StatusOr<std::unique_ptr<DaemonRegion>> Map(const v1::AttachResponse& response,
                                                            int index) = 0;
  // Judges a probe's answer (already remembered): OK when this process reaches the daemon's
  // memory.
  virtual absl::Status CheckProbe(const v1::AttachResponse& response, Deadline deadline) = 0;
  // Runs before a push reads the caller's buffers; `ready_event` as PushTarget's.
  virtual absl::Status BeforePush(uintptr_t ready_event);
  // OK where the regions are mapped in this process, so PullInPlace can give views of them; else
  // why not (FAILED_PRECONDITION; nothing is leased).
  virtual absl::Status CanViewInPlace() const { return absl::OkStatus(); }
  // The items of a push the daemon may read where they lie (cuda_ipc's lent gradients), in the
  // items' order, each with where it lies; the others are pushed as usual. Returns once the
  // caller's work writing the lent items has completed (their marks promise it). None by default.
  struct Lent {
    const PushItem* item;
    v1::LentMemory memory;
  };
  virtual absl::StatusOr<std::vector<Lent>> Lend(std::span<const PushItem> items);

  // The mover: how bytes go into places of job `job` and out of them.
  // Whether `slot` holds `data` already (only a retried push asks).
  virtual absl::StatusOr<bool> PlaceHolds(const std::string& job, const PlacedBytes& slot,
                                          std::span<const std::byte> data) = 0;
  // Moves each item's bytes into its slot; returns once they lie there (the base then marks them
  // written) and the caller's buffers have been read. Called for every placed push, `moves` empty
  // where each slot held its item already.
  virtual absl::Status MoveToPlaces(const std::string& job, std::span<const ToPlace> moves) = 0;
  // Moves the bytes at `from` (served bytes) into `out` (resized); may complete only at
  // FinishMovesFromPlaces, which a pull calls once, after its last MoveFromPlace.
  virtual absl::Status MoveFromPlace(const std::string& job, const PlacedBytes& from,
                                     std::vector<std::byte>* out) = 0;
  virtual absl::Status FinishMovesFromPlaces();
  // Runs once a pull's places are known, before their bytes are read: `in_place` when the views
  // go to the caller, else before this transport copies them out. A daemon may publish a version
  // whose step is still running on its GPU: cuda_ipc makes the reading stream wait for it.
  virtual absl::Status BeforeRead(bool in_place);
  // The items the inline path sends (initial weights, and any the daemon did not place) as host
  // bytes: this default takes them as they are; cuda_ipc copies those in GPU memory into
  // `storage` first, since the inline path reads them on the host.
  virtual absl::Status ToHost(std::span<const PushItem> items, std::vector<PushItem>* host,
                              std::vector<std::vector<std::byte>>* storage);

 private:
  // Pushes `items` over the inline path, as host bytes (ToHost).
  absl::Status PushInline(const PushTarget& target, std::span<const PushItem> items,
                          Deadline deadline);
  struct SlotCache;
  class StepSlots;

  absl::Status PushPlaced(const PushTarget& target, std::span<const PushItem> items,
                          Deadline deadline);
  // Marks the lent items (no slot places: the memory is the trainer's) and pushes the others.
  absl::Status PushLending(const PushTarget& target, std::span<const PushItem> items,
                           Deadline deadline);
  absl::StatusOr<PushPlan> PlanPush(const SlotCache& slots, const PushTarget& target,
                                    std::span<const PushItem> items, Deadline deadline);
  // The bytes at a pulled place of job `job`.
  absl::StatusOr<PlacedBytes> View(const std::string& job, const v1::PullHeader& header,
                                   Deadline deadline);
  // Takes the regions an Attach answer names. From a new start of the daemon (it restarted at the
  // same address) they replace the old ones, whose mappings stay until the transport goes (a view
  // may still point into them); a late answer of a past start is ignored.
  void Remember(const std::string& job, const v1::AttachResponse& response);
  // Makes sure the regions mapped are those of daemon start `instance` (a pulled place's).
  absl::Status FollowStart(uint64_t instance, Deadline deadline);
  // The Attach that asks for job `job`'s regions ("": a probe's), declaring nothing.
  v1::AttachRequest RegionsRequest(const std::string& job) const;

  const TransportContext context_;
  const std::string name_;
  const Memory memory_;
  const std::string region_noun_;
  std::unique_ptr<v1::Data::Stub> stub_;
  std::unique_ptr<Transport> inline_;

  // A job's regions: the answer naming the most of them, and those reached (Map).
  struct Regions {
    std::shared_ptr<const v1::AttachResponse> described;
    std::map<int, std::unique_ptr<DaemonRegion>> mapped;
  };
  std::mutex mu_;
  DaemonStarts starts_;                                 // whose regions regions_ are
  std::map<std::string, Regions> regions_;              // by job
  std::vector<std::unique_ptr<DaemonRegion>> retired_;  // regions of past starts
  std::unique_ptr<StepSlots> slots_;                    // after what Remember uses
  std::unique_ptr<AsyncCalls> async_;                   // releases in flight (last: waits first)
};

}  // namespace paramd
