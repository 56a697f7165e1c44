#include "server/rpc/peer_service.h"

#include "server/rpc/rpc_outcome.h"

namespace paramd {

grpc::ServerUnaryReactor* PeerService::Offer(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) {
  return ServeUnary<v1::PeerOffer, v1::PeerOfferResponse>(
      context, daemon_, "Offer", request, response,
      [this](const v1::PeerOffer& offer, v1::PeerOfferResponse*) {
        return daemon_->peers().Accept(offer);
      });
}

}  // namespace paramd
