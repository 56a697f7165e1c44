// gRPC Peer service (proto/paramd/v1/peer.proto): another daemon's offer of a round of a sharded
// job's agreement, stored in this daemon's PeerExchange (server/shard/peer_exchange.h). Raw, as the
// other services (server/rpc/rpc_outcome.h).
#pragma once

#include "paramd/v1/peer.grpc.pb.h"
#include "server/daemon.h"
#include "server/rpc/access.h"

namespace paramd {

class PeerService final : public v1::Peer::WithRawCallbackMethod_Offer<v1::Peer::Service> {
 public:
  PeerService(Daemon* daemon, const AccessControl* access) : daemon_(daemon), access_(access) {}

  grpc::ServerUnaryReactor* Offer(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;

 private:
  Daemon* const daemon_;
  const AccessControl* const access_;
};

}  // namespace paramd
