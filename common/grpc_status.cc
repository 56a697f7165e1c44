#include "common/grpc_status.h"

#include <string>

#include "common/error_reason.h"

namespace paramd {

// absl::StatusCode and grpc::StatusCode share the canonical numbering (0..16): pinned here, as
// the conversions below cast one to the other.
#define PARAMD_SAME_CODE(absl_code, grpc_code) \
  static_assert(static_cast<int>(absl::StatusCode::absl_code) == grpc::StatusCode::grpc_code)
PARAMD_SAME_CODE(kOk, OK);
PARAMD_SAME_CODE(kCancelled, CANCELLED);
PARAMD_SAME_CODE(kUnknown, UNKNOWN);
PARAMD_SAME_CODE(kInvalidArgument, INVALID_ARGUMENT);
PARAMD_SAME_CODE(kDeadlineExceeded, DEADLINE_EXCEEDED);
PARAMD_SAME_CODE(kNotFound, NOT_FOUND);
PARAMD_SAME_CODE(kAlreadyExists, ALREADY_EXISTS);
PARAMD_SAME_CODE(kPermissionDenied, PERMISSION_DENIED);
PARAMD_SAME_CODE(kResourceExhausted, RESOURCE_EXHAUSTED);
PARAMD_SAME_CODE(kFailedPrecondition, FAILED_PRECONDITION);
PARAMD_SAME_CODE(kAborted, ABORTED);
PARAMD_SAME_CODE(kOutOfRange, OUT_OF_RANGE);
PARAMD_SAME_CODE(kUnimplemented, UNIMPLEMENTED);
PARAMD_SAME_CODE(kInternal, INTERNAL);
PARAMD_SAME_CODE(kUnavailable, UNAVAILABLE);
PARAMD_SAME_CODE(kDataLoss, DATA_LOSS);
PARAMD_SAME_CODE(kUnauthenticated, UNAUTHENTICATED);
#undef PARAMD_SAME_CODE

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string details;
  if (const v1::ErrorReason reason = ReasonOf(status); reason != v1::ERROR_REASON_UNSPECIFIED) {
    v1::ErrorDetails message;
    message.set_reason(reason);
    details = message.SerializeAsString();
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()),
                      details);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  v1::ErrorDetails details;
  if (!status.error_details().empty() && details.ParseFromString(status.error_details())) {
    out = WithReason(std::move(out), details.reason());
  }
  return out;
}

}  // namespace paramd
