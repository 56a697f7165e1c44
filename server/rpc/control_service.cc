#include "server/rpc/control_service.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/owner_address.h"
#include "common/quoted.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "server/registration.h"
#include "server/rpc/read_stream.h"
#include "server/rpc/rpc_outcome.h"
#include "server/rpc/write_stream.h"
#include "server/state/state_transfer.h"

namespace paramd {
namespace {

// Streams a job's state chunk by chunk (server/state/state_transfer.h). The export starts once the
// steps committed before it ran, without holding a thread meanwhile, and holds the job's later
// steps back until the call ends (Drop releases it before the call finishes). A cancellation is
// noticed where a write completes (server/rpc/write_stream.h), never while the export starts.
class ExportReactor final : public WriteStream<v1::ExportStateRequest> {
 public:
  ExportReactor(Daemon* daemon, const absl::StatusOr<Caller>& caller, const grpc::ByteBuffer* raw)
      : WriteStream(daemon, "ExportState", "the export's reader went away",
                    "the export was cancelled") {
    Begin(caller, raw);
  }

 private:
  absl::Status Start(const v1::ExportStateRequest& request) override {
    const int64_t limit = daemon()->config().max_chunk_bytes();
    if (request.max_chunk_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_chunk_bytes = ", request.max_chunk_bytes(), " must be >= 0"));
    }
    const int64_t chunk =
        request.max_chunk_bytes() == 0 ? limit : std::min(limit, request.max_chunk_bytes());
    PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, daemon()->registry().Find(request.job()));
    // A step held back while the export streamed goes back to the step executor at its end.
    auto held_back = [daemon = daemon(), job](const StepWork& held) {
      daemon->StartStep(job, held);
    };
    StateExport::Begin(ExportOf(job, held_back), chunk,
                       [this](absl::StatusOr<std::unique_ptr<StateExport>> started) {
                         if (!started.ok()) {
                           End(started.status());
                           return;
                         }
                         export_ = *std::move(started);
                         Written();
                       });
    return absl::OkStatus();
  }

  // The next chunk, or the end of the export.
  void Written() override {
    absl::StatusOr<bool> more = export_->Next(&chunk_);
    if (!more.ok()) {
      End(more.status());
    } else if (!*more) {
      End(absl::OkStatus());
    } else {
      SerializeMessage(chunk_, &buffer_);
      StartWrite(&buffer_);
    }
  }

  void Drop(const absl::Status&) override { export_.reset(); }

  std::unique_ptr<StateExport> export_;
  v1::StateChunk chunk_;
  grpc::ByteBuffer buffer_;  // chunk_, serialized
};

// Stages an import stream (the job named by its header) and applies it once it ended whole.
class ImportReactor final : public ReadStream<v1::StateChunk> {
 public:
  ImportReactor(Daemon* daemon, absl::StatusOr<Caller> caller, grpc::ByteBuffer* response)
      : ReadStream(daemon, "ImportState", response) {
    Begin(std::move(caller));
  }

 private:
  absl::Status Take(v1::StateChunk& chunk) override {
    if (import_ == nullptr) {
      PARAMD_RETURN_IF_ERROR(daemon()->CheckServing());
      if (!chunk.has_header()) {
        return absl::InvalidArgumentError(
            "the first chunk of a state stream must carry the StateHeader");
      }
      PARAMD_RETURN_IF_ERROR(caller().MayUseJob(chunk.header().job()));
      PARAMD_ASSIGN_OR_RETURN(job_, daemon()->registry().Find(chunk.header().job()));
      import_ = std::make_unique<StateImport>(job_->spec(), daemon()->config().max_chunk_bytes());
    }
    return import_->Add(chunk);
  }

  absl::Status Finished() override {
    if (import_ == nullptr) {
      return absl::InvalidArgumentError(
          "the state stream is empty; it starts with a chunk carrying the StateHeader");
    }
    PARAMD_ASSIGN_OR_RETURN(StagedState staged, import_->Finish());
    import_.reset();
    PARAMD_ASSIGN_OR_RETURN(v1::ImportStateResponse response, job_->Import(std::move(staged)));
    PARAMD_LOG(INFO) << "job " << job_->name() << ": imported state at step "
                     << response.next_step() << " (" << response.fields() << " fields, "
                     << response.bytes() << " bytes)";
    SetResponse(response);
    return absl::OkStatus();
  }

  // The staged bytes go now, not when the call is done.
  void Drop() override {
    import_.reset();
    job_.reset();
  }

