#include "common/owner_address.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include <algorithm>
#include <memory>
#include <vector>

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

namespace {

// Adds the bearer token to every call's initial metadata. (gRPC sends no call credentials over an
// insecure channel, so the token travels as plain metadata: a Unix socket or a network the
// deployment trusts carries it.)
class BearerToken final : public grpc::experimental::Interceptor {
 public:
  explicit BearerToken(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const header_;
};

class BearerTokens final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokens(const std::string& token) : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerToken(&header_);
  }

 private:
  const std::string header_;
};

}  // namespace

std::shared_ptr<grpc::Channel> OwnerChannel(const std::string& address, grpc::ChannelArguments args,
                                            const std::string& token) {
  const OwnerAddress owner = SplitOwnerAddress(address);
  if (!owner.backend.empty()) {
    args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, BackendAuthority(owner.backend));
  }
  if (token.empty()) {
    return grpc::CreateCustomChannel(owner.daemon, grpc::InsecureChannelCredentials(), args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerTokens>(token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      owner.daemon, grpc::InsecureChannelCredentials(), args, std::move(interceptors));
}

}  // namespace paramd
