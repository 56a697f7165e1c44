#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/checkpoints.h"
#include "server/control_service.h"
#include "server/data_service.h"
#include "server/peer_service.h"

namespace paramd {
namespace {

// DaemonConfig.advertise_address, its default resolved for a daemon bound at `port`.
absl::StatusOr<std::string> Advertised(const v1::DaemonConfig& config, int port) {
  char hostname[256] = {};  // Linux's names are at most 64 bytes
  if (config.advertise_address().empty() && gethostname(hostname, sizeof(hostname) - 1) != 0) {
    return absl::InternalError(absl::StrCat("gethostname: ", std::strerror(errno),
                                            "; set advertise_address (--advertise_address)"));
  }
  return AdvertisedAddress(config, port, hostname);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const v1::DaemonConfig& raw_config) {
  const v1::DaemonConfig config = WithDefaults(raw_config);
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  LogLevel level = LogLevel::kInfo;
  ParseLogLevel(config.log_level(), &level);
  SetLogLevel(level);

  std::unique_ptr<Server> server(new Server());
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Create(config);
  if (!daemon.ok()) return daemon.status();
  server->daemon_ = *std::move(daemon);
  // The name in jobs' daemon lists is known before the port opens, so that no Register, and no
  // restore of a job sharded over several daemons, finds it unset; with port 0 only the bind tells
  // the port (and no client knows the address before).
  const int listen_port = std::atoi(config.listen().substr(config.listen().rfind(':') + 1).c_str());
  if (listen_port != 0) {
    PARAMD_ASSIGN_OR_RETURN(const std::string advertised, Advertised(config, listen_port));
    server->daemon_->set_advertised_address(advertised);
  }
  // The jobs of checkpoint_dir come back before the port opens: a trainer that reconnects finds
  // its job at the version it holds.
  absl::StatusOr<int> restored = Checkpoints(server->daemon_.get()).RestoreAll();
  if (!restored.ok()) return restored.status();
  if (*restored > 0) {
    PARAMD_LOG(INFO) << *restored << " job(s) restored from " << config.checkpoint_dir();
  }
  if (config.checkpoint_every_steps() > 0) {
    server->schedule_ = std::make_unique<CheckpointSchedule>(server->daemon_.get());
    CheckpointSchedule* schedule = server->schedule_.get();
    server->daemon_->set_step_listener([schedule](const std::string& job, int64_t next_step) {
      schedule->StepRan(job, next_step);
    });
  }
  server->control_ = std::make_unique<ControlService>(server->daemon_.get());
  server->data_ = std::make_unique<DataService>(server->daemon_.get());
  server->peer_ = std::make_unique<PeerService>(server->daemon_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.listen(), grpc::InsecureServerCredentials(), &server->port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes()));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes()));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, config.max_streams_per_connection());
  // gRPC sets SO_REUSEPORT by default: a second daemon of the same user would then bind a port
  // another serves, and the kernel would split the trainers' connections between the two. A port
  // in use is refused instead, as a launcher that picks ports expects.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(server->control_.get());
  builder.RegisterService(server->data_.get());
  builder.RegisterService(server->peer_.get());
  server->grpc_ = builder.BuildAndStart();
  if (server->grpc_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", config.listen(), " (address in use, or not an address of this host)"));
  }
  const std::string host = config.listen().substr(0, config.listen().rfind(':'));
  server->address_ = absl::StrCat(host, ":", server->port_);
  if (listen_port == 0) {
    PARAMD_ASSIGN_OR_RETURN(const std::string advertised, Advertised(config, server->port_));
    server->daemon_->set_advertised_address(advertised);
  }
  grpc::HealthCheckServiceInterface* health = server->grpc_->GetHealthCheckService();
  health->SetServingStatus(true);
  server->daemon_->set_drain_listener([health] { health->SetServingStatus(false); });

  if (!config.metrics_listen().empty()) {
    absl::StatusOr<std::string> metrics = server->daemon_->metrics().Serve(config.metrics_listen());
    if (!metrics.ok()) return metrics.status();
    server->metrics_address_ = *metrics;
  }
  PARAMD_LOG(INFO) << "paramd serving on " << server->address_ << " (advertised as "
                   << server->daemon_->advertised_address() << ", backend "
                   << server->daemon_->backend_name() << ", metrics "
                   << (server->metrics_address_.empty()
                           ? std::string("off")
                           : "http://" + server->metrics_address_ + "/metrics")
                   << ")";
  return server;
}

Server::~Server() { Shutdown(); }

void Server::Shutdown() {
  // A server whose Start failed half-way has nothing running to stop.
  if (stopped_ || daemon_ == nullptr || grpc_ == nullptr) return;
  stopped_ = true;
  daemon_->Drain();
  daemon_->WaitForSteps();
  // No step runs now: the schedule hears of none, and finishes the checkpoint it is writing.
  daemon_->set_step_listener(nullptr);
  schedule_.reset();
  // No step runs from here on: a pull still waiting would wait for nothing, and gRPC's shutdown
  // would cancel it without a word. It ends UNAVAILABLE, saying the daemon drains.
  daemon_->EndWaitingPulls();
  // Open streams get a few seconds to finish (pulls of the last version), then are cancelled.
  grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  PARAMD_LOG(INFO) << "paramd stopped";
}

void Server::Wait() { grpc_->Wait(); }

}  // namespace paramd