  std::shared_ptr<Job> job_;
  std::unique_ptr<StateImport> import_;
};

}  // namespace

grpc::ServerUnaryReactor* ControlService::Register(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  return ServeUnary<v1::RegisterRequest, v1::RegisterResponse>(
      context, daemon_, *access_, "Register", request, response,
      [](const Caller& caller, const auto& r) { return caller.MayUseJob(r.job()); },
      [this](const auto& r, auto* out) { return DoRegister(r, out); });
}

grpc::ServerUnaryReactor* ControlService::GetLayout(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return ServeUnary<v1::GetLayoutRequest, v1::GetLayoutResponse>(
      context, daemon_, *access_, "GetLayout", request, response,
      [](const Caller& caller, const auto& r) { return caller.MayUseJob(r.job()); },
      [this](const auto& r, auto* out) { return DoGetLayout(r, out); });
}

grpc::ServerUnaryReactor* ControlService::SetHyperparams(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return ServeUnary<v1::SetHyperparamsRequest, v1::SetHyperparamsResponse>(
      context, daemon_, *access_, "SetHyperparams", request, response,
      [](const Caller& caller, const auto& r) { return caller.MayUseJob(r.job()); },
      [this](const auto& r, auto* out) { return DoSetHyperparams(r, out); });
}

grpc::ServerUnaryReactor* ControlService::Status(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return ServeUnary<v1::StatusRequest, v1::StatusResponse>(
      context, daemon_, *access_, "Status", request, response,
      [](const Caller& caller, const v1::StatusRequest& r) {
        // The daemon's own figures are any caller's; its jobs are theirs who may read them.
        if (r.daemon_only()) return caller.MayProbe();
        return r.job().empty() ? caller.MayRunDaemon("list every job") : caller.MayReadJob(r.job());
      },
      [this](const auto& r, auto* out) { return DoStatus(r, out); });
}

