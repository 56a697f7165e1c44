#include "server/rpc_outcome.h"

#include "common/grpc_status.h"
#include "common/logging.h"

namespace paramd {

void CountRpcError(Daemon* daemon, const char* method, const absl::Status& status) {
  if (status.ok()) return;
  daemon->metrics().RpcError(method, static_cast<int>(status.code()));
  PARAMD_LOG(DEBUG) << method << " failed: " << status;
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, Daemon* daemon,
                                      const char* method, const absl::Status& status) {
  CountRpcError(daemon, method, status);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace paramd
