// Requests a hostile or broken client sends, over real RPCs to a real paramd::Server on
// 127.0.0.1 port 0 with its default memory budget (the machine's): bytes that are not a request,
// names of 10 KB, undefined enum values, a job past the budget, a deleted job, a pull left waiting
// at shutdown. Each gets a specific status with a message a person can act on, is counted in
// paramd_rpc_errors_total, and leaves the daemon serving.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "client/client.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "paramd/v1/control.grpc.pb.h"
#include "paramd/v1/data.grpc.pb.h"
#include "server/rpc/server.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/status_assertions.h"

namespace paramd {
namespace {

using namespace std::chrono_literals;
using testing::ForRank;
using testing::MakeSpec;
using testing::RandomWeights;
using testing::ToBytes;

constexpr char kJob[] = "hostile";

::testing::AssertionResult HasStatus(const grpc::Status& status, grpc::StatusCode code,
                                     absl::string_view text = "") {
  return testing::HasStatus(FromGrpcStatus(status), static_cast<absl::StatusCode>(code), text);
}

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// A client-streaming call with raw messages (the generic stub calls it as a bidi stream: the
// same frames on the wire), as a client built from other protos would send them.
class RawStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawStream(grpc::GenericStub& stub, const std::string& method, std::vector<std::string> messages)
      : messages_(std::move(messages)) {
    context_.set_deadline(std::chrono::system_clock::now() + 20s);
    stub.PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
    StartRead(&response_);
    WriteNext();
    StartCall();
  }
  grpc::Status Await() {
    done_.WaitForNotification();
    return status_;
  }
  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnReadDone(bool) override {}
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }

 private:
  void WriteNext() {
    if (next_ == messages_.size()) {
      StartWritesDone();
      return;
    }
    buffer_ = Bytes(messages_[next_++]);
    StartWrite(&buffer_);
  }

  grpc::ClientContext context_;
  std::vector<std::string> messages_;
  size_t next_ = 0;
  grpc::ByteBuffer buffer_;
  grpc::ByteBuffer response_;
  absl::Notification done_;
  grpc::Status status_;
};

class HostileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::DaemonConfig config;
    config.set_listen("127.0.0.1:0");
    config.set_metrics_listen("");
    config.set_step_threads(1);
    config.set_shared_memory(false);
    config.set_log_level("error");
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    generic_ = std::make_unique<grpc::GenericStub>(channel_);
    control_ = v1::Control::NewStub(channel_);
    data_ = v1::Data::NewStub(channel_);
    ClientOptions options;
    options.address = server_->address();
    options.transport = "inline";
    options.max_attempts = 1;
    client_ = Client::Connect(options).value();
    spec_ = MakeSpec(kJob, 1, {{"w", 4, 8}});
    ASSERT_TRUE(client_->Register(spec_).ok());
    const std::string weights = ToBytes(RandomWeights(spec_, 3)[0]);
    const std::vector<PushItem> items = {
        {"w", std::as_bytes(std::span<const char>(weights.data(), weights.size()))}};
    ASSERT_TRUE(client_->UploadInitialWeights(kJob, items).ok());
  }

  grpc::Status RawUnary(const std::string& method, const std::string& bytes) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 20s);
    const grpc::ByteBuffer request = Bytes(bytes);
    grpc::ByteBuffer response;
    absl::Notification done;
    grpc::Status status;
    generic_->UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                        [&](grpc::Status s) {
                          status = std::move(s);
                          done.Notify();
                        });
    done.WaitForNotification();
    return status;
  }

  // The daemon's count of failed calls of `method` with `code` (paramd_rpc_errors_total).
  double RpcErrors(const std::string& method, const std::string& code) {
    const std::string text =
        prometheus::TextSerializer().Serialize(server_->daemon().metrics().registry().Collect());
    const std::string series =
        absl::StrCat("paramd_rpc_errors_total{code=\"", code, "\",method=\"", method, "\"} ");
    const size_t at = text.find(series);
    return at == std::string::npos ? 0 : std::stod(text.substr(at + series.size()));
  }

  // One chunk on a push stream of its own (its last: PushChunk.last).
  grpc::Status PushOne(v1::PushChunk chunk, v1::PushResponse* response = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 20s);
    v1::PushResponse ignored;
    auto writer = data_->Push(&context, response != nullptr ? response : &ignored);
    chunk.set_last(true);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }

  // The job is as it was and the daemon still answers.
  void ExpectStillServing() {
    absl::StatusOr<v1::StatusResponse> status = client_->Status(kJob);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->jobs(0).tensors(0).version(), 0);
    EXPECT_EQ(status->jobs(0).state(), v1::JOB_STATE_ACTIVE);
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> generic_;
  std::unique_ptr<v1::Control::Stub> control_;
  std::unique_ptr<v1::Data::Stub> data_;
  std::unique_ptr<Client> client_;
  v1::RegisterRequest spec_;
};

