#include "server/rpc_outcome.h"

#include "absl/strings/str_cat.h"
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

absl::Status NotParsed(const std::string& type) {
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", type,
                   " message (garbage or truncated bytes, or a string field that is not UTF-8); "
                   "send it with a client built from paramd.v1's protos"));
}

}  // namespace paramd
