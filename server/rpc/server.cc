#include "server/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/owner_address.h"
#include "common/status_macros.h"
#include "common/token_file.h"
#include "server/backend/backends.h"
#include "server/checkpoints.h"
#include "server/memory_budget.h"
#include "server/rpc/control_service.h"
#include "server/rpc/data_service.h"
#include "server/rpc/peer_service.h"

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

// A Unix socket path for this daemon: UNAVAILABLE where a daemon answers there already (gRPC
// would unlink its socket and take the path over); a socket nobody answers on (a daemon that was
// killed) is removed. FAILED_PRECONDITION where the path is something else.
absl::Status ClaimUnixSocket(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on unix:", path, ": the path exists and is not a socket"));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  const bool answered =
      connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  if (answered) {
    return absl::UnavailableError(absl::StrCat("cannot listen on unix:", path,
                                               ": a process listens there already (address "
                                               "in use)"));
  }
  unlink(path.c_str());
  return absl::OkStatus();
}

}  // namespace

Server::Services::Services(Daemon* daemon, const AccessControl* access)
    : control(std::make_unique<ControlService>(daemon, access)),
      data(std::make_unique<DataService>(daemon, access)),
      peer(std::make_unique<PeerService>(daemon, access)) {}
Server::Services::Services(Services&&) noexcept = default;
Server::Services::~Services() = default;

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const v1::DaemonConfig& raw_config) {
  const v1::DaemonConfig config = WithDefaults(raw_config);
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  LogLevel level = LogLevel::kInfo;
  ParseLogLevel(config.log_level(), &level);
  SetLogLevel(level);

  PARAMD_ASSIGN_OR_RETURN(const std::vector<std::string> backends, DaemonBackends(config));
  // Several backends share the host budget: resolved once, each takes its share.
  int64_t host_budget = config.memory_budget_bytes();
  if (backends.size() > 1) {
    PARAMD_ASSIGN_OR_RETURN(host_budget, HostBudget(host_budget));
  }
  std::unique_ptr<Server> server(new Server());
  PARAMD_ASSIGN_OR_RETURN(server->access_, AccessControl::Load(config.token_file()));
  for (size_t i = 0; i < backends.size(); ++i) {
    absl::StatusOr<std::unique_ptr<Daemon>> daemon =
        Daemon::Create(BackendConfig(config, backends, i, host_budget));
    if (!daemon.ok()) return daemon.status();
    server->cores_.push_back(Core{*std::move(daemon), nullptr, std::nullopt});
  }
  // Each backend's address in jobs' daemon lists: the daemon's, with the backend's name where it
  // has several.
  auto advertise = [&](const std::string& advertised) {
    std::vector<std::string> addresses;
    for (const std::string& backend : backends) {
      addresses.push_back(backends.size() > 1 ? JoinOwnerAddress(advertised, backend) : advertised);
    }
    for (size_t i = 0; i < backends.size(); ++i) {
      server->cores_[i].daemon->set_advertised_address(addresses[i]);
      server->cores_[i].daemon->set_backend_addresses(addresses);
    }
  };
  // The name in jobs' daemon lists is known before the port opens, so that no Register, and no
  // restore of a job sharded over several daemons, finds it unset; with port 0 only the bind tells
  // the port (and no client knows the address before).
  // A Unix socket's name is its path, known before it is bound.
  const bool unix_socket = IsUnixAddress(config.listen());
  const int listen_port =
      unix_socket ? 0 : std::atoi(config.listen().substr(config.listen().rfind(':') + 1).c_str());
  if (unix_socket) {
    advertise(AdvertisedAddress(config, 0, ""));
    PARAMD_RETURN_IF_ERROR(ClaimUnixSocket(UnixSocketPath(config.listen())));
  } else if (listen_port != 0) {
    PARAMD_ASSIGN_OR_RETURN(const std::string advertised, Advertised(config, listen_port));
    advertise(advertised);
  }
  for (Core& core : server->cores_) {
    Daemon* daemon = core.daemon.get();
    // The jobs of checkpoint_dir come back before the port opens: a trainer that reconnects finds
    // its job at the version it holds.
    absl::StatusOr<int> restored = Checkpoints(daemon).RestoreAll();
    if (!restored.ok()) return restored.status();
    if (*restored > 0) {
      PARAMD_LOG(INFO) << *restored << " job(s) restored from "
                       << daemon->config().checkpoint_dir();
    }
    if (config.checkpoint_every_steps() > 0) {
      core.schedule = std::make_unique<CheckpointSchedule>(daemon);
      CheckpointSchedule* schedule = core.schedule.get();
      daemon->set_step_listener([schedule](const std::string& job, int64_t next_step) {
        schedule->StepRan(job, next_step);
      });
    }
    if (backends.size() > 1) core.routed.emplace(daemon, server->access_.get());
  }
  server->first_.emplace(server->cores_.front().daemon.get(), server->access_.get());

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
  for (size_t i = 0; i < server->cores_.size(); ++i) {
    Core& core = server->cores_[i];
    if (!core.routed.has_value()) continue;
    const std::string authority = BackendAuthority(backends[i]);
    builder.RegisterService(authority, core.routed->control.get());
    builder.RegisterService(authority, core.routed->data.get());
    builder.RegisterService(authority, core.routed->peer.get());
  }
  builder.RegisterService(server->first_->control.get());
  builder.RegisterService(server->first_->data.get());
  builder.RegisterService(server->first_->peer.get());
  server->grpc_ = builder.BuildAndStart();
  if (server->grpc_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", config.listen(), " (address in use, or not an address of this host)"));
  }
  if (unix_socket) {
    // Only the daemon's user may connect (connecting to a socket takes write permission on it),
    // and the members of listen_group where one is named.
    const std::string path = UnixSocketPath(config.listen());
    mode_t mode = 0600;
    if (!config.listen_group().empty()) {
      PARAMD_ASSIGN_OR_RETURN(const gid_t group, GroupId(config.listen_group()));
      if (chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
        return absl::PermissionDeniedError(absl::StrCat(
            "cannot give the socket ", path, " to group ", config.listen_group(), ": ",
            std::strerror(errno), " (the daemon's user must be a member of that group)"));
      }
      mode = 0660;
    }
    if (chmod(path.c_str(), mode) != 0) {
      return absl::InternalError(absl::StrCat("chmod ", mode == 0600 ? "0600 " : "0660 ", path,
                                              ": ", std::strerror(errno)));
    }
    server->address_ = config.listen();
  } else {
    const std::string host = config.listen().substr(0, config.listen().rfind(':'));
    server->address_ = absl::StrCat(host, ":", server->port_);
  }
  if (!unix_socket && listen_port == 0) {
    PARAMD_ASSIGN_OR_RETURN(const std::string advertised, Advertised(config, server->port_));
    advertise(advertised);
  }
  grpc::HealthCheckServiceInterface* health = server->grpc_->GetHealthCheckService();
  health->SetServingStatus(true);
  // A drain (Control.Drain to any backend, or a signal) drains the whole daemon.
  for (Core& core : server->cores_) {
    core.daemon->set_drain_listener([health, cores = &server->cores_] {
      health->SetServingStatus(false);
      for (Core& other : *cores) other.daemon->Drain();
    });
  }

  Daemon& first = *server->cores_.front().daemon;
  if (!config.metrics_listen().empty()) {
    std::vector<std::pair<std::string, Metrics*>> labeled;
    if (backends.size() > 1) {
      for (size_t i = 0; i < backends.size(); ++i) {
        labeled.emplace_back(backends[i], &server->cores_[i].daemon->metrics());
      }
    }
    std::string basic_auth;
    if (!config.metrics_auth_file().empty()) {
      PARAMD_ASSIGN_OR_RETURN(basic_auth, ReadClientToken(config.metrics_auth_file()));
      if (basic_auth.find(':') == std::string::npos || basic_auth.front() == ':') {
        return absl::InvalidArgumentError(absl::StrCat(
            "metrics_auth_file ", config.metrics_auth_file(), " holds no USER:PASSWORD"));
      }
    }
    absl::StatusOr<std::string> metrics =
        first.metrics().Serve(config.metrics_listen(), labeled, basic_auth);
    if (!metrics.ok()) return metrics.status();
    server->metrics_address_ = *metrics;
  }
  PARAMD_LOG(INFO) << "paramd serving on " << server->address_ << " (advertised as "
                   << absl::StrJoin(first.backend_addresses(), ", ") << ", backend"
                   << (backends.size() > 1 ? "s " : " ") << absl::StrJoin(backends, ", ")
                   << ", metrics "
                   << (server->metrics_address_.empty()
                           ? std::string("off")
                           : "http://" + server->metrics_address_ + "/metrics")
                   << ")";
  return server;
}

Server::~Server() { Shutdown(); }

void Server::Shutdown() {
  // A server whose Start failed half-way has nothing running to stop.
  if (stopped_ || cores_.empty() || grpc_ == nullptr) return;
  stopped_ = true;
  for (Core& core : cores_) core.daemon->Drain();
  for (Core& core : cores_) {
    core.daemon->WaitForSteps();
    // No step runs now: the schedule hears of none, and finishes the checkpoint it is writing.
    core.daemon->set_step_listener(nullptr);
    core.schedule.reset();
    // No step runs from here on: a pull still waiting would wait for nothing, and gRPC's shutdown
    // would cancel it without a word. It ends UNAVAILABLE, saying the daemon drains.
    core.daemon->EndWaitingPulls();
  }
  // Open streams get a few seconds to finish (pulls of the last version), then are cancelled.
  grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (IsUnixAddress(address_)) unlink(UnixSocketPath(address_).c_str());  // no stale socket left
  PARAMD_LOG(INFO) << "paramd stopped";
}

void Server::Wait() { grpc_->Wait(); }

}  // namespace paramd