TEST_F(HostileInputTest, BytesThatAreNotARequestAreInvalidArgumentWithAMessageAndCounted) {
  // Garbage, a truncated message (a length past its end) and a job name that is not UTF-8.
  const std::string garbage = "\xff\xff\xff\xff\x0f";
  const std::string truncated = "\x0a\x10hostile";
  const std::string not_utf8 = "\x0a\x02\xff\xfe";
  for (const auto& [method, type] : std::vector<std::pair<std::string, std::string>>{
           {"/paramd.v1.Control/Register", "paramd.v1.RegisterRequest"},
           {"/paramd.v1.Control/Status", "paramd.v1.StatusRequest"},
           {"/paramd.v1.Control/DeleteJob", "paramd.v1.DeleteJobRequest"},
           {"/paramd.v1.Data/Commit", "paramd.v1.CommitRequest"},
           {"/paramd.v1.Data/Attach", "paramd.v1.AttachRequest"},
           {"/paramd.v1.Peer/Offer", "paramd.v1.PeerOffer"}}) {
    SCOPED_TRACE(method);
    for (const std::string& bytes : {garbage, truncated, not_utf8}) {
      EXPECT_TRUE(HasStatus(RawUnary(method, bytes), grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("is not a valid ", type, " message")));
    }
  }
  EXPECT_EQ(RpcErrors("Register", "INVALID_ARGUMENT"), 3);
  EXPECT_EQ(RpcErrors("Commit", "INVALID_ARGUMENT"), 3);
  // A push stream of such chunks ends with the first one, stored nothing, and says why.
  RawStream push(*generic_, "/paramd.v1.Data/Push", {garbage, not_utf8});
  EXPECT_TRUE(HasStatus(push.Await(), grpc::StatusCode::INVALID_ARGUMENT,
                        "is not a valid paramd.v1.PushChunk message"));
  EXPECT_EQ(RpcErrors("Push", "INVALID_ARGUMENT"), 1);
  RawStream import(*generic_, "/paramd.v1.Control/ImportState", {truncated});
  EXPECT_TRUE(HasStatus(import.Await(), grpc::StatusCode::INVALID_ARGUMENT,
                        "is not a valid paramd.v1.StateChunk message"));
  ExpectStillServing();
}

TEST_F(HostileInputTest, ANameOf10KbIsQuotedCutInTheMessage) {
  const std::string name(10240, 'n');
  absl::StatusOr<v1::StatusResponse> status = client_->Status(name);
  EXPECT_TRUE(testing::HasStatus(status, absl::StatusCode::kNotFound, "(10240 bytes)"));
  EXPECT_LT(status.status().message().size(), 512u);
  // A push names its job and tensor; an unknown tensor of 10 KB, twice in its message at most.
  v1::PushChunk chunk;
  chunk.set_job(kJob);
  chunk.set_tensor(name);
  chunk.set_data(std::string(4, '\0'));
  const grpc::Status pushed = PushOne(chunk);
  EXPECT_TRUE(HasStatus(pushed, grpc::StatusCode::NOT_FOUND, "has no tensor \"nnnn"));
  EXPECT_LT(pushed.error_message().size(), 512u);
  // A job name past 128 characters is refused at Register, cut the same way.
  v1::RegisterRequest long_name = spec_;
  long_name.set_job(name);
  absl::StatusOr<v1::RegisterResponse> registered = client_->Register(long_name);
  EXPECT_TRUE(testing::HasStatus(registered, absl::StatusCode::kInvalidArgument,
                                 "(10240 bytes) must be 1 to 128 characters"));
  EXPECT_LT(registered.status().message().size(), 512u);
  ExpectStillServing();
}

