// The daemon's end of a transport: whether this daemon offers it, the memory it exposes to
// trainers, and its answers to Attach. The daemon makes one per entry of the transport table
// (transport.h) and asks them by name, so the daemon itself names no transport. An end reaches the
// daemon only through TransportHost, which keeps transport/ free of the daemon's code.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device_bytes.h"
#include "common/host_buffer.h"
#include "common/place.h"
#include "paramd/v1/config.pb.h"
#include "paramd/v1/control.pb.h"
#include "paramd/v1/data.pb.h"

namespace paramd {

// What a transport's daemon end asks of the daemon.
class TransportHost {
 public:
  virtual ~TransportHost() = default;
  virtual const v1::DaemonConfig& config() const = 0;
  // This start's identity (AttachResponse.instance), drawn at random.
  virtual uint64_t instance() const = 0;
  // For messages: the backend's name ("cpu", "cuda:0"). Ends decide from the traits below.
  virtual const std::string& backend_name() const = 0;
  // Whether the backend keeps its jobs' state and served bytes in host memory, where a transport
  // may hand out their buffers (memory trainers on this node map); false where it keeps them on a
  // GPU (its host buffers are staging of its own).
  virtual bool host_memory_backend() const = 0;
  // The backend's exported GPU memory as job `job`'s trainers map it (the job's allocations alone;
  // none for ""); nothing on a backend without it.
  virtual std::optional<DeviceExports> device_exports(const std::string& job = "") const = 0;
  // A rank's slot places for `step` in `memory` (Job::SlotsForStep).
  virtual absl::StatusOr<SlotPlaces> SlotsForStep(const std::string& job, int32_t rank,
                                                  int64_t step, Memory memory) = 0;
  // Records the transport a rank of a job declared (Status reports it).
  virtual absl::Status DeclareTransport(const v1::AttachRequest& request) = 0;
};

class DaemonEnd {
 public:
  virtual ~DaemonEnd() = default;
  // Empty when this daemon offers the transport, else why not (its backend or config).
  virtual std::string why_not_offered() const = 0;
  bool offered() const { return why_not_offered().empty(); }
  // Where the transport's places lie; none for one that carries the bytes in its messages.
  virtual std::optional<Memory> memory() const = 0;
  // Answers an Attach naming this transport, once it is offered; its purpose is set
  // (DaemonEnds::Attach refuses one without). A purpose the transport has no use for is
  // INVALID_ARGUMENT (NotThisTransports).
  virtual absl::Status Attach(const v1::AttachRequest& request, v1::AttachResponse* response) = 0;
  // Where job `job`'s host buffers come from when this transport exposes them: memory of the job's
  // own (its trainers are told of it, no other job's are), with room for about `bytes` at first.
  // The end keeps it while the handle lives and then while a buffer of it is held. Null where the
  // transport exposes none.
  virtual std::shared_ptr<BufferAllocator> JobBuffers(const std::string& job, int64_t bytes) {
    return nullptr;
  }
  // What an operator sees of the transport in Status.
  virtual void AddStatus(v1::StatusResponse* status) const {}
  // Bytes of memory the transport keeps for itself, reserved and in use (a gauge); none where it
  // keeps none.
  struct Bytes {
    int64_t reserved = 0;
    int64_t used = 0;
  };
  virtual std::optional<Bytes> own_bytes() const { return std::nullopt; }
};

// The daemon ends of every transport in the table, in its order.
class DaemonEnds {
 public:
  struct End {
    std::string name;
    std::unique_ptr<DaemonEnd> end;
  };
  static DaemonEnds Make(TransportHost& host);

  const std::vector<End>& all() const { return ends_; }
  // The end of transport `name`; INVALID_ARGUMENT naming those the daemon knows where none is.
  absl::StatusOr<DaemonEnd*> Find(const std::string& name) const;
  // Answers an Attach (the Data service's dispatch): one that names no purpose, an older client's
  // (its purpose was told by which fields were set), is FAILED_PRECONDITION with
  // ERROR_REASON_CLIENT_TOO_OLD, saying to upgrade the client; else the end of the transport it
  // names answers, once that end is offered (FAILED_PRECONDITION saying why not otherwise).
  absl::Status Attach(const v1::AttachRequest& request, v1::AttachResponse* response) const;
  // The offered transport whose places lie in `memory` (its bytes counted under its name); with
  // none, the one that carries bytes in its messages.
  const std::string& NameOf(std::optional<Memory> memory) const;
  // The transport that moved bytes of `memory` (none: in its messages) for a trainer that uses
  // `declared` (its Attach, or its pull's PullRequest.transport): that one where its memory is
  // this memory, else NameOf(memory). The label of /metrics' byte counters: nccl's bytes lie in
  // the device memory cuda_ipc maps too, and are nccl's.
  const std::string& LabelFor(const std::string& declared, std::optional<Memory> memory) const;
  // Ends made elsewhere (tests: ends of fake transports).
  static DaemonEnds Of(std::vector<End> ends);
  // Job `job`'s host buffers from the first offered end that has them; null when none has.
  std::shared_ptr<BufferAllocator> JobBuffers(const std::string& job, int64_t bytes) const;

 private:
  std::vector<End> ends_;
};

// The name of an Attach's purpose ("probe", "declare", "regions", "slots", "nccl_open",
// "nccl_transfer"; "none" where it has none), for messages.
std::string AttachPurpose(const v1::AttachRequest& request);
// INVALID_ARGUMENT: transport `request.transport()` has no use for the request's purpose.
absl::Status NotThisTransports(const v1::AttachRequest& request);

// The Attach of a transport with slot places in `memory`, by purpose: `probe` is answered with
// `describe("")`, `regions` with `describe(job)`, `slots` with the rank's slot places of the step
// and then `describe(job)` (slots allocated now may have added regions), `declare` declares the
// transport for the rank and describes the job's regions; any other purpose is NotThisTransports.
using DescribeRegions = std::function<absl::Status(const std::string& job, v1::AttachResponse*)>;
absl::Status AttachPlaced(TransportHost& host, Memory memory, const v1::AttachRequest& request,
                          const DescribeRegions& describe, v1::AttachResponse* response);

}  // namespace paramd
