// How the services end a call: a failed one is counted (paramd_rpc_errors_total{method, code})
// and logged at debug level; a unary one is finished with the status as gRPC codes it.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include "absl/status/status.h"
#include "server/daemon.h"

namespace paramd {

void CountRpcError(Daemon* daemon, const char* method, const absl::Status& status);

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, Daemon* daemon,
                                      const char* method, const absl::Status& status);

}  // namespace paramd