TEST_F(HostileInputTest, UndefinedEnumValuesAreInvalidArgument) {
  v1::PushChunk chunk;
  chunk.set_job(kJob);
  chunk.set_tensor("w");
  chunk.set_kind(static_cast<v1::PushKind>(77));
  chunk.set_data(std::string(4, '\0'));
  v1::PushResponse response;
  EXPECT_TRUE(HasStatus(PushOne(chunk, &response), grpc::StatusCode::INVALID_ARGUMENT,
                        "push kind 77 is not a PushKind"));
  EXPECT_EQ(response.chunks_stored(), 0);

  auto pull = [&](const v1::PullRequest& request) {
    grpc::ClientContext pull_context;
    pull_context.set_deadline(std::chrono::system_clock::now() + 20s);
    auto reader = data_->Pull(&pull_context, request);
    v1::PullChunk ignored;
    while (reader->Read(&ignored)) {
    }
    return reader->Finish();
  };
  v1::PullRequest request;
  request.set_job(kJob);
  request.set_tensor("w");
  request.mutable_format()->set_recipe(v1::RECIPE_FP32);
  request.set_delivery(static_cast<v1::PullDelivery>(9));
  EXPECT_TRUE(HasStatus(pull(request), grpc::StatusCode::INVALID_ARGUMENT,
                        "delivery 9 is not a PullDelivery"));
  request.clear_delivery();
  request.mutable_format()->set_recipe(static_cast<v1::Recipe>(77));
  EXPECT_TRUE(HasStatus(pull(request), grpc::StatusCode::INVALID_ARGUMENT,
                        "format recipe 77 direction 0 is not a Recipe"));
  ExpectStillServing();
}

// A push stream says where it ends (PushChunk.last): one that ends without it, as a cut
// connection does, is DATA_LOSS, never OK; its whole chunks stand (the same chunk pushed again is
// a duplicate). A chunk after the last is INVALID_ARGUMENT. Cuts inside gRPC's own framing are
// tests/integration/truncated_push_test.sh.
TEST_F(HostileInputTest, APushStreamThatEndsWithoutItsLastChunkIsDataLossAndItsChunksStand) {
  v1::PushChunk chunk;
  chunk.set_job(kJob);
  chunk.set_tensor("w");
  chunk.set_kind(v1::PUSH_KIND_GRADIENT);
  chunk.set_data(std::string(4 * 8 * sizeof(float), '\0'));
  auto stream = [&](const std::vector<v1::PushChunk>& chunks, v1::PushResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 20s);
    auto writer = data_->Push(&context, response);
    for (const v1::PushChunk& c : chunks) {
      if (!writer->Write(c)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  v1::PushResponse response;
  const grpc::Status cut = stream({chunk}, &response);
  EXPECT_EQ(cut.error_code(), grpc::StatusCode::DATA_LOSS) << cut.error_message();
  EXPECT_NE(cut.error_message().find("ended before its last chunk"), std::string::npos);
  EXPECT_EQ(RpcErrors("Push", "DATA_LOSS"), 1);
  v1::PushChunk last = chunk;
  last.set_last(true);
  const grpc::Status after = stream({last, chunk}, &response);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << after.error_message();
  EXPECT_NE(after.error_message().find("after the stream's last one"), std::string::npos);
  v1::PushResponse again;
  ASSERT_TRUE(PushOne(chunk, &again).ok());
  EXPECT_EQ(again.chunks_stored(), 0);
  EXPECT_EQ(again.chunks_duplicate(), 1) << "the chunk of the cut stream was not kept";
  ExpectStillServing();
}

// The two requests that once crashed a daemon: a valid Register of 2^36 FP32 elements, then a
// push of its initial weights (or an import). The Register is refused by the budget, nothing
// else reaches the job, and the daemon goes on serving and stops on request.
TEST_F(HostileInputTest, AJobPastTheMemoryBudgetIsRefusedAtRegisterAndTheDaemonGoesOn) {
  const v1::RegisterRequest huge = MakeSpec("huge", 1, {{"w", 262144, 262144}});
  absl::StatusOr<v1::RegisterResponse> registered = client_->Register(huge);
  EXPECT_TRUE(
      testing::HasStatus(registered, absl::StatusCode::kResourceExhausted, "memory_budget_bytes"));
  EXPECT_TRUE(
      testing::HasStatus(registered, absl::StatusCode::kResourceExhausted, "bytes of host memory"));
  EXPECT_EQ(ReasonOf(registered.status()), v1::ERROR_REASON_MEMORY_BUDGET);
  for (int attempt = 0; attempt < 2; ++attempt) {
    v1::PushChunk chunk;
    chunk.set_job("huge");
    chunk.set_tensor("w");
    chunk.set_kind(v1::PUSH_KIND_INITIAL_WEIGHTS);
    chunk.set_data(std::string(4096, '\0'));
    EXPECT_TRUE(HasStatus(PushOne(chunk), grpc::StatusCode::NOT_FOUND, "no job \"huge\""));
  }
  absl::StatusOr<v1::StatusResponse> status = client_->Status();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->jobs_size(), 1);
  EXPECT_GT(status->memory_budget_bytes(), 0);
  EXPECT_LE(status->memory_reserved_bytes(), status->memory_budget_bytes());
  ExpectStillServing();
}

TEST_F(HostileInputTest, DeleteJobFreesTheJobAndGivesItsBudgetBack) {
  absl::StatusOr<v1::StatusResponse> before = client_->Status();
  ASSERT_TRUE(before.ok());
  const int64_t reserved = before->jobs(0).reserved_host_bytes();
  EXPECT_GT(reserved, 0);
  EXPECT_EQ(before->memory_reserved_bytes(), reserved);
  absl::StatusOr<v1::DeleteJobResponse> deleted = client_->DeleteJob(kJob);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->released_host_bytes(), reserved);
  absl::StatusOr<v1::StatusResponse> after = client_->Status();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->jobs_size(), 0);
  EXPECT_EQ(after->memory_reserved_bytes(), 0);
  EXPECT_TRUE(testing::HasStatus(client_->Commit(kJob, 0, 0), absl::StatusCode::kNotFound));
  EXPECT_TRUE(testing::HasStatus(client_->DeleteJob(kJob), absl::StatusCode::kNotFound));
  EXPECT_TRUE(client_->Register(spec_).ok());  // the name starts over
}

