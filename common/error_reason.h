// Statuses that programs tell apart by their reason (paramd.v1.ErrorReason), not by their words:
// the reason rides in the absl::Status as a payload, and across gRPC in the status's error details
// (common/grpc_status.h converts both ways).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "paramd/v1/types.pb.h"

namespace paramd {

// `status` with `reason` attached (an OK status stays OK).
absl::Status WithReason(absl::Status status, v1::ErrorReason reason);
// The reason attached to `status`, or ERROR_REASON_UNSPECIFIED.
v1::ErrorReason ReasonOf(const absl::Status& status);
// A status of `status`'s code and reason with another message (a caller's context added).
absl::Status Reworded(const absl::Status& status, std::string message);

// The payload's key in absl::Status.
inline constexpr char kErrorDetailsUrl[] = "type.googleapis.com/paramd.v1.ErrorDetails";

}  // namespace paramd
