// `shm`: same node, cpu backend (DESIGN.md §6). The daemon keeps gradient slots and served bytes in
// POSIX shared memory it owns (mode 0600); the trainer maps each segment once. A push copies a
// gradient into its slot and marks it with a data-less Push chunk; a pull copies out of the
// leased served bytes, or reads them in place until it releases the lease. Initial weights, and
// any buffer the daemon could not place in shared memory, travel inline.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace paramd {

// Empty when the daemon shares memory with this process for the context's job, else why not.
std::string ShmWhyNotViable(const TransportContext& context);
absl::StatusOr<std::unique_ptr<Transport>> MakeShmTransport(const TransportContext& context);
// The daemon's end: the arena of segments jobs' host buffers come from.
std::unique_ptr<DaemonEnd> MakeShmDaemonEnd(TransportHost& host);

}  // namespace paramd
