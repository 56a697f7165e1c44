// Attach says what it asks for (AttachRequest.purpose), against a real daemon over gRPC. A request
// of the earlier shape, which told its purpose by the fields set (no purpose, perhaps fields now
// reserved), comes from an older client: it is refused with FAILED_PRECONDITION and
// ERROR_REASON_CLIENT_TOO_OLD, saying to upgrade, and changes nothing. Each purpose of the current
// shape is answered, and one a transport has no use for is INVALID_ARGUMENT.
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "paramd/v1/control.grpc.pb.h"
#include "paramd/v1/data.grpc.pb.h"
#include "server/rpc/server.h"
#include "transport/transport.h"

namespace paramd {
namespace {

class AttachTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::DaemonConfig config;
    config.set_listen("127.0.0.1:0");
    config.set_metrics_listen("");
    config.set_log_level("warning");
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    control_ = v1::Control::NewStub(channel);
    data_ = v1::Data::NewStub(channel);
    v1::RegisterRequest request;
    request.set_job("j");
    request.set_world_size(1);
    v1::TensorSpec* tensor = request.add_tensors();
    tensor->set_name("t");
    tensor->set_rows(2);
    tensor->set_cols(4);
    tensor->set_grad_type(v1::ELEMENT_TYPE_FP32);
    v1::AdamwHyperparams* hyper = request.mutable_hyperparams();
    hyper->set_lr(1e-2);
    hyper->set_beta1(0.9);
    hyper->set_beta2(0.999);
    hyper->set_eps(1e-8);
    grpc::ClientContext context;
    v1::RegisterResponse response;
    const grpc::Status status = control_->Register(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    // Rank 0's initial weights, inline: gradients (and their slots) come after them.
    std::string reason;
    absl::StatusOr<std::unique_ptr<Transport>> inline_transport =
        ChooseTransport("inline", TransportContext{channel, 4 << 20, "j", 0}, &reason);
    ASSERT_TRUE(inline_transport.ok()) << inline_transport.status();
    const std::vector<float> weights(8, 0.5f);
    const PushItem items[] = {{"t", std::as_bytes(std::span<const float>(weights))}};
    const absl::Status pushed =
        (*inline_transport)
            ->Push({"j", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, items,
                   std::chrono::system_clock::now() + std::chrono::seconds(10));
    ASSERT_TRUE(pushed.ok()) << pushed;
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  absl::Status Attach(const v1::AttachRequest& request, v1::AttachResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return FromGrpcStatus(data_->Attach(&context, request, response));
  }

  // Rank 0's transport and reason as Status reports them ("" where none was declared).
  std::pair<std::string, std::string> Declared() {
    v1::StatusRequest request;
    request.set_job("j");
    grpc::ClientContext context;
    v1::StatusResponse response;
    EXPECT_TRUE(control_->Status(&context, request, &response).ok());
    if (response.jobs_size() != 1) return {};
    for (const v1::TrainerTransport& t : response.jobs(0).trainers()) {
      if (t.rank() == 0) return {t.transport(), t.reason()};
    }
    return {};
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Control::Stub> control_;
  std::unique_ptr<v1::Data::Stub> data_;
};

// An AttachRequest as a client of the earlier protocol sent it: job 1, rank 2, transport 3 as
// today, and the fields that told its purpose (now reserved: reason 4, step 5, nccl 6,
// regions_only 7) as unknown fields of today's message, so the bytes on the wire are the old ones.
struct OldShape {
  const char* what;
  std::string job;
  std::string transport;
  std::optional<std::string> reason;
  std::optional<int64_t> step;
  bool nccl_open = false;
  bool regions_only = false;
};

v1::AttachRequest OldRequest(const OldShape& old) {
  v1::AttachRequest request;
  request.set_job(old.job);
  request.set_rank(0);
  request.set_transport(old.transport);
  google::protobuf::UnknownFieldSet* fields =
      request.GetReflection()->MutableUnknownFields(&request);
  if (old.reason) fields->AddLengthDelimited(4, *old.reason);
  if (old.step) fields->AddVarint(5, static_cast<uint64_t>(*old.step));
  if (old.nccl_open) fields->AddLengthDelimited(6)->assign("\x08\x01", 2);  // NcclCall{open: true}
  if (old.regions_only) fields->AddVarint(7, 1);
  return request;
}

TEST_F(AttachTest, EveryRequestOfAnOlderClientIsRefusedSayingToUpgradeAndChangesNothing) {
  const OldShape shapes[] = {
      {"a probe", "", "shm", std::nullopt, std::nullopt},
      {"a declaration", "j", "shm", "first viable transport", std::nullopt},
      {"a declaration of inline", "j", "inline", "asked for by name", std::nullopt},
      {"a step's slot places", "j", "shm", std::nullopt, 0},
      {"a job's regions", "j", "shm", std::nullopt, std::nullopt, false, true},
      {"an nccl session open", "j", "nccl", std::nullopt, std::nullopt, true},
  };
  for (const OldShape& old : shapes) {
    SCOPED_TRACE(old.what);
    const v1::AttachRequest request = OldRequest(old);
    v1::AttachResponse response;
    const absl::Status status = Attach(request, &response);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_CLIENT_TOO_OLD) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "older than the daemon")) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "upgrade the client")) << status;
    EXPECT_FALSE(response.has_shm());
    EXPECT_EQ(response.slots_size(), 0);
  }
  EXPECT_EQ(Declared(), (std::pair<std::string, std::string>{}));  // nothing was declared
}

