#include "server/control_service.h"

#include "common/grpc_status.h"
#include "common/logging.h"

namespace paramd {

grpc::ServerUnaryReactor* ControlService::Finish(grpc::CallbackServerContext* context,
                                                 const char* method, const absl::Status& status) {
  if (!status.ok()) {
    daemon_->metrics().RpcError(method, static_cast<int>(status.code()));
    PARAMD_LOG(DEBUG) << method << " failed: " << status;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* ControlService::Register(grpc::CallbackServerContext* context,
                                                   const v1::RegisterRequest* request,
                                                   v1::RegisterResponse* response) {
  absl::Status status = daemon_->CheckServing();
  if (status.ok()) {
    absl::StatusOr<v1::RegisterResponse> result = daemon_->Register(*request);
    status = result.status();
    if (result.ok()) *response = *std::move(result);
  }
  return Finish(context, "Register", status);
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
  return Finish(context, "GetLayout", job.status());
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
  return Finish(context, "SetHyperparams", status);
}

grpc::ServerUnaryReactor* ControlService::Status(grpc::CallbackServerContext* context,
                                                 const v1::StatusRequest* request,
                                                 v1::StatusResponse* response) {
  absl::Status status;
  if (!request->job().empty()) status = daemon_->registry().Find(request->job()).status();
  if (status.ok()) *response = daemon_->Status(request->job());
  return Finish(context, "Status", status);
}

grpc::ServerUnaryReactor* ControlService::Drain(grpc::CallbackServerContext* context,
                                                const v1::DrainRequest* request,
                                                v1::DrainResponse* response) {
  daemon_->Drain();
  response->set_running_steps(daemon_->pending_steps());
  return Finish(context, "Drain", absl::OkStatus());
}

}  // namespace paramd
