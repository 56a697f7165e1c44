// The address of an owner of a job's shards (DESIGN.md §7): a backend of a daemon. A daemon of one
// backend is named by its address alone, "host:port". A daemon of several backends (one per GPU of
// its node, say) serves each on the same port, and each is named "host:port/BACKEND"
// ("node1:50051/cuda:1"). A call to such an owner goes to host:port with the backend in the call's
// :authority ("cuda-1.backend.paramd"), which the daemon's server routes to that backend's
// services; a call without it reaches the daemon's first backend.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>
#include <string_view>

namespace paramd {

struct OwnerAddress {
  std::string daemon;   // "host:port"
  std::string backend;  // "" where the address names the daemon alone
};

// A daemon listening on a Unix socket is named "unix:PATH" (gRPC's form), its backends
// "unix:PATH/BACKEND".
inline constexpr char kUnixPrefix[] = "unix:";
bool IsUnixAddress(std::string_view address);
// The socket's path of a "unix:PATH" address ("unix:///abs" and "unix:/abs" name /abs).
std::string UnixSocketPath(std::string_view address);

// Splits "host:port/BACKEND" at its '/' (a Unix socket's address at its last '/' where a
// backend's name, "cpu" or "cpu:N" or "cuda:N", follows); an address without one is the daemon
// alone.
OwnerAddress SplitOwnerAddress(std::string_view address);
// "host:port/BACKEND", or `daemon` alone where `backend` is empty.
std::string JoinOwnerAddress(std::string_view daemon, std::string_view backend);
// The :authority that routes a call to `backend` of a daemon ("cuda:1" -> "cuda-1.backend.paramd").
std::string BackendAuthority(std::string_view backend);
// What every such authority ends with.
inline constexpr char kBackendAuthoritySuffix[] = ".backend.paramd";
// A channel to `address`'s daemon whose calls reach its backend (insecure credentials).
// With `token`, every call of the channel carries it (`authorization: Bearer TOKEN`,
// common/token_file.h).
std::shared_ptr<grpc::Channel> OwnerChannel(const std::string& address,
                                            grpc::ChannelArguments args = {},
                                            const std::string& token = "");

}  // namespace paramd
