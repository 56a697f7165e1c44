// gRPC Data service, which every transport's messages reach: Push (gradient chunks, or marks of
// bytes a trainer wrote in place), Pull (served bytes streamed, or leased where they lie), Release
// (ends leases), Commit, and Attach, which it hands to the daemon end of the transport named
// (transport/daemon_end.h).
#pragma once

#include "paramd/v1/data.grpc.pb.h"
#include "server/daemon.h"
#include "server/rpc/access.h"

namespace paramd {

// Every method is raw (server/rpc/rpc_outcome.h): bytes that are not a request are
// INVALID_ARGUMENT. Pull's data messages are besides written as slices over the leased served
// buffer, so the bytes are not copied into a message first.
using RawDataService = v1::Data::WithRawCallbackMethod_Push<v1::Data::WithRawCallbackMethod_Commit<
    v1::Data::WithRawCallbackMethod_Pull<v1::Data::WithRawCallbackMethod_Attach<
        v1::Data::WithRawCallbackMethod_Release<v1::Data::Service>>>>>;

class DataService final : public RawDataService {
 public:
  DataService(Daemon* daemon, const AccessControl* access) : daemon_(daemon), access_(access) {}

  grpc::ServerReadReactor<grpc::ByteBuffer>* Push(grpc::CallbackServerContext* context,
                                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Pull(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Attach(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;

 private:
  absl::Status DoCommit(const v1::CommitRequest& request, v1::CommitResponse* response);
  absl::Status DoAttach(const v1::AttachRequest& request, v1::AttachResponse* response);

  Daemon* const daemon_;
  const AccessControl* const access_;
};

}  // namespace paramd
