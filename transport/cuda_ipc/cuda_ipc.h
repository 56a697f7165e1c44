// `cuda_ipc`: same node, cuda:N backend (DESIGN.md §6). The daemon keeps gradient slots and each
// version's served bytes in a few large GPU allocations whose IPC handles it hands out in Attach;
// the trainer opens each handle once (on its current device, with peer access where the daemon's
// GPU is another one) and copies on a stream of its own.
//
// Push first makes its stream wait for the work queued so far on the trainer's stream
// (TransportContext::cuda_stream; the legacy default stream unless named), so a gradient still
// being written by backward is copied once written. It restores the caller's current device.
// Push copies each gradient (host or device memory: the copy reads either) into its slot, waits
// on the host for the copies, then marks every gradient written in one message (PushChunk.marks).
// Waiting on the host is the ordering: Push must not return before the caller's buffer has been
// read anyway, and once a copy has completed its bytes are in the daemon's GPU memory for any later
// work there (the step starts only after the commit that follows the marks), so no IPC event is
// needed. With lent gradients (ClientOptions::lend_gradients) nothing is copied: the marks name
// the trainer's memory and an event recorded on its stream, and are sent at once. After a push,
// the places of the next step are asked for in the background, so the next push copies at once.
//
// Pull copies the leased served bytes into host memory (Pulled::data). PullInPlace returns a view
// of the served bytes in the daemon's GPU memory: PulledView::data then holds a DEVICE pointer (of
// the trainer's CUDA context), valid and unchanged until the lease is released or expires; read it
// with kernels or copies on the trainer's streams and call Release only after that work finished.
// The lifecycle (slot places, restarts, leases) is every placed transport's (transport/placed.h).
// Initial weights, and any buffer the daemon could not place in GPU memory, travel inline.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace paramd {

// Empty when this process can map the daemon's GPU memory, else why not ("built without CUDA", "no
// GPU visible", the daemon's backend is not cuda:N, the daemon's GPU is not visible here).
std::string CudaIpcWhyNotViable(const TransportContext& context);
absl::StatusOr<std::unique_ptr<Transport>> MakeCudaIpcTransport(const TransportContext& context);
// The daemon's end (no CUDA needed: the backend owns the exported memory).
std::unique_ptr<DaemonEnd> MakeCudaIpcDaemonEnd(TransportHost& host);

}  // namespace paramd
