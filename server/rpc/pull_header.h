// What a Pull asks for, checked (PullAsk), and one tensor's answer: its served version's header,
// where its bytes are read, and the lease of a placed one. The Data service's Pull reactor
// (server/rpc/pull_stream.h) waits for versions and streams; these build what it sends.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/host_buffer.h"
#include "paramd/v1/data.pb.h"
#include "server/daemon.h"

namespace paramd {

// A Pull request, checked against the daemon and its job.
struct PullAsk {
  std::shared_ptr<Job> job;
  std::vector<int> tensors;  // job tensor indices, as named, none twice
  FormatKey format;
  int64_t min_version = 0;
  bool place = false;  // PULL_DELIVERY_PLACE
  bool batch = false;  // several headers in one message (batch_headers, places only)
  int64_t lease_ms = 0;
  std::string transport;  // PullRequest.transport: the label its placed bytes are counted under
};

// INVALID_ARGUMENT naming the field for a request that asks for nothing a pull can give; the job's
// own refusals (NOT_FOUND, FAILED_PRECONDITION); UNAVAILABLE while the daemon drains. The leases
// the request releases end here, whatever else it asks.
absl::StatusOr<PullAsk> CheckPull(Daemon& daemon, const v1::PullRequest& request);

// One tensor's answer to a pull.
struct PulledTensor {
  std::shared_ptr<const ServedTensor> served;  // the lease on its version
  const HostBuffer* bytes = nullptr;           // its bytes in the asked format
  std::optional<uint64_t> lease;               // a placed answer's lease (no data chunks follow)
  bool placed() const { return lease.has_value(); }
};

// Fills `header` for `tensor`'s served version of at least ask.min_version (published: the
// caller waited for it), taking its lease where it is placed. ABORTED where an imported state of
// an earlier version replaced it; the job's or the daemon's refusal where it failed or drains.
absl::StatusOr<PulledTensor> MakePullHeader(Daemon& daemon, const PullAsk& ask, int tensor,
                                            v1::PullHeader* header);

}  // namespace paramd
