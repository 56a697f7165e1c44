// gRPC Data service: the daemon's end of the `inline` transport (gradient chunks in Push
// messages, served bytes in Pull messages), of `shm` (Attach hands out places in shared memory,
// in-place pushes mark slots written, place pulls lease served bytes, Release ends leases), and
// Commit, which every transport uses; `cuda_ipc` as `shm`, with places in the backend's GPU memory.
#pragma once

#include "paramd/v1/data.grpc.pb.h"
#include "server/daemon.h"

namespace paramd {

// Every method is raw (server/rpc_outcome.h): bytes that are not a request are INVALID_ARGUMENT.
// Pull's data messages are besides written as slices over the leased served buffer, so the bytes
// are not copied into a message first.
using RawDataService = v1::Data::WithRawCallbackMethod_Push<v1::Data::WithRawCallbackMethod_Commit<
    v1::Data::WithRawCallbackMethod_Pull<v1::Data::WithRawCallbackMethod_Attach<
        v1::Data::WithRawCallbackMethod_Release<v1::Data::Service>>>>>;

class DataService final : public RawDataService {
 public:
  explicit DataService(Daemon* daemon) : daemon_(daemon) {}

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
  // Attach for `cuda_ipc`: the backend's IPC handles, and with `step` the rank's slot places in
  // GPU memory.
  absl::Status AttachCudaIpc(const v1::AttachRequest& request, v1::AttachResponse* response);

  Daemon* const daemon_;
};

}  // namespace paramd
