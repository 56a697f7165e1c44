// How bytes move between a trainer and the daemon (DESIGN.md §6). Commit always travels over gRPC
// (Data.Commit), whatever moved the bytes.
//
// Layout: transport/<name>/ holds both ends of transport <name>: the trainer's (a Transport) and
// the daemon's (a DaemonEnd, transport/daemon_end.h: whether it is offered, the memory it exposes,
// its Attach answers). The table below names each transport once, with both ends' factories; the
// client chooses from it (the first viable one unless told which), and the daemon makes its ends
// from it, so its order is the automatic order, its names are the metric labels and the names
// Attach dispatches on. What a trainer's end can do is its instance's traits (TransportTraits),
// which callers read instead of its name. The placed transports (shm, cuda_ipc, nccl) share their
// trainer's lifecycle (transport/placed.h): the base chooses places and a transport's mover moves
// bytes into and out of them, in memory mapped here or at addresses of the daemon's it never
// dereferences; the buffer and place types both ends speak of are in common/. A new transport is
// one folder, one line in the table, and an instance of the conformance suite (tests/conformance).
#pragma once

#include <grpcpp/channel.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/place.h"
#include "paramd/v1/data.pb.h"
#include "paramd/v1/types.pb.h"
#include "transport/daemon_end.h"

namespace paramd {

using Deadline = std::chrono::system_clock::time_point;

// One tensor's bytes to push: a gradient of `step`, or rank 0's initial FP32 weights.
struct PushItem {
  std::string tensor;
  std::span<const std::byte> data;
};

struct PushTarget {
  std::string job;
  int32_t rank = 0;
  int64_t step = 0;
  v1::PushKind kind = v1::PUSH_KIND_GRADIENT;
  // Items in GPU memory: a cudaEvent_t recorded after the work that wrote them (a gradient's
  // backward), which the push's copies wait for instead of all the work queued on the trainer's
  // stream so far (shm, nccl; cuda_ipc's daemon reads them after the commit). 0: that work.
  uintptr_t ready_event = 0;
};

struct PullTarget {
  std::string job;
  std::string tensor;
  v1::ServeFormat format;
  int64_t min_version = 0;
};

// Several tensors of one job, in one format, at a minimum version.
struct PullManyTarget {
  std::string job;
  std::vector<std::string> tensors;
  v1::ServeFormat format;
  int64_t min_version = 0;
};

// What a pull delivered: the header, and the bytes in `data`.
struct Pulled {
  v1::PullHeader header;
  std::vector<std::byte> data;
};

// A pull read where the bytes lie (the daemon's shared memory): valid, and unchanged, until the
// lease is released or expires.
struct PulledView {
  v1::PullHeader header;
  std::span<const std::byte> data;  // data_bytes of data, then scale_bytes of scales
  uint64_t lease = 0;
  // A piece of a tensor split over daemons (Client::PullInPlacePieces): its first row in the
  // whole tensor (header.rows() rows from here). 0 for a whole tensor.
  int64_t row_begin = 0;
  // A sharded job's view: the index of the owner whose memory it lies in (the job's sorted daemon
  // list). 0 for a job on one daemon.
  int owner = 0;
};

// What a trainer's transport can do, as the instance says: callers decide from these, never from
// its name (a transport may find its abilities at run time: a UCX built with CUDA support, say).
struct TransportTraits {
  // Push reads items in the trainer's GPU memory itself (and a pull's bytes can land there):
  // CUDA tensors may be handed to it as they are. Without it, every item is host memory.
  bool reads_device_memory = false;
  // PullInPlace and PullInPlaceMany give views of the served bytes where they lie (mapped in this
  // process); without it they are FAILED_PRECONDITION and a pull copies.
  bool views_in_place = false;
  // Where the daemon's places this transport reads and writes lie (a view's bytes, with
  // views_in_place); none for a transport that carries the bytes in its messages.
  std::optional<Memory> memory;
};

// The trainer's end of a transport.
class Transport {
 public:
  virtual ~Transport() = default;
  // For logs, Status and the metric label: what the trainer chose (abilities are in traits()).
  virtual std::string name() const = 0;
  virtual TransportTraits traits() const = 0;
  // Pushes the items. Safe to retry after a failure: pushes are idempotent.
  virtual absl::Status Push(const PushTarget& target, std::span<const PushItem> items,
                            Deadline deadline) = 0;
  // Waits for `target.min_version` (or the deadline) and copies the served bytes into `out`.
  virtual absl::Status Pull(const PullTarget& target, Deadline deadline, Pulled* out) = 0;
  // Waits like Pull and leases the served bytes where they lie for `lease` (0: the daemon's
  // default): the view is valid and unchanged until Release is called or the lease expires.
  // FAILED_PRECONDITION, with no lease taken, where the transport cannot (its bytes travel in
  // messages, or the daemon kept these out of the memory it maps). The same on every transport
  // (the conformance suite checks it).
  virtual absl::Status PullInPlace(const PullTarget& target, Deadline deadline,
                                   std::chrono::milliseconds lease, PulledView* out) {
    return absl::FailedPreconditionError("transport " + name() +
                                         " cannot read in place; use Pull (a copy)");
  }
  // Ends a lease of PullInPlace: the view's bytes must not be read once it is called. The end is
  // sent without waiting for the daemon's answer (the daemon ends the lease as it arrives): a pull
  // saves a round trip. An ended, expired or unknown lease is no error. This default serves a
  // transport that takes no leases.
  virtual absl::Status Release(uint64_t lease, Deadline deadline) { return absl::OkStatus(); }

