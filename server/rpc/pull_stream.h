// The Data service's Pull, in three parts: what the request asks and each tensor's header are
// built in server/rpc/pull_header.h; the waiting for versions not published yet is kept in
// server/rpc/pull_queue.h; the call's life (server/rpc/write_stream.h) and the streaming of
// headers and data chunks are the reactor's (pull_stream.cc).
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include "absl/status/statusor.h"
#include "server/daemon.h"
#include "server/rpc/access.h"

namespace paramd {

// The reactor of one Pull call: it waits for the versions (without holding a thread), then
// streams, tensor by tensor in the order they are published, a header and the bytes of the served
// version it leases (the lease keeps those bytes alive and unchanged while they are written), or
// only the header of a place, several headers to a message where the puller takes batches.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartPull(Daemon* daemon,
                                                      const absl::StatusOr<Caller>& caller,
                                                      const grpc::ByteBuffer* request);

}  // namespace paramd
