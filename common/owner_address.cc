#include "common/owner_address.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace paramd {

OwnerAddress SplitOwnerAddress(std::string_view address) {
  const size_t slash = address.find('/');
  if (slash == std::string_view::npos) return {std::string(address), ""};
  return {std::string(address.substr(0, slash)), std::string(address.substr(slash + 1))};
}

std::string JoinOwnerAddress(std::string_view daemon, std::string_view backend) {
  if (backend.empty()) return std::string(daemon);
  return absl::StrCat(absl::string_view(daemon.data(), daemon.size()), "/",
                      absl::string_view(backend.data(), backend.size()));
}

std::string BackendAuthority(std::string_view backend) {
  std::string host(backend);
  std::replace(host.begin(), host.end(), ':', '-');
  return absl::StrCat(host, kBackendAuthoritySuffix);
}

std::shared_ptr<grpc::Channel> OwnerChannel(const std::string& address,
                                            grpc::ChannelArguments args) {
  const OwnerAddress owner = SplitOwnerAddress(address);
  if (!owner.backend.empty()) {
    args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, BackendAuthority(owner.backend));
  }
  return grpc::CreateCustomChannel(owner.daemon, grpc::InsecureChannelCredentials(), args);
}

}  // namespace paramd
