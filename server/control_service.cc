#include "server/control_service.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/rpc_outcome.h"
#include "server/state_transfer.h"

namespace paramd {
namespace {

// Streams a job's state chunk by chunk (server/state_transfer.h). The export starts once the
// steps committed before it ran, without holding a thread meanwhile, and holds the job's later
// steps back until End, which releases it before the call finishes.
class ExportReactor final : public grpc::ServerWriteReactor<v1::StateChunk> {
 public:
  ExportReactor(Daemon* daemon, const v1::ExportStateRequest& request) : daemon_(daemon) {
    absl::Status status = Begin(request);
    if (!status.ok()) End(status);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(absl::CancelledError("the export's reader went away"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Begin(const v1::ExportStateRequest& request) {
    PARAMD_RETURN_IF_ERROR(daemon_->CheckServing());
    const int64_t limit = daemon_->config().max_chunk_bytes();
    if (request.max_chunk_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_chunk_bytes = ", request.max_chunk_bytes(), " must be >= 0"));
    }
    const int64_t chunk =
        request.max_chunk_bytes() == 0 ? limit : std::min(limit, request.max_chunk_bytes());
    PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, daemon_->registry().Find(request.job()));
    Daemon* daemon = daemon_;
    // A step held back while the export streamed goes back to the step executor at its end.
    StateExport::Begin(
        job, chunk, [daemon, job](const StepWork& held) { daemon->StartStep(job, held); },
        [this](absl::StatusOr<std::unique_ptr<StateExport>> started) {
          if (!started.ok()) {
            End(started.status());
            return;
          }
          export_ = *std::move(started);
          WriteNext();
        });
    return absl::OkStatus();
  }

  void WriteNext() {
    absl::StatusOr<bool> more = export_->Next(&chunk_);
    if (!more.ok()) {
      End(more.status());
    } else if (!*more) {
      End(absl::OkStatus());
    } else {
      StartWrite(&chunk_);
    }
  }

  void End(const absl::Status& status) {
    export_.reset();
    CountRpcError(daemon_, "ExportState", status);
    Finish(ToGrpcStatus(status));
  }

  Daemon* const daemon_;
  std::unique_ptr<StateExport> export_;
  v1::StateChunk chunk_;
};

// Stages an import stream (the job named by its header) and applies it once it ended whole.
class ImportReactor final : public grpc::ServerReadReactor<v1::StateChunk> {
 public:
  ImportReactor(Daemon* daemon, v1::ImportStateResponse* response)
      : daemon_(daemon), response_(response) {
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client finished writing (or the call ended)
      End(Apply());
      return;
    }
    absl::Status status = Take();
    if (!status.ok()) {
      End(status);
      return;
    }
    StartRead(&chunk_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Take() {
    if (import_ == nullptr) {
      PARAMD_RETURN_IF_ERROR(daemon_->CheckServing());
      if (!chunk_.has_header()) {
        return absl::InvalidArgumentError(
            "the first chunk of a state stream must carry the StateHeader");
      }
      PARAMD_ASSIGN_OR_RETURN(job_, daemon_->registry().Find(chunk_.header().job()));
      import_ = std::make_unique<StateImport>(job_->spec(), daemon_->config().max_chunk_bytes());
    }
    return import_->Add(chunk_);
  }

  absl::Status Apply() {
    if (import_ == nullptr) {
      return absl::InvalidArgumentError(
          "the state stream is empty; it starts with a chunk carrying the StateHeader");
    }
    PARAMD_ASSIGN_OR_RETURN(StagedState staged, import_->Finish());
    import_.reset();
    PARAMD_ASSIGN_OR_RETURN(*response_, job_->Import(std::move(staged)));
    PARAMD_LOG(INFO) << "job " << job_->name() << ": imported state at step "
                     << response_->next_step() << " (" << response_->fields() << " fields, "
                     << response_->bytes() << " bytes)";
    return absl::OkStatus();
  }

  void End(const absl::Status& status) {
    import_.reset();  // the staged bytes go now, not when the call is done
    CountRpcError(daemon_, "ImportState", status);
    Finish(ToGrpcStatus(status));
  }

  Daemon* const daemon_;
  v1::ImportStateResponse* const response_;
  v1::StateChunk chunk_;
  std::shared_ptr<Job> job_;
  std::unique_ptr<StateImport> import_;
};

}  // namespace

grpc::ServerUnaryReactor* ControlService::Register(grpc::CallbackServerContext* context,
                                                   const v1::RegisterRequest* request,
                                                   v1::RegisterResponse* response) {
  absl::Status status = daemon_->CheckServing();
  if (status.ok()) {
    absl::StatusOr<v1::RegisterResponse> result = daemon_->Register(*request);
    status = result.status();
    if (result.ok()) *response = *std::move(result);
  }
  return FinishUnary(context, daemon_, "Register", status);
}

grpc::ServerUnaryReactor* ControlService::GetLayout(grpc::CallbackServerContext* context,
                                                    const v1::GetLayoutRequest* request,
                                                    v1::GetLayoutResponse* response) {
  absl::StatusOr<std::shared_ptr<Job>> job = daemon_->registry().Find(request->job());
  if (job.ok()) {
    const v1::JobStatus status = (*job)->Status();
    for (const v1::TensorStatus& t : status.tensors()) {
      v1::GetLayoutResponse::Placement* p = response->add_placements();
      p->set_tensor(t.name());
      p->set_daemon(address_);
    }
  }
  return FinishUnary(context, daemon_, "GetLayout", job.status());
}

grpc::ServerUnaryReactor* ControlService::SetHyperparams(grpc::CallbackServerContext* context,
                                                         const v1::SetHyperparamsRequest* request,
                                                         v1::SetHyperparamsResponse* response) {
  absl::Status status = daemon_->CheckServing();
  if (status.ok()) {
    absl::StatusOr<std::shared_ptr<Job>> job = daemon_->registry().Find(request->job());
    status = job.status();
    if (job.ok()) {
      absl::StatusOr<v1::AdamwHyperparams> hyper = (*job)->SetHyperparams(*request);
      status = hyper.status();
      if (hyper.ok()) {
        *response->mutable_hyperparams() = *hyper;
        PARAMD_LOG(INFO) << "job " << request->job() << ": hyperparams now "
                         << hyper->ShortDebugString();
      }
    }
  }
  return FinishUnary(context, daemon_, "SetHyperparams", status);
}

grpc::ServerUnaryReactor* ControlService::Status(grpc::CallbackServerContext* context,
                                                 const v1::StatusRequest* request,
                                                 v1::StatusResponse* response) {
  absl::Status status;
  if (!request->job().empty()) status = daemon_->registry().Find(request->job()).status();
  if (status.ok()) *response = daemon_->Status(request->job());
  return FinishUnary(context, daemon_, "Status", status);
}

grpc::ServerUnaryReactor* ControlService::Drain(grpc::CallbackServerContext* context,
                                                const v1::DrainRequest* request,
                                                v1::DrainResponse* response) {
  daemon_->Drain();
  response->set_running_steps(daemon_->pending_steps());
  return FinishUnary(context, daemon_, "Drain", absl::OkStatus());
}

grpc::ServerWriteReactor<v1::StateChunk>* ControlService::ExportState(
    grpc::CallbackServerContext* context, const v1::ExportStateRequest* request) {
  return new ExportReactor(daemon_, *request);
}

grpc::ServerReadReactor<v1::StateChunk>* ControlService::ImportState(
    grpc::CallbackServerContext* context, v1::ImportStateResponse* response) {
  return new ImportReactor(daemon_, response);
}

}  // namespace paramd
