// Control.ExportState / ImportState over real RPCs: two real paramd::Server daemons on 127.0.0.1
// port 0 and paramd::Client. A job trained on daemon A, exported, imported into the same job
// registered on daemon B (no initial weights there) and trained on in both serves bit-identical
// bytes in every format (fp8_tensor and fp8_delayed included) at every version, with fp8 states
// rounded stochastically. Refusals carry the documented status codes and change nothing; chunks
// are bounded both ways.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/client.h"
#include "paramd/v1/control.grpc.pb.h"
#include "server/rpc/server.h"
#include "tests/unit/server/reference_job.h"

namespace paramd {
namespace {

using namespace std::chrono_literals;
using testing::ForRank;
using testing::MakeSpec;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::StepGradients;
using testing::ToBytes;

constexpr char kJob[] = "resume";
constexpr int64_t kMaxChunkBytes = 1 << 16;

v1::ServeFormat Format(v1::Recipe recipe, v1::Direction direction) {
  v1::ServeFormat f;
  f.set_recipe(recipe);
  f.set_direction(direction);
  if (recipe == v1::RECIPE_FP8_DELAYED) f.set_amax_history(4);
  return f;
}

const std::vector<v1::ServeFormat>& Formats() {
  static const std::vector<v1::ServeFormat> formats = {
      Format(v1::RECIPE_FP32, v1::DIRECTION_ROWWISE),
      Format(v1::RECIPE_BF16, v1::DIRECTION_ROWWISE),
      Format(v1::RECIPE_FP8_TENSOR, v1::DIRECTION_ROWWISE),
      Format(v1::RECIPE_FP8_TENSOR, v1::DIRECTION_COLUMNWISE),
      Format(v1::RECIPE_FP8_DELAYED, v1::DIRECTION_ROWWISE),
      Format(v1::RECIPE_MXFP8, v1::DIRECTION_ROWWISE)};
  return formats;
}

// fp8 exp_avg and exp_avg_sq, both rounded stochastically; several panels, a 1-D tensor.
v1::RegisterRequest Spec() {
  v1::RegisterRequest spec = MakeSpec(kJob, 2,
                                      {{"w", 131, 257, v1::ELEMENT_TYPE_FP32},
                                       {"b", 1, 1000, v1::ELEMENT_TYPE_BF16},
                                       {"s", 1, 1, v1::ELEMENT_TYPE_FP32}});
  v1::StatePolicy* p = spec.mutable_state_policy();
  p->set_exp_avg(v1::MOMENT_TYPE_FP8);
  p->set_exp_avg_sq(v1::MOMENT_TYPE_FP8);
  p->set_exp_avg_rounding(v1::ROUNDING_STOCHASTIC);
  p->set_exp_avg_sq_rounding(v1::ROUNDING_STOCHASTIC);
  spec.clear_serve();
  for (const v1::ServeFormat& f : Formats()) *spec.add_serve() = f;
  return spec;
}

v1::DaemonConfig TestConfig() {
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_step_threads(2);
  config.set_max_chunk_bytes(kMaxChunkBytes);
  config.set_log_level("error");
  return config;
}

std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// One daemon and a client that registered every rank of the job.
struct Daemon {
  std::unique_ptr<Server> server;
  std::unique_ptr<Client> client;
};

class StateTransferRpcTest : public ::testing::Test {
 protected:
  StateTransferRpcTest() : spec_(Spec()) {}

  void SetUp() override {
    for (Daemon* d : {&a_, &b_}) {
      absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(TestConfig());
      ASSERT_TRUE(server.ok()) << server.status();
      d->server = *std::move(server);
      ClientOptions options;
      options.address = d->server->address();
      options.transport = "inline";
      options.rpc_timeout = 20s;
      options.max_attempts = 1;
      options.state_chunk_bytes = 5000;  // fields span several chunks
      absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
      ASSERT_TRUE(client.ok()) << client.status();
      d->client = *std::move(client);
      for (int r = 0; r < spec_.world_size(); ++r) {
        absl::StatusOr<v1::RegisterResponse> registered = d->client->Register(ForRank(spec_, r));
        ASSERT_TRUE(registered.ok()) << registered.status();
      }
    }
    std::vector<std::string> weights;
    for (const std::vector<float>& w : RandomWeights(spec_, 31)) weights.push_back(ToBytes(w));
    const absl::Status uploaded = a_.client->UploadInitialWeights(kJob, Items(weights));
    ASSERT_TRUE(uploaded.ok()) << uploaded;
  }

  std::vector<PushItem> Items(const std::vector<std::string>& per_tensor) const {
    std::vector<PushItem> items;
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      items.push_back({spec_.tensors(i).name(), AsBytes(per_tensor[static_cast<size_t>(i)])});
    }
    return items;
  }

  void Push(Daemon& d, int rank, int64_t step, const StepGradients& grads) {
    std::vector<std::string> mine;
    for (int i = 0; i < spec_.tensors_size(); ++i) mine.push_back(grads[i][rank]);
    const absl::Status pushed = d.client->PushGradients(kJob, rank, step, Items(mine));
    ASSERT_TRUE(pushed.ok()) << pushed;
  }

  void RunStep(Daemon& d, int64_t step, const StepGradients& grads) {
    for (int r = 0; r < spec_.world_size(); ++r) Push(d, r, step, grads);
    for (int r = 0; r < spec_.world_size(); ++r) {
      absl::StatusOr<v1::CommitResponse> committed = d.client->Commit(kJob, r, step, 2e-3, 0.5);
      ASSERT_TRUE(committed.ok()) << committed.status();
    }
  }

