// `inline`: bytes inside gRPC messages, in bounded chunks. Works wherever gRPC does. The daemon's
// end is the Data service's Push and Pull (server/data_service.cc).
#pragma once

#include <memory>

#include "transport/transport.h"

namespace paramd {

std::unique_ptr<Transport> MakeInlineTransport(const TransportContext& context);

}  // namespace paramd
