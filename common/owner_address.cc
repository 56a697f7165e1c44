#include "common/owner_address.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace paramd {

bool IsUnixAddress(std::string_view address) { return address.starts_with(kUnixPrefix); }

std::string UnixSocketPath(std::string_view address) {
  std::string_view path = address.substr(std::string_view(kUnixPrefix).size());
  if (path.starts_with("//")) path.remove_prefix(2);  // unix:///abs
  return std::string(path);
}

namespace {

// "cpu", "cpu:N", "cuda:N": what follows a daemon's address in one of its backends' addresses.
bool IsBackendName(std::string_view name) {
  const size_t colon = name.find(':');
  const std::string_view kind = name.substr(0, colon);
  if (kind != "cpu" && kind != "cuda") return false;
  if (colon == std::string_view::npos) return kind == "cpu";
  const std::string_view index = name.substr(colon + 1);
  return !index.empty() &&
         std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

OwnerAddress SplitOwnerAddress(std::string_view address) {
  if (IsUnixAddress(address)) {
    const size_t slash = address.rfind('/');
    if (slash != std::string_view::npos && IsBackendName(address.substr(slash + 1))) {
      return {std::string(address.substr(0, slash)), std::string(address.substr(slash + 1))};
    }
    return {std::string(address), ""};
  }
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