  // Several tensors, copied out, in `target.tensors`' order. This default pulls them one by one;
  // the same-node transports ask once (PullRequest.tensors) and copy each as soon as the daemon
  // has published it.
  virtual absl::Status PullMany(const PullManyTarget& target, Deadline deadline,
                                std::vector<Pulled>* out) {
    out->resize(target.tensors.size());  // each keeps its buffer (Client::Pull)
    for (size_t i = 0; i < target.tensors.size(); ++i) {
      const PullTarget one{target.job, target.tensors[i], target.format, target.min_version};
      if (absl::Status s = Pull(one, deadline, &(*out)[i]); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // Several tensors in place, in `target.tensors`' order, each view with its lease.
  virtual absl::Status PullInPlaceMany(const PullManyTarget& target, Deadline deadline,
                                       std::chrono::milliseconds lease,
                                       std::vector<PulledView>* out) {
    return absl::FailedPreconditionError("transport " + name() +
                                         " cannot read in place; use PullMany (a copy)");
  }
  // Ends several leases at once (this default: one by one).
  virtual absl::Status ReleaseMany(std::span<const uint64_t> leases, Deadline deadline) {
    for (uint64_t lease : leases) {
      if (absl::Status s = Release(lease, deadline); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
};

// What a transport needs to start and to judge whether it can work with a daemon.
struct TransportContext {
  std::shared_ptr<grpc::Channel> channel;
  int64_t max_chunk_bytes = 4 << 20;  // from RegisterResponse
  // The job and rank the transport serves (a client registers one rank of one job).
  std::string job;
  int32_t rank = 0;
  // ClientOptions::cuda_stream: the stream the trainer writes its gradients on.
  uintptr_t cuda_stream = 0;
  // ClientOptions::cuda_device: the trainer's GPU, whose memory a host-memory transport (shm)
  // moves by DMA; -1: none.
  int cuda_device = -1;
  // ClientOptions::lend_gradients: cuda_ipc lends gradients on the daemon's GPU instead of copying.
  bool lend_gradients = false;
};

struct TransportEntry {
  const char* name;
  // The trainer's end. Empty when viable, else the reason it is not.
  std::function<std::string(const TransportContext&)> why_not_viable;
  std::function<absl::StatusOr<std::unique_ptr<Transport>>(const TransportContext&)> make;
  // The daemon's end (one per daemon; it says itself whether this daemon offers it).
  std::function<std::unique_ptr<DaemonEnd>(TransportHost&)> daemon_end;
};

// Every compiled-in transport, in DESIGN.md §6's preference order.
const std::vector<TransportEntry>& Transports();

// The transport `name` ("auto" = the first viable one). `reason` says why it was chosen.
absl::StatusOr<std::unique_ptr<Transport>> ChooseTransport(const std::string& name,
                                                           const TransportContext& context,
                                                           std::string* reason);

}  // namespace paramd
