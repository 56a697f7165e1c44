// The daemon as a gRPC server: Control, Data, health and reflection on one port, metrics on
// another. Start() returns a running server; Shutdown() drains it gracefully.
#pragma once

#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "paramd/v1/config.pb.h"
#include "server/daemon.h"

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
  Daemon& daemon() { return *daemon_; }

  // New calls get UNAVAILABLE, running and queued steps complete, open calls end, the port closes.
  void Shutdown();
  // Blocks until Shutdown has stopped the server.
  void Wait();

 private:
  Server() = default;

  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<CheckpointSchedule> schedule_;  // with checkpoint_every_steps
  std::unique_ptr<ControlService> control_;
  std::unique_ptr<DataService> data_;
  std::unique_ptr<PeerService> peer_;
  std::unique_ptr<grpc::Server> grpc_;
  std::string address_;
  std::string metrics_address_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace paramd
