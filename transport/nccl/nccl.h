// `nccl`: a trainer and a daemon's cuda:N backend on different GPUs of one node (DESIGN.md §6),
// where the trainer's GPU has no peer access to the daemon's (with it, cuda_ipc reads and writes
// the daemon's memory directly and comes first in the table). NCCL takes no two ranks on one GPU:
// a trainer on the daemon's own GPU is refused here and uses cuda_ipc. (A test may run both on one
// GPU by giving each process its own NCCL_HOSTID, which makes NCCL treat them as two hosts that
// talk over sockets: the trainer then allows the same GPU.)
//
// The daemon's places are cuda_ipc's (slots and served bytes in its exported GPU memory, with the
// same leases, marks and restarts: a placed transport, transport/placed.h), but the trainer maps
// none of them (its regions are RemoteRegions, addresses it never dereferences): its mover sends
// and receives over a 2-rank NCCL communicator, a session, which the daemon opens at Attach
// (AttachRequest.nccl_open: the daemon joins as rank 0, the trainer as rank 1).
//
// Push first makes its stream wait for the work queued on the trainer's stream (as cuda_ipc does),
// queues one send per gradient (GPU memory on the trainer's device is sent where it lies; anything
// else is staged on the device first), and asks the daemon to receive them into the step's slot
// places (AttachRequest.nccl_transfer, to_daemon); once the daemon answered, every byte is in its
// slots, and the gradients are marked as cuda_ipc's are. Pull and PullMany lease the served places,
// queue one receive per tensor into a device buffer of the transport's, ask the daemon to send them
// (after its step ran on its GPU), and copy them out to the caller's host buffers. PullInPlace is
// refused: no view of the daemon's memory exists in the trainer's process.
//
// Every call of a session is made one at a time, so both sides queue in the same order. A failed
// or timed-out transfer aborts the communicator on both sides; the next call opens a new session
// (a daemon that restarted knows no session: NOT_FOUND, and a new one is opened at once). Initial
// weights travel inline.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace paramd {

// Empty when this process can reach the daemon over nccl, else why not (built without NCCL, no GPU
// visible, the daemon's backend is not cuda:N, the trainer's GPU is the daemon's).
std::string NcclWhyNotViable(const TransportContext& context);
// The transport, with its session open (the daemon and this process joined its communicator).
absl::StatusOr<std::unique_ptr<Transport>> MakeNcclTransport(const TransportContext& context);
// The daemon's end: offered on a cuda:N backend of a daemon built with NCCL.
std::unique_ptr<DaemonEnd> MakeNcclDaemonEnd(TransportHost& host);

}  // namespace paramd