TEST_F(AttachTest, EachPurposeOfTheCurrentShapeIsAnswered) {
  v1::AttachRequest probe;
  probe.set_transport("shm");
  probe.mutable_probe();
  v1::AttachResponse probed;
  const absl::Status probed_status = Attach(probe, &probed);
  ASSERT_TRUE(probed_status.ok()) << probed_status;
  ASSERT_EQ(probed.shm().segments_size(), 1);  // the probe's own segment
  EXPECT_NE(probed.instance(), 0u);

  v1::AttachRequest declare;
  declare.set_job("j");
  declare.set_rank(0);
  declare.set_transport("shm");
  declare.mutable_declare()->set_reason("first viable transport");
  v1::AttachResponse declared;
  const absl::Status declared_status = Attach(declare, &declared);
  ASSERT_TRUE(declared_status.ok()) << declared_status;
  EXPECT_GT(declared.shm().segments_size(), 0);  // the job's own segments
  EXPECT_EQ(Declared(), (std::pair<std::string, std::string>{"shm", "first viable transport"}));

  v1::AttachRequest regions;
  regions.set_job("j");
  regions.set_transport("shm");
  regions.mutable_regions();
  v1::AttachResponse described;
  const absl::Status described_status = Attach(regions, &described);
  ASSERT_TRUE(described_status.ok()) << described_status;
  EXPECT_EQ(described.shm().segments(0), declared.shm().segments(0));
  EXPECT_NE(described.shm().segments(0), probed.shm().segments(0));

  v1::AttachRequest slots;
  slots.set_job("j");
  slots.set_rank(0);
  slots.set_transport("shm");
  slots.mutable_slots()->set_step(0);
  v1::AttachResponse placed;
  const absl::Status placed_status = Attach(slots, &placed);
  ASSERT_TRUE(placed_status.ok()) << placed_status;
  ASSERT_EQ(placed.slots_size(), 1);
  EXPECT_EQ(placed.slots(0).tensor(), "t");
  EXPECT_EQ(placed.slots(0).bytes(), 2 * 4 * 4);
  EXPECT_FALSE(placed.committed());
}

TEST_F(AttachTest, APurposeTheTransportHasNoUseForIsInvalidArgument) {
  v1::AttachRequest transfer;
  transfer.set_job("j");
  transfer.set_transport("shm");
  transfer.mutable_nccl_transfer()->set_session(1);
  v1::AttachResponse response;
  absl::Status status = Attach(transfer, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "nccl_transfer")) << status;

  v1::AttachRequest slots;
  slots.set_job("j");
  slots.set_transport("inline");
  slots.mutable_slots()->set_step(0);
  status = Attach(slots, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;

  v1::AttachRequest regions;  // regions of no job: a probe says so
  regions.set_transport("shm");
  regions.mutable_regions();
  status = Attach(regions, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
}

}  // namespace
}  // namespace paramd