// Pulls that wait are capped (max_waiting_pulls): one more is RESOURCE_EXHAUSTED naming the
// limit, while a pull of a version already published takes no waiting place and is served.
TEST_F(HostileInputTest, PullsPastMaxWaitingPullsAreRefusedAndPublishedVersionsStillServed) {
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_shared_memory(false);
  config.set_log_level("error");
  config.set_max_waiting_pulls(1);
  std::unique_ptr<Server> capped = Server::Start(config).value();
  ClientOptions options;
  options.address = capped->address();
  options.transport = "inline";
  options.max_attempts = 1;
  std::unique_ptr<Client> client = Client::Connect(options).value();
  ASSERT_TRUE(client->Register(spec_).ok());
  const std::string weights = ToBytes(RandomWeights(spec_, 3)[0]);
  const std::vector<PushItem> items = {
      {"w", std::as_bytes(std::span<const char>(weights.data(), weights.size()))}};
  ASSERT_TRUE(client->UploadInitialWeights(kJob, items).ok());
  v1::ServeFormat fp32;
  fp32.set_recipe(v1::RECIPE_FP32);
  absl::Status first;
  std::thread waiter([&] {
    Pulled out;
    first = client->Pull({kJob, "w", fp32, 1}, 60s, &out);
  });
  for (int i = 0; i < 2000 && client->Status().value().waiting_pulls() == 0; ++i) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(client->Status().value().waiting_pulls(), 1);
  Pulled out;
  EXPECT_TRUE(testing::HasStatus(client->Pull({kJob, "w", fp32, 1}, 60s, &out),
                                 absl::StatusCode::kResourceExhausted, "max_waiting_pulls"));
  EXPECT_TRUE(client->Pull({kJob, "w", fp32, 0}, 60s, &out).ok());  // published: no wait
  EXPECT_EQ(out.header.version(), 0);
  capped->Shutdown();  // the waiting pull ends (the daemon drains)
  waiter.join();
  EXPECT_TRUE(testing::HasStatus(first, absl::StatusCode::kUnavailable, "draining"));
}

// SIGTERM runs Server::Shutdown: the daemon drains, its steps run, and a pull still waiting for a
// version no step will publish ends UNAVAILABLE saying so (not CANCELLED by gRPC's shutdown).
TEST_F(HostileInputTest, AtShutdownAPullWaitingForAVersionEndsUnavailableSayingTheDaemonDrains) {
  absl::Status pulled;
  absl::Notification started;
  std::thread puller([&] {
    Pulled out;
    started.Notify();
    v1::ServeFormat fp32;
    fp32.set_recipe(v1::RECIPE_FP32);
    pulled = client_->Pull({kJob, "w", fp32, 1}, 60s, &out);
  });
  started.WaitForNotification();
  // The pull is waiting once the daemon counts it.
  for (int i = 0; i < 2000 && client_->Status().value().waiting_pulls() == 0; ++i) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(client_->Status().value().waiting_pulls(), 1);
  const auto start = std::chrono::steady_clock::now();
  server_->Shutdown();
  puller.join();
  EXPECT_TRUE(testing::HasStatus(pulled, absl::StatusCode::kUnavailable, "draining"));
  EXPECT_EQ(ReasonOf(pulled), v1::ERROR_REASON_DRAINING);  // what the client does not retry
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s) << "the pull was left to gRPC's deadline";
}

}  // namespace
}  // namespace paramd
