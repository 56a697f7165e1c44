// gRPC Control service: parse, validate, count, dispatch to the Daemon. Its methods are raw
// (server/rpc/rpc_outcome.h): each parses its request itself, so bytes that are not one get
// INVALID_ARGUMENT.
#pragma once

#include "paramd/v1/control.grpc.pb.h"
#include "server/checkpoints.h"
#include "server/daemon.h"
#include "server/rpc/access.h"

namespace paramd {

using RawControlService =
    v1::Control::WithRawCallbackMethod_Register<v1::Control::WithRawCallbackMethod_GetLayout<
        v1::Control::WithRawCallbackMethod_SetHyperparams<v1::Control::WithRawCallbackMethod_Status<
            v1::Control::WithRawCallbackMethod_Drain<v1::Control::WithRawCallbackMethod_DeleteJob<
                v1::Control::WithRawCallbackMethod_ExportState<
                    v1::Control::WithRawCallbackMethod_ImportState<
                        v1::Control::WithRawCallbackMethod_Checkpoint<
                            v1::Control::WithRawCallbackMethod_Restore<
                                v1::Control::Service>>>>>>>>>>;

class ControlService final : public RawControlService {
 public:
  ControlService(Daemon* daemon, const AccessControl* access)
      : daemon_(daemon), access_(access), checkpoints_(daemon) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetLayout(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* SetHyperparams(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ExportState(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* ImportState(grpc::CallbackServerContext* context,
                                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Restore(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;

 private:
  absl::Status DoRegister(const v1::RegisterRequest& request, v1::RegisterResponse* response);
  absl::Status DoGetLayout(const v1::GetLayoutRequest& request, v1::GetLayoutResponse* response);
  absl::StatusOr<int> PeerDevice(const std::string& job, const std::string& peer);
  absl::Status DoSetHyperparams(const v1::SetHyperparamsRequest& request,
                                v1::SetHyperparamsResponse* response);
  absl::Status DoStatus(const v1::StatusRequest& request, v1::StatusResponse* response);
  absl::Status DoDeleteJob(const v1::DeleteJobRequest& request, v1::DeleteJobResponse* response);

  Daemon* const daemon_;
  const AccessControl* const access_;
  Checkpoints checkpoints_;
};

}  // namespace paramd