  // Every format of every tensor at `version`, pulled: [tensor x format] bytes.
  std::vector<std::vector<std::byte>> PullAll(Daemon& d, int64_t version) {
    std::vector<std::vector<std::byte>> out;
    for (const v1::TensorSpec& t : spec_.tensors()) {
      for (const v1::ServeFormat& f : Formats()) {
        Pulled pulled;
        const absl::Status status = d.client->Pull({kJob, t.name(), f, version}, 20s, &pulled);
        EXPECT_TRUE(status.ok()) << status;
        EXPECT_EQ(pulled.header.version(), version);
        out.push_back(pulled.data);
      }
    }
    return out;
  }

  const v1::RegisterRequest spec_;
  Daemon a_;
  Daemon b_;
};

TEST_F(StateTransferRpcTest, ExportImportThenContinuingIsBitIdenticalAcrossDaemons) {
  for (int64_t step = 0; step < 3; ++step) RunStep(a_, step, RandomGradients(spec_, 40 + step));
  const std::vector<std::vector<std::byte>> at_export = PullAll(a_, 3);

  absl::StatusOr<JobState> state = a_.client->ExportState(kJob);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->job, kJob);
  EXPECT_EQ(state->next_step, 3);
  EXPECT_EQ(state->applied_steps, 3);
  EXPECT_EQ(state->seed, spec_.seed());
  std::vector<std::string> fields_of_s;
  for (const StateField& f : state->fields) {
    int64_t elements = 1;
    for (int64_t d : f.shape) elements *= d;
    EXPECT_EQ(static_cast<int64_t>(f.bytes.size()), elements * ElementTypeBytes(f.type))
        << f.tensor << " " << f.field;
    if (f.tensor == "s") fields_of_s.push_back(f.field);
  }
  const std::vector<std::string> want = {"master",
                                         "exp_avg",
                                         "exp_avg_scales",
                                         "exp_avg_sq",
                                         "exp_avg_sq_scales",
                                         "fp8_tensor_scale",
                                         "fp8_delayed_scale",
                                         "fp8_delayed_history"};
  EXPECT_EQ(fields_of_s, want);

  const absl::Status imported = b_.client->ImportState(*state);
  ASSERT_TRUE(imported.ok()) << imported;
  EXPECT_EQ(PullAll(b_, 3), at_export);
  absl::StatusOr<v1::StatusResponse> status = b_.client->Status(kJob);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->jobs(0).next_step(), 3);
  EXPECT_EQ(status->jobs(0).applied_steps(), 3);

  for (int64_t step = 3; step < 6; ++step) {
    const StepGradients g = RandomGradients(spec_, 40 + step);
    RunStep(a_, step, g);
    RunStep(b_, step, g);
    EXPECT_EQ(PullAll(b_, step + 1), PullAll(a_, step + 1)) << "version " << step + 1;
  }
}

TEST_F(StateTransferRpcTest, RefusedImportsCarryTheirStatusAndChangeNothing) {
  RunStep(a_, 0, RandomGradients(spec_, 50));
  // Step 0 was committed by every rank: the export waits for it if it is still queued.
  absl::StatusOr<JobState> state = a_.client->ExportState(kJob);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->next_step, 1);

  // Unknown job.
  JobState other = *state;
  other.job = "nope";
  EXPECT_EQ(b_.client->ImportState(other).code(), absl::StatusCode::kNotFound);

  // A mismatching field, named.
  JobState bad = *state;
  for (StateField& f : bad.fields) {
    if (f.tensor == "b" && f.field == "exp_avg_sq") f.type = v1::ELEMENT_TYPE_BF16;
  }
  absl::Status refused = b_.client->ImportState(bad);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("field \"exp_avg_sq\" of tensor \"b\""), std::string::npos)
      << refused;

  // A daemon collecting a step: rank 0 pushed on A, so A refuses its own state.
  Push(a_, 0, 1, RandomGradients(spec_, 51));
  refused = a_.client->ImportState(*state);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;

  // Nothing changed on B (no version yet) nor on A (version 1).
  absl::StatusOr<v1::StatusResponse> status = b_.client->Status(kJob);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->jobs(0).tensors(0).version(), -1);
  status = a_.client->Status(kJob);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->jobs(0).tensors(0).version(), 1);
  EXPECT_EQ(status->jobs(0).next_step(), 1);

  // The good state still goes into B.
  ASSERT_TRUE(b_.client->ImportState(*state).ok());
  EXPECT_EQ(PullAll(b_, 1), PullAll(a_, 1));
}

TEST_F(StateTransferRpcTest, ChunksAreBoundedBothWays) {
  auto channel = grpc::CreateChannel(a_.server->address(), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::Control::Stub> control = v1::Control::NewStub(channel);
  std::vector<v1::StateChunk> chunks;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 20s);
    v1::ExportStateRequest request;
    request.set_job(kJob);
    request.set_max_chunk_bytes(1000);
    std::unique_ptr<grpc::ClientReader<v1::StateChunk>> reader =
        control->ExportState(&context, request);
    v1::StateChunk chunk;
    while (reader->Read(&chunk)) chunks.push_back(chunk);
    ASSERT_TRUE(reader->Finish().ok());
  }
  ASSERT_GT(chunks.size(), 2u);
  EXPECT_TRUE(chunks.front().has_header());
  for (size_t i = 1; i < chunks.size(); ++i) {
    EXPECT_FALSE(chunks[i].has_header());
    EXPECT_LE(chunks[i].data().size(), 1000u);
  }
  // An import chunk over the daemon's max_chunk_bytes.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 20s);
  v1::ImportStateResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::StateChunk>> writer =
      control->ImportState(&context, &response);
  v1::StateChunk big = chunks[1];
  big.set_data(std::string(kMaxChunkBytes + 1, '\0'));
  writer->Write(chunks.front());
  writer->Write(big);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
}

}  // namespace
}  // namespace paramd
