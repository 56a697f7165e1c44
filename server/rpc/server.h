// The daemon as a gRPC server: Control, Data, Peer, health and reflection on one port, metrics on
// another. A daemon of several backends (DaemonConfig.backend lists them) holds one Daemon per
// backend, each with its own services, routed by the call's :authority (common/owner_address.h);
// a call without one reaches the first. Start() returns a running server; Shutdown() drains it
// gracefully.
#pragma once

#include <grpcpp/server.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "paramd/v1/config.pb.h"
#include "server/daemon.h"
#include "server/rpc/access.h"

namespace paramd {

class CheckpointSchedule;
class ControlService;
class DataService;
class PeerService;

class Server {
 public:
  // `config` is validated here (after defaults are applied).
  static absl::StatusOr<std::unique_ptr<Server>> Start(const v1::DaemonConfig& config);
  ~Server();

  // The bound gRPC address ("127.0.0.1:43121"), port 0 resolved.
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // The bound metrics address, or "" when metrics are off.
  const std::string& metrics_address() const { return metrics_address_; }
  // The first backend's daemon (the only one unless the config lists several).
  Daemon& daemon() { return *cores_.front().daemon; }
  // Backend `index`'s daemon, in the config's order.
  Daemon& daemon(size_t index) { return *cores_.at(index).daemon; }
  size_t backends() const { return cores_.size(); }

  // New calls get UNAVAILABLE, running and queued steps complete, open calls end, the port closes.
  void Shutdown();
  // Blocks until Shutdown has stopped the server.
  void Wait();
  // Reads the token file again (SIGHUP); the tokens stay as they were where it is not read.
  absl::Status ReloadTokens() { return access_->Reload(); }

 private:
  Server() = default;

  // A daemon's gRPC services.
  struct Services {
    Services(Daemon* daemon, const AccessControl* access);
    Services(Services&&) noexcept;
    ~Services();
    std::unique_ptr<ControlService> control;
    std::unique_ptr<DataService> data;
    std::unique_ptr<PeerService> peer;
  };
  // One backend: its daemon, and its services under its authority (a daemon of several).
  struct Core {
    std::unique_ptr<Daemon> daemon;
    std::unique_ptr<CheckpointSchedule> schedule;  // with checkpoint_every_steps
    std::optional<Services> routed;
  };
  std::unique_ptr<AccessControl> access_;  // the token file's tokens (none: every call allowed)
  std::vector<Core> cores_;
  std::optional<Services> first_;  // the first backend's, for calls without a backend's authority
  std::unique_ptr<grpc::Server> grpc_;
  std::string address_;
  std::string metrics_address_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace paramd
