// `inline`: bytes inside gRPC messages, in bounded chunks. Works wherever gRPC does. The daemon
// answers its Push and Pull in the Data service itself, which serves every transport's messages.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "paramd/v1/data.grpc.pb.h"
#include "transport/transport.h"

namespace paramd {

std::unique_ptr<Transport> MakeInlineTransport(const TransportContext& context);
// The daemon's end: always offered; Attach only records a rank's choice.
std::unique_ptr<DaemonEnd> MakeInlineDaemonEnd(TransportHost& host);

// The Pull request for a target (stream delivery).
v1::PullRequest PullRequestOf(const PullTarget& target);
// Runs one Pull call: the header, then (unless the header carries a shared-memory place) the
// streamed bytes into `out->data`.
absl::Status PullStream(v1::Data::Stub& stub, const v1::PullRequest& request, Deadline deadline,
                        Pulled* out);
// Runs one Pull call of one or several tensors (PullRequest.tensors): `each` gets every tensor's
// header with its streamed bytes (none where the header has a place) as it arrives; an error it
// returns cancels the call and is returned. With `reuse`, the first streamed tensor's bytes land
// in that buffer's memory (a buffer a previous pull faulted in: a fresh 64 MiB one costs its
// page faults, which once cut pulls to a third of their speed).
absl::Status PullStreamEach(v1::Data::Stub& stub, const v1::PullRequest& request, Deadline deadline,
                            const std::function<absl::Status(Pulled&&)>& each,
                            std::vector<std::byte>* reuse = nullptr);

}  // namespace paramd
