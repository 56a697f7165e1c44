// The trainer's end of a placed transport: one whose daemon keeps gradient slots and served bytes
// in memory this process maps (`shm`: shared memory; `cuda_ipc`: exported GPU memory). The
// lifecycle is written here once: attaching and probing, the slot places of a step (asked once
// per step, and for the next step as soon as a push is done), following a daemon that restarted
// at the same address, the placed push, the copy-out and in-place pulls, releasing leases. A
// transport fills in the hooks: how to map a region the daemon names, how to copy into and out of
// it, and how a push is marked written.
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

// One region of the daemon's memory as this process maps it (a segment, an IPC allocation);
// unmapped when destroyed.
class MappedRegion {
 public:
  virtual ~MappedRegion() = default;
  virtual uint8_t* data() const = 0;
  // Its length; -1 where the mapping does not tell (places in it are then not bounds-checked).
  virtual int64_t size() const = 0;
};

// A push sorted: items to write into their slots (with the slots' addresses), and items to push
// inline (unknown tensors, sizes that do not match, slots outside the mapped memory: the daemon
// then answers as for any other transport).
struct PushPlan {
  std::string job;  // whose slots they are
  std::vector<const PushItem*> placed;
  std::vector<uint8_t*> slots;  // null: the slot holds these bytes already (a retry): mark only
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
  // Marks every item of `items` written whole, the last closing the stream, and finishes it (the
  // transports whose copies are done before any mark: shm, nccl).
  absl::Status MarkWhole(std::span<const PushItem* const> items);
  // Ends the stream without a status of its own (the caller has one).
  void Cancel();
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
  // (0: the current one), mapped on first use. Each job's places lie in regions of its own.
  absl::StatusOr<MappedRegion*> Region(const std::string& job, int index, uint64_t instance,
                                       Deadline deadline);

  // The hooks.
  // How many regions an Attach answer names (segment names, IPC handles).
  virtual int RegionCount(const v1::AttachResponse& response) const = 0;
  // Maps region `index` of those `response` names.
  virtual absl::StatusOr<std::unique_ptr<MappedRegion>> Map(const v1::AttachResponse& response,
                                                            int index) = 0;
  // Judges a probe's answer (already remembered): OK when this process sees the daemon's memory.
  virtual absl::Status CheckProbe(const v1::AttachResponse& response, Deadline deadline) = 0;
  // Runs before a push reads the caller's buffers.
  virtual absl::Status BeforePush();
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
  // Whether `slot` (of job `job`) holds `data` already (only a retried push asks).
  virtual absl::StatusOr<bool> Same(const std::string& job, const uint8_t* slot,
                                    std::span<const std::byte> data) = 0;
  // Copies the plan's placed items into their slots (a null slot holds them already) and marks
  // them written with `marks`; returns once the caller's buffers have been read.
  virtual absl::Status CopyAndMark(const PushPlan& plan, Marks& marks) = 0;
  // Copies `bytes` bytes at `from` (served bytes of job `job`) into `out` (resized); may complete
  // only at FinishCopies.
  virtual absl::Status CopyOut(const std::string& job, const uint8_t* from, size_t bytes,
                               std::vector<std::byte>* out) = 0;
  virtual absl::Status FinishCopies();
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
  // Where a pulled place of job `job` lies in this process.
  absl::StatusOr<const uint8_t*> View(const std::string& job, const v1::PullHeader& header,
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

  // A job's regions: the answer naming the most of them, and those mapped.
  struct Regions {
    std::shared_ptr<const v1::AttachResponse> described;
    std::map<int, std::unique_ptr<MappedRegion>> mapped;
  };
  std::mutex mu_;
  DaemonStarts starts_;                                 // whose regions regions_ are
  std::map<std::string, Regions> regions_;              // by job
  std::vector<std::unique_ptr<MappedRegion>> retired_;  // mappings of past starts
  std::unique_ptr<StepSlots> slots_;                    // after what Remember uses
  std::unique_ptr<AsyncCalls> async_;                   // releases in flight (last: waits first)
};

}  // namespace paramd