grpc::ServerUnaryReactor* ControlService::Drain(grpc::CallbackServerContext* context,
                                                const grpc::ByteBuffer* request,
                                                grpc::ByteBuffer* response) {
  return ServeUnary<v1::DrainRequest, v1::DrainResponse>(
      context, daemon_, *access_, "Drain", request, response,
      [](const Caller& caller, const v1::DrainRequest&) {
        return caller.MayRunDaemon("drain the daemon");
      },
      [this](const v1::DrainRequest&, v1::DrainResponse* out) {
        daemon_->Drain();
        out->set_running_steps(daemon_->pending_steps());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ControlService::DeleteJob(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return ServeUnary<v1::DeleteJobRequest, v1::DeleteJobResponse>(
      context, daemon_, *access_, "DeleteJob", request, response,
      [](const Caller& caller, const auto& r) { return caller.MayUseJob(r.job()); },
      [this](const auto& r, auto* out) { return DoDeleteJob(r, out); });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ControlService::ExportState(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new ExportReactor(daemon_, access_->Identify(*context), request);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* ControlService::ImportState(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new ImportReactor(daemon_, access_->Identify(*context), response);
}

// A checkpoint or restore takes as long as its bytes take to move: it runs on the callback
// thread (the state's size bounds it, and other RPCs have threads of their own).
grpc::ServerUnaryReactor* ControlService::Checkpoint(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return ServeUnary<v1::CheckpointRequest, v1::CheckpointResponse>(
      context, daemon_, *access_, "Checkpoint", request, response,
      [](const Caller& caller, const v1::CheckpointRequest& r) {
        return r.job().empty() ? caller.MayRunDaemon("checkpoint every job")
                               : caller.MayUseJob(r.job());
      },
      [this](const v1::CheckpointRequest& r, v1::CheckpointResponse* out) -> absl::Status {
        PARAMD_RETURN_IF_ERROR(daemon_->CheckServing());
        PARAMD_ASSIGN_OR_RETURN(*out, checkpoints_.Write(r.job()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ControlService::Restore(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return ServeUnary<v1::RestoreRequest, v1::RestoreResponse>(
      context, daemon_, *access_, "Restore", request, response,
      [](const Caller& caller, const v1::RestoreRequest& r) {
        return r.job().empty() ? caller.MayRunDaemon("restore every job")
                               : caller.MayUseJob(r.job());
      },
      [this](const v1::RestoreRequest& r, v1::RestoreResponse* out) -> absl::Status {
        PARAMD_RETURN_IF_ERROR(daemon_->CheckServing());
        PARAMD_ASSIGN_OR_RETURN(*out, checkpoints_.Restore(r.job(), r.path()));
        return absl::OkStatus();
      });
}

absl::Status ControlService::DoRegister(const v1::RegisterRequest& request,
                                        v1::RegisterResponse* response) {
  PARAMD_RETURN_IF_ERROR(daemon_->CheckServing());
  PARAMD_ASSIGN_OR_RETURN(*response, daemon_->Register(request));
  return absl::OkStatus();
}

// Another daemon's device, from its Status (its backend), within the peer deadline.
absl::StatusOr<int> ControlService::PeerDevice(const std::string& job, const std::string& peer) {
  const auto control = v1::Control::NewStub(OwnerChannel(peer, {}, daemon_->peer_token()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(daemon_->config().peer_timeout_ms()));
  v1::StatusRequest request;
  request.set_job(job);
  v1::StatusResponse response;
  const absl::Status status = FromGrpcStatus(control->Status(&context, request, &response));
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("daemon ", peer, " of job ", Quoted(job),
                                               " did not give its device within peer_timeout_ms (",
                                               daemon_->config().peer_timeout_ms(),
                                               " ms): ", status.ToString()));
  }
  return BackendDevice(response.backend());
}

absl::Status ControlService::DoGetLayout(const v1::GetLayoutRequest& request,
                                         v1::GetLayoutResponse* response) {
  PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, daemon_->registry().Find(request.job()));
  PARAMD_RETURN_IF_ERROR(job->CheckUsable());
  // The pieces do not depend on the owners' devices, so every daemon of the job answers the same
  // pieces; each other daemon's device comes from that daemon (asked side by side would save
  // deadlines only where several are down; GetLayout is an operator's call).
  PARAMD_ASSIGN_OR_RETURN(const int device, BackendDevice(daemon_->config().backend()));
  const v1::RegisterRequest& spec = job->registration();
  const std::string& self = daemon_->advertised_address();
  std::map<std::string, int> devices = {{self, device}};
  for (const std::string& peer : spec.daemons()) {
    if (peer == self) continue;
    // A daemon that does not answer keeps its pieces; its device is unknown.
    absl::StatusOr<int> peer_device = PeerDevice(job->name(), peer);
    if (!peer_device.ok()) {
      PARAMD_LOG(WARNING) << "GetLayout of job " << Quoted(job->name()) << ": "
                          << peer_device.status().message();
    }
    devices[peer] = peer_device.ok() ? *peer_device : kUnknownDevice;
  }
  const auto& tensors = spec.tensors();
  PARAMD_ASSIGN_OR_RETURN(const ShardMap map, JobShardMap(spec, self, device));
  for (int i = 0; i < tensors.size(); ++i) {
    for (const ShardPiece& piece : map.tensors[static_cast<size_t>(i)]) {
      const Owner& owner = map.owners[piece.owner];
      v1::GetLayoutResponse::Placement* p = response->add_placements();
      p->set_tensor(tensors[i].name());
      p->set_daemon(owner.daemon);
      p->set_device(devices.at(owner.daemon));
      p->set_row_begin(piece.row_begin);
      p->set_row_end(piece.row_end);
    }
  }
  return absl::OkStatus();
}

absl::Status ControlService::DoSetHyperparams(const v1::SetHyperparamsRequest& request,
                                              v1::SetHyperparamsResponse* response) {
  PARAMD_RETURN_IF_ERROR(daemon_->CheckServing());
  PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, daemon_->registry().Find(request.job()));
  PARAMD_ASSIGN_OR_RETURN(*response->mutable_hyperparams(), job->SetHyperparams(request));
  PARAMD_LOG(INFO) << "job " << job->name() << ": hyperparams now "
                   << response->hyperparams().ShortDebugString();
  return absl::OkStatus();
}

absl::Status ControlService::DoStatus(const v1::StatusRequest& request,
                                      v1::StatusResponse* response) {
  if (request.daemon_only()) {
    *response = daemon_->Status(request.job(), /*jobs=*/false);
    return absl::OkStatus();
  }
  if (!request.job().empty()) {
    PARAMD_RETURN_IF_ERROR(daemon_->registry().Find(request.job()).status());
  }
  *response = daemon_->Status(request.job());
  return absl::OkStatus();
}

absl::Status ControlService::DoDeleteJob(const v1::DeleteJobRequest& request,
                                         v1::DeleteJobResponse* response) {
  PARAMD_ASSIGN_OR_RETURN(const MemoryBytes released, daemon_->DeleteJob(request.job()));
  response->set_released_host_bytes(released.host);
  response->set_released_device_bytes(released.device);
  return absl::OkStatus();
}

}  // namespace paramd
