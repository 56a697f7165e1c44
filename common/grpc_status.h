// The one place absl::Status and grpc::Status meet.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace paramd {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace paramd
