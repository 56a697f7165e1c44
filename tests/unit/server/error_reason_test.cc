// Reasons programs act on travel with a status, not in its words: attached to an absl::Status,
// carried across gRPC in the status's error details, kept when a caller rewords the message.
#include "common/error_reason.h"

#include <gtest/gtest.h>

#include "common/daemon_instance.h"
#include "common/grpc_status.h"

namespace paramd {
namespace {

TEST(ErrorReasonTest, AReasonCrossesGrpcAndSurvivesARewording) {
  const absl::Status draining =
      WithReason(absl::UnavailableError("any words"), v1::ERROR_REASON_DRAINING);
  EXPECT_EQ(ReasonOf(draining), v1::ERROR_REASON_DRAINING);
  const grpc::Status wire = ToGrpcStatus(draining);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(wire.error_message(), "any words");
  EXPECT_FALSE(wire.error_details().empty());
  const absl::Status back = FromGrpcStatus(wire);
  EXPECT_EQ(back.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(back), v1::ERROR_REASON_DRAINING);
  const absl::Status reworded = Reworded(back, "other words (tensor \"w\")");
  EXPECT_EQ(reworded.message(), "other words (tensor \"w\")");
  EXPECT_EQ(ReasonOf(reworded), v1::ERROR_REASON_DRAINING);
}

TEST(ErrorReasonTest, MessagesAloneCarryNoReason) {
  // The words that once were matched mean nothing by themselves now.
  EXPECT_EQ(ReasonOf(absl::UnavailableError("the daemon is draining")),
            v1::ERROR_REASON_UNSPECIFIED);
  EXPECT_FALSE(FromAnotherDaemonStart(absl::FailedPreconditionError(kFromAnotherDaemonStart)));
  EXPECT_TRUE(FromAnotherDaemonStart(PlaceFromAnotherDaemonStart("segment 0")));
  EXPECT_TRUE(
      FromAnotherDaemonStart(FromGrpcStatus(ToGrpcStatus(PlaceFromAnotherDaemonStart("x")))));
  EXPECT_EQ(ToGrpcStatus(absl::InternalError("x")).error_details(), "");
  EXPECT_TRUE(WithReason(absl::OkStatus(), v1::ERROR_REASON_DRAINING).ok());
}

}  // namespace
}  // namespace paramd
