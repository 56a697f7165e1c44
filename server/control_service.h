// gRPC Control service: validate, count, dispatch to the Daemon.
#pragma once

#include <string>

#include "paramd/v1/control.grpc.pb.h"
#include "server/daemon.h"

namespace paramd {

class ControlService final : public v1::Control::CallbackService {
 public:
  explicit ControlService(Daemon* daemon) : daemon_(daemon) {}
  // The address trainers reach this daemon at (for GetLayout).
  void set_address(std::string address) { address_ = std::move(address); }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* GetLayout(grpc::CallbackServerContext* context,
                                      const v1::GetLayoutRequest* request,
                                      v1::GetLayoutResponse* response) override;
  grpc::ServerUnaryReactor* SetHyperparams(grpc::CallbackServerContext* context,
                                           const v1::SetHyperparamsRequest* request,
                                           v1::SetHyperparamsResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const v1::StatusRequest* request,
                                   v1::StatusResponse* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const v1::DrainRequest* request,
                                  v1::DrainResponse* response) override;
  grpc::ServerWriteReactor<v1::StateChunk>* ExportState(
      grpc::CallbackServerContext* context, const v1::ExportStateRequest* request) override;
  grpc::ServerReadReactor<v1::StateChunk>* ImportState(grpc::CallbackServerContext* context,
                                                       v1::ImportStateResponse* response) override;

 private:
  Daemon* const daemon_;
  std::string address_;
};

}  // namespace paramd
