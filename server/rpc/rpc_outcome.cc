#include "server/rpc/rpc_outcome.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/owner_address.h"
#include "common/quoted.h"

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

absl::Status CheckRoute(grpc::CallbackServerContext* context, const Daemon& daemon) {
  const grpc::string_ref authority = context->ExperimentalGetAuthority();
  const absl::string_view route(authority.data(), authority.size());
  // A call to a daemon of one backend, or without a backend's authority, is its own (no copy).
  if (!absl::EndsWith(route, kBackendAuthoritySuffix) ||
      route == BackendAuthority(daemon.backend_name())) {
    return absl::OkStatus();
  }
  // The server routes a backend's authority to that backend: this one reached the daemon's first
  // backend only because no backend of the daemon has it.
  return absl::NotFoundError(absl::StrCat(
      "this daemon has no backend that :authority ", Quoted(std::string(route)),
      " names (the client's owner address names a backend the daemon does not hold); its "
      "backends are at ",
      absl::StrJoin(daemon.backend_addresses(), ", ")));
}

absl::Status NotParsed(const std::string& type) {
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", type,
                   " message (garbage or truncated bytes, or a string field that is not UTF-8); "
                   "send it with a client built from paramd.v1's protos"));
}

}  // namespace paramd
