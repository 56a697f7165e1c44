#include "server/rpc/peer_service.h"

#include "server/rpc/rpc_outcome.h"

namespace paramd {

grpc::ServerUnaryReactor* PeerService::Offer(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) {
  return ServeUnary<v1::PeerOffer, v1::PeerOfferResponse>(
      context, daemon_, *access_, "Offer", request, response,
      [](const Caller& caller, const v1::PeerOffer&) { return caller.MayOffer(); },
      [this](const v1::PeerOffer& offer, v1::PeerOfferResponse*) {
        return daemon_->peers().Accept(offer);
      });
}

}  // namespace paramd
