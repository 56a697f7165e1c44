// Bad input over real RPCs (DESIGN.md §5): a real paramd::Server on 127.0.0.1 port 0, driven by raw
// gRPC stubs and by paramd::Client. Every case gets its exact gRPC status code and a message that
// names the problem, and changes nothing: the job's Status is as before and a valid step still
// gives the reference weights bit for bit. Also Drain, graceful shutdown and the health service.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#ifdef PARAMD_TEST_HAS_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/match.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "paramd/v1/control.grpc.pb.h"
#include "paramd/v1/data.grpc.pb.h"
#include "server/rpc/server.h"
#include "tests/unit/server/push_chunks.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/status_assertions.h"

#ifdef PARAMD_HAVE_HEALTH_PROTO
#include "grpc/health/v1/health.grpc.pb.h"
#endif

namespace paramd {
namespace {

using namespace std::chrono_literals;
using testing::BitIdentical;
using testing::ForRank;
using testing::MakeSpec;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::ReferenceJob;
using testing::SameStatus;
using testing::StepGradients;
using testing::ToBytes;

constexpr char kJob[] = "rpc";
constexpr int64_t kMaxChunkBytes = 4096;

v1::RegisterRequest Spec() {
  // "w": 1200 fp32 elements, 4800 bytes = two chunks of at most 4096; "b": 100 bf16, 200 bytes.
  return MakeSpec(kJob, 2,
                  {{"w", 4, 300, v1::ELEMENT_TYPE_FP32}, {"b", 1, 100, v1::ELEMENT_TYPE_BF16}});
}

v1::DaemonConfig TestConfig() {
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_step_threads(2);
  config.set_max_chunk_bytes(kMaxChunkBytes);  // max_message_bytes follows: 4096 + 64 KiB
  config.set_pull_chunk_bytes(kMaxChunkBytes);
  config.set_log_level("error");
  return config;
}

Deadline In(std::chrono::milliseconds timeout) {
  return std::chrono::system_clock::now() + timeout;
}

// The gRPC status has `code` and a message containing `text`.
::testing::AssertionResult HasStatus(const grpc::Status& status, grpc::StatusCode code,
                                     absl::string_view text = "") {
  return testing::HasStatus(FromGrpcStatus(status), static_cast<absl::StatusCode>(code), text);
}
template <typename T>
::testing::AssertionResult HasStatus(const absl::StatusOr<T>& result, grpc::StatusCode code,
                                     absl::string_view text = "") {
  return testing::HasStatus(result.status(), static_cast<absl::StatusCode>(code), text);
}
::testing::AssertionResult HasStatus(const absl::Status& status, grpc::StatusCode code,
                                     absl::string_view text = "") {
  return testing::HasStatus(status, static_cast<absl::StatusCode>(code), text);
}

std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

template <typename T>
std::vector<T> Values(const Pulled& pulled) {
  std::vector<T> values(pulled.data.size() / sizeof(T));
  std::memcpy(values.data(), pulled.data.data(), values.size() * sizeof(T));
  return values;
}

v1::ServeFormat Format(v1::Recipe recipe, v1::Direction direction = v1::DIRECTION_ROWWISE) {
  v1::ServeFormat format;
  format.set_recipe(recipe);
  format.set_direction(direction);
  return format;
}

class BadInputTest : public ::testing::Test {
 protected:
  BadInputTest() : spec_(Spec()), initial_(RandomWeights(spec_, 17)), reference_(spec_, initial_) {}

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(TestConfig());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    control_ = v1::Control::NewStub(channel_);
    data_ = v1::Data::NewStub(channel_);
    ClientOptions options;
    options.address = server_->address();
    options.transport = "inline";
    options.rpc_timeout = 20s;
    options.max_attempts = 1;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    for (int r = 0; r < spec_.world_size(); ++r) {
      absl::StatusOr<v1::RegisterResponse> registered = client_->Register(ForRank(spec_, r));
      ASSERT_TRUE(registered.ok()) << registered.status();
      EXPECT_EQ(registered->max_chunk_bytes(), kMaxChunkBytes);
    }
    std::vector<std::string> weights;
    for (const std::vector<float>& w : initial_) weights.push_back(ToBytes(w));
    const absl::Status uploaded = client_->UploadInitialWeights(kJob, Items(weights));
    ASSERT_TRUE(uploaded.ok()) << uploaded;
    before_ = JobStatus();
    ASSERT_EQ(before_.tensors(0).version(), 0);
  }

  std::vector<PushItem> Items(const std::vector<std::string>& per_tensor) const {
    std::vector<PushItem> items;
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      items.push_back({spec_.tensors(i).name(), AsBytes(per_tensor[static_cast<size_t>(i)])});
    }
    return items;
  }
  std::vector<PushItem> Items(const StepGradients& grads, int rank) const {
    std::vector<PushItem> items;
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      items.push_back({spec_.tensors(i).name(), AsBytes(grads[static_cast<size_t>(i)][rank])});
    }
    return items;
  }

  // The gradients every rank pushes at `step`.
  StepGradients Grads(int64_t step) const { return RandomGradients(spec_, 900 + step); }

  // Pushes the chunks on one stream, as a raw stub does, the last one marked so (PushChunk.last).
  grpc::Status RawPush(const std::vector<v1::PushChunk>& chunks, v1::PushResponse* out = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(In(20s));
    v1::PushResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::PushChunk>> writer = data_->Push(&context, &response);
    for (size_t i = 0; i < chunks.size(); ++i) {
      v1::PushChunk chunk = chunks[i];
      chunk.set_last(i + 1 == chunks.size());
      if (!writer->Write(chunk)) break;  // the daemon ended the stream; Finish says why
    }
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    if (out != nullptr) *out = response;
    return status;
  }

  grpc::Status RawCommit(const std::string& job, int rank, int64_t step,
                         std::optional<double> lr = std::nullopt,
                         std::optional<double> grad_scale = std::nullopt) {
    grpc::ClientContext context;
    context.set_deadline(In(20s));
    v1::CommitRequest request;
    request.set_job(job);
    request.set_rank(rank);
    request.set_step(step);
    if (lr) request.set_lr(*lr);
    if (grad_scale) request.set_grad_scale(*grad_scale);
    v1::CommitResponse response;
    return data_->Commit(&context, request, &response);
  }

  grpc::Status RawPull(const std::string& job, const std::string& tensor,
                       const v1::ServeFormat& format, int64_t min_version, Deadline deadline,
                       v1::PullHeader* header = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    v1::PullRequest request;
    request.set_job(job);
    request.set_tensor(tensor);
    *request.mutable_format() = format;
    request.set_min_version(min_version);
    std::unique_ptr<grpc::ClientReader<v1::PullChunk>> reader = data_->Pull(&context, request);
    v1::PullChunk chunk;
    while (reader->Read(&chunk)) {
      if (chunk.has_header() && header != nullptr) *header = chunk.header();
    }
    return reader->Finish();
  }

  grpc::Status RawStatus(const std::string& job, v1::StatusResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(In(20s));
    v1::StatusRequest request;
    request.set_job(job);
    return control_->Status(&context, request, response);
  }

  grpc::Status RawRegister(const v1::RegisterRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(In(20s));
    v1::RegisterResponse response;
    return control_->Register(&context, request, &response);
  }

  // The job's status through the Status RPC, without its timing.
  v1::JobStatus JobStatus() {
    v1::StatusResponse response;
    const grpc::Status status = RawStatus(kJob, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    if (response.jobs_size() != 1) {
      ADD_FAILURE() << "Status lists " << response.jobs_size() << " jobs";
      return v1::JobStatus();
    }
    v1::JobStatus job = response.jobs(0);
    job.clear_last_step_seconds();
    return job;
  }

  // Every rank pushes and commits the next step through paramd::Client; the pulled weights equal
  // the reference's bit for bit.
  void RunValidStep(std::optional<double> lr = std::nullopt,
                    std::optional<double> grad_scale = std::nullopt) {
    const int64_t step = JobStatus().next_step();
    const StepGradients grads = Grads(step);
    for (int r = 0; r < spec_.world_size(); ++r) {
      const absl::Status pushed = client_->PushGradients(kJob, r, step, Items(grads, r));
      ASSERT_TRUE(pushed.ok()) << pushed;
    }
    for (int r = 0; r < spec_.world_size(); ++r) {
      absl::StatusOr<v1::CommitResponse> committed = client_->Commit(kJob, r, step, lr, grad_scale);
      ASSERT_TRUE(committed.ok()) << committed.status();
    }
    reference_.Step(grads, lr, grad_scale.value_or(1.0));
    Pulled w, b;
    absl::Status pulled = client_->Pull({kJob, "w", Format(v1::RECIPE_FP32), step + 1}, 20s, &w);
    ASSERT_TRUE(pulled.ok()) << pulled;
    pulled = client_->Pull({kJob, "b", Format(v1::RECIPE_BF16), step + 1}, 20s, &b);
    ASSERT_TRUE(pulled.ok()) << pulled;
    EXPECT_EQ(w.header.version(), step + 1);
    EXPECT_TRUE(BitIdentical(Values<float>(w), reference_.master(0)));
    EXPECT_TRUE(BitIdentical(Values<uint16_t>(b), reference_.Bf16(1)));
    before_ = JobStatus();
  }

  // After a rejected call: the Status RPC shows the job as before, and valid steps still work.
  void ExpectUnchangedAndStepsStillWork(std::optional<double> lr = std::nullopt,
                                        std::optional<double> grad_scale = std::nullopt) {
    EXPECT_TRUE(SameStatus(JobStatus(), before_));
    RunValidStep(lr, grad_scale);
    RunValidStep();
  }

  const v1::RegisterRequest spec_;
  const std::vector<std::vector<float>> initial_;
  ReferenceJob reference_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Control::Stub> control_;
  std::unique_ptr<v1::Data::Stub> data_;
  std::unique_ptr<Client> client_;
  v1::JobStatus before_;
};

constexpr auto kNotFound = grpc::StatusCode::NOT_FOUND;
constexpr auto kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
constexpr auto kFailedPrecondition = grpc::StatusCode::FAILED_PRECONDITION;
constexpr auto kResourceExhausted = grpc::StatusCode::RESOURCE_EXHAUSTED;
constexpr auto kUnavailable = grpc::StatusCode::UNAVAILABLE;

TEST_F(BadInputTest, UnknownJobIsNotFoundOnEveryRpc) {
  constexpr char kMessage[] = "no job \"nope\" on this daemon";
  EXPECT_TRUE(HasStatus(RawPush({testing::ChunkOf("nope", 0, 0, "w", 0, std::string(4, 'x'))}),
                        kNotFound, kMessage));
  EXPECT_TRUE(HasStatus(RawCommit("nope", 0, 0), kNotFound, kMessage));
  EXPECT_TRUE(
      HasStatus(RawPull("nope", "w", Format(v1::RECIPE_FP32), 0, In(20s)), kNotFound, kMessage));
  v1::SetHyperparamsRequest hyper;
  hyper.set_job("nope");
  hyper.set_lr(1e-2);
  EXPECT_TRUE(HasStatus(client_->SetHyperparams(hyper), kNotFound, kMessage));
  EXPECT_TRUE(HasStatus(client_->GetLayout("nope"), kNotFound, kMessage));
  const std::string grad(16, 'x');
  const PushItem item{"w", AsBytes(grad)};
  EXPECT_TRUE(
      HasStatus(client_->PushGradients("nope", 0, 0, std::span(&item, 1)), kNotFound, kMessage));
  EXPECT_TRUE(HasStatus(client_->Commit("nope", 0, 0), kNotFound, kMessage));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, StatusOfAnUnknownJobIsNotFound) {
  v1::StatusResponse response;
  EXPECT_TRUE(HasStatus(RawStatus("nope", &response), kNotFound, "no job \"nope\""));
  EXPECT_TRUE(HasStatus(client_->Status("nope"), kNotFound, "no job \"nope\""));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, UnknownTensorIsNotFound) {
  EXPECT_TRUE(HasStatus(RawPush({testing::ChunkOf(kJob, 0, 0, "nope", 0, std::string(4, 'x'))}),
                        kNotFound, "job \"rpc\" has no tensor \"nope\""));
  EXPECT_TRUE(HasStatus(RawPull(kJob, "nope", Format(v1::RECIPE_FP32), 0, In(20s)), kNotFound,
                        "has no tensor \"nope\""));
  Pulled pulled;
  EXPECT_TRUE(HasStatus(client_->Pull({kJob, "nope", Format(v1::RECIPE_FP32), 0}, 20s, &pulled),
                        kNotFound, "has no tensor \"nope\""));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, ReRegistrationWithAnotherDescriptionIsFailedPrecondition) {
  v1::RegisterRequest shape = ForRank(spec_, 1);
  shape.mutable_tensors(0)->set_rows(5);
  EXPECT_TRUE(HasStatus(RawRegister(shape), kFailedPrecondition,
                        "job \"rpc\" is already registered with a different description"));
  v1::RegisterRequest dtype = ForRank(spec_, 1);
  dtype.mutable_tensors(1)->set_grad_type(v1::ELEMENT_TYPE_FP32);
  EXPECT_TRUE(HasStatus(client_->Register(dtype), kFailedPrecondition, "different description"));
  v1::RegisterRequest world = ForRank(spec_, 0);
  world.set_world_size(3);
  EXPECT_TRUE(HasStatus(RawRegister(world), kFailedPrecondition, "different description"));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, InvalidRegistrationIsRefusedAndCreatesNoJob) {
  v1::RegisterRequest dtype = MakeSpec("other", 1, {{"w", 2, 2, v1::ELEMENT_TYPE_UNSPECIFIED}});
  EXPECT_TRUE(HasStatus(RawRegister(dtype), kInvalid, "tensor \"w\" needs grad_type"));
  // Every policy and serve format is supported; stochastic rounding of an FP32 moment is not a
  // thing, nor is an amax history on a recipe without one.
  v1::RegisterRequest rounding = MakeSpec("other", 1, {{"w", 2, 2, v1::ELEMENT_TYPE_FP32}});
  rounding.mutable_state_policy()->set_exp_avg_sq_rounding(v1::ROUNDING_STOCHASTIC);
  EXPECT_TRUE(
      HasStatus(RawRegister(rounding), kInvalid, "exp_avg_sq is FP32, which is not rounded"));
  v1::RegisterRequest history = MakeSpec("other", 1, {{"w", 2, 2, v1::ELEMENT_TYPE_FP32}});
  v1::ServeFormat* mxfp8 = history.add_serve();
  mxfp8->set_recipe(v1::RECIPE_MXFP8);
  mxfp8->set_amax_history(4);
  EXPECT_TRUE(HasStatus(client_->Register(history), kInvalid,
                        "serve RECIPE_MXFP8 takes no amax_history or margin"));
  v1::StatusResponse response;
  ASSERT_TRUE(RawStatus("", &response).ok());
  EXPECT_EQ(response.jobs_size(), 1);
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, WrongByteCountOrDtypeIsInvalidArgument) {
  EXPECT_TRUE(HasStatus(RawPush({testing::ChunkOf(kJob, 0, 0, "w", 0, std::string(6, 'x'))}),
                        kInvalid,
                        "multiples of 4 bytes inside the tensor (tensor \"w\", rank 0, step 0)"));
  // A bf16 tensor's gradient sent as fp32: twice its bytes.
  const std::string fp32_grad = ToBytes(std::vector<float>(100, 1.0f));
  EXPECT_TRUE(HasStatus(RawPush({testing::ChunkOf(kJob, 1, 0, "b", 0, fp32_grad)}), kInvalid,
                        "chunk [0, 400) does not fit tensor \"b\" of 200 bytes"));
  EXPECT_TRUE(HasStatus(RawPush({testing::ChunkOf(kJob, 0, 0, "w", 2, std::string(4, 'x'))}),
                        kInvalid, "chunk [2, 6) does not fit"));
  EXPECT_TRUE(HasStatus(RawPush({testing::ChunkOf(kJob, 0, 0, "w", 4796, std::string(8, 'x'))}),
                        kInvalid, "chunk [4796, 4804) does not fit tensor \"w\" of 4800 bytes"));
  const PushItem item{"b", AsBytes(fp32_grad)};
  EXPECT_TRUE(HasStatus(client_->PushGradients(kJob, 1, 0, std::span(&item, 1)), kInvalid,
                        "does not fit tensor \"b\""));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, ChunksBeforeTheFirstBadOneStayStored) {
  const StepGradients grads = Grads(0);
  const std::string& w = grads[0][0];
  EXPECT_TRUE(HasStatus(RawPush({testing::ChunkOf(kJob, 0, 0, "w", 0, w.substr(0, 4096)),
                                 testing::ChunkOf(kJob, 0, 0, "nope", 0, std::string(4, 'x')),
                                 testing::ChunkOf(kJob, 0, 0, "w", 4096, w.substr(4096))}),
                        kNotFound, "\"nope\""));
  v1::PushResponse response;
  ASSERT_TRUE(RawPush({testing::ChunkOf(kJob, 0, 0, "w", 0, w.substr(0, 4096)),
                       testing::ChunkOf(kJob, 0, 0, "w", 4096, w.substr(4096))},
                      &response)
                  .ok());
  EXPECT_EQ(response.chunks_duplicate(), 1);  // stored by the failed stream
  EXPECT_EQ(response.chunks_stored(), 1);     // never reached by it
  before_ = JobStatus();
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, ConflictingDuplicatePushIsFailedPrecondition) {
  // The first chunk the client sends for rank 0's "w" at step 0, sent twice, then changed.
  const std::string right = Grads(0)[0][0].substr(0, kMaxChunkBytes);
  v1::PushResponse response;
  ASSERT_TRUE(RawPush({testing::ChunkOf(kJob, 0, 0, "w", 0, right),
                       testing::ChunkOf(kJob, 0, 0, "w", 0, right)},
                      &response)
                  .ok());
  EXPECT_EQ(response.chunks_stored(), 1);
  EXPECT_EQ(response.chunks_duplicate(), 1);
  before_ = JobStatus();
  std::string wrong = right;
  wrong[7] ^= 0x40;
  EXPECT_TRUE(HasStatus(RawPush({testing::ChunkOf(kJob, 0, 0, "w", 0, wrong)}), kFailedPrecondition,
                        "a different chunk of 4096 bytes at offset 0 was already pushed"));
  EXPECT_TRUE(HasStatus(RawPush({testing::ChunkOf(kJob, 0, 0, "w", 2048, right.substr(0, 2048))}),
                        kFailedPrecondition, "overlaps the stored chunk [0, 4096)"));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, StaleAndFutureStepsAreFailedPrecondition) {
  RunValidStep();
  RunValidStep();  // the job collects step 2
  const std::string grad(8, 'x');
  EXPECT_TRUE(HasStatus(RawPush({testing::ChunkOf(kJob, 0, 1, "w", 0, grad)}), kFailedPrecondition,
                        "step 1 of job \"rpc\" is stale: the job collects step 2"));
  EXPECT_TRUE(HasStatus(RawPush({testing::ChunkOf(kJob, 1, 3, "w", 0, grad)}), kFailedPrecondition,
                        "step 3 of job \"rpc\" is ahead of the step it collects (2)"));
  EXPECT_TRUE(HasStatus(RawCommit(kJob, 0, 3), kFailedPrecondition,
                        "step 3 of job \"rpc\" is ahead of the step it collects (2)"));
  EXPECT_TRUE(HasStatus(RawCommit(kJob, 1, 0), kFailedPrecondition,
                        "step 0 of job \"rpc\" is stale: the job collects step 2"));
  EXPECT_TRUE(HasStatus(client_->Commit(kJob, 0, 0), kFailedPrecondition, "is stale"));
  // The last step taken may be retried: acknowledged, nothing more.
  EXPECT_TRUE(RawCommit(kJob, 1, 1).ok());
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, CommitBeforeAllChunksIsFailedPrecondition) {
  const StepGradients grads = Grads(0);
  const PushItem only_w{"w", AsBytes(grads[0][0])};
  ASSERT_TRUE(client_->PushGradients(kJob, 0, 0, std::span(&only_w, 1)).ok());
  before_ = JobStatus();
  EXPECT_TRUE(HasStatus(client_->Commit(kJob, 0, 0), kFailedPrecondition,
                        "rank 0 commits step 0 but tensor \"b\" has 0 of 200 gradient bytes"));
  EXPECT_TRUE(HasStatus(RawCommit(kJob, 1, 0), kFailedPrecondition,
                        "tensor \"w\" has 0 of 4800 gradient bytes"));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, RanksDisagreeingOnLrOrGradScaleAreInvalidArgument) {
  const StepGradients grads = Grads(0);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(client_->PushGradients(kJob, r, 0, Items(grads, r)).ok());
  ASSERT_TRUE(client_->Commit(kJob, 0, 0, 2e-3, 0.5).ok());
  before_ = JobStatus();
  ASSERT_EQ(before_.committed_ranks_size(), 1);
  EXPECT_TRUE(HasStatus(RawCommit(kJob, 1, 0, 3e-3, 0.5), kInvalid,
                        "rank 1 commits step 0 with lr 0.003 and grad_scale 0.5 but rank 0 "
                        "committed lr 0.002 and grad_scale 0.5; every rank must send the same"));
  EXPECT_TRUE(HasStatus(client_->Commit(kJob, 1, 0, 2e-3, 0.25), kInvalid,
                        "grad_scale 0.25 but rank 0 committed lr 0.002 and grad_scale 0.5"));
  EXPECT_TRUE(HasStatus(RawCommit(kJob, 1, 0), kInvalid, "with lr none and grad_scale 1"));
  ExpectUnchangedAndStepsStillWork(2e-3, 0.5);
}

TEST_F(BadInputTest, BadCommitScalarsAndHyperparamsAreInvalidArgument) {
  EXPECT_TRUE(HasStatus(RawCommit(kJob, 0, 0, -1.0), kInvalid, "lr = -1 must be finite and > 0"));
  EXPECT_TRUE(HasStatus(RawCommit(kJob, 0, 0, std::nullopt, 0.0), kInvalid,
                        "grad_scale = 0 must be finite and > 0"));
  v1::SetHyperparamsRequest hyper;
  hyper.set_job(kJob);
  hyper.set_lr(std::numeric_limits<double>::infinity());
  EXPECT_TRUE(HasStatus(client_->SetHyperparams(hyper), kInvalid, "lr = inf"));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, InitialWeightsReuploadedWithOtherBytesAreFailedPrecondition) {
  std::vector<std::string> weights;
  for (const std::vector<float>& w : initial_) weights.push_back(ToBytes(w));
  ASSERT_TRUE(client_->UploadInitialWeights(kJob, Items(weights)).ok());  // a retry: no effect
  weights[0][11] ^= 1;
  EXPECT_TRUE(HasStatus(client_->UploadInitialWeights(kJob, Items(weights)), kFailedPrecondition,
                        "initial weights of tensor \"w\" were already uploaded"));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, NonFiniteInitialWeightsAreInvalidArgument) {
  v1::RegisterRequest fresh = MakeSpec("fresh", 1, {{"w", 1, 8, v1::ELEMENT_TYPE_FP32}});
  ASSERT_TRUE(RawRegister(fresh).ok());
  std::vector<float> w(8, 0.5f);
  w[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(HasStatus(
      RawPush({testing::ChunkOf("fresh", 0, 0, "w", 0, ToBytes(w), v1::PUSH_KIND_INITIAL_WEIGHTS)}),
      kInvalid, "initial weight 3 of tensor \"w\" is nan"));
  v1::StatusResponse response;
  ASSERT_TRUE(RawStatus("fresh", &response).ok());
  EXPECT_EQ(response.jobs(0).tensors(0).version(), -1);
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, OversizedChunkIsResourceExhausted) {
  EXPECT_TRUE(HasStatus(
      RawPush({testing::ChunkOf(kJob, 0, 0, "w", 0, std::string(2 * kMaxChunkBytes, 'x'))}),
      kResourceExhausted, "chunk of 8192 bytes exceeds this daemon's max_chunk_bytes (4096)"));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, OversizedMessageIsResourceExhaustedByGrpc) {
  // Beyond max_message_bytes (4096 + 64 KiB): gRPC refuses the message before the service sees it.
  EXPECT_TRUE(
      HasStatus(RawPush({testing::ChunkOf(kJob, 0, 0, "w", 0, std::string(128 << 10, 'x'))}),
                kResourceExhausted, "larger than max"));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, PullOfAnUnservedFormatIsInvalidArgument) {
  EXPECT_TRUE(HasStatus(RawPull(kJob, "w", Format(v1::RECIPE_FP16), 0, In(20s)), kInvalid,
                        "job \"rpc\" does not serve fp16; it serves bf16, fp32"));
  Pulled pulled;
  EXPECT_TRUE(
      HasStatus(client_->Pull({kJob, "w", Format(v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE), 0},
                              20s, &pulled),
                kInvalid, "does not serve mxfp8/columnwise"));
  ExpectUnchangedAndStepsStillWork();
}

TEST_F(BadInputTest, PullWaitsForItsVersionUntilTheDeadline) {
  EXPECT_TRUE(HasStatus(RawPull(kJob, "w", Format(v1::RECIPE_FP32), 1, In(100ms)),
                        grpc::StatusCode::DEADLINE_EXCEEDED));
  Pulled pulled;
  EXPECT_TRUE(HasStatus(client_->Pull({kJob, "b", Format(v1::RECIPE_BF16), 1}, 100ms, &pulled),
                        grpc::StatusCode::DEADLINE_EXCEEDED));
  // A pull that waits gets the version once it is published (or at once if it already is).
  v1::PullHeader header;
  grpc::Status waited;
  std::thread puller(
      [&] { waited = RawPull(kJob, "w", Format(v1::RECIPE_BF16), 1, In(20s), &header); });
  ExpectUnchangedAndStepsStillWork();
  puller.join();
  EXPECT_TRUE(waited.ok()) << waited.error_message();
  EXPECT_GE(header.version(), 1);
  EXPECT_EQ(header.data_bytes(), 2 * 1200);
}

TEST_F(BadInputTest, DrainMakesEveryNewWorkCallUnavailable) {
  ASSERT_TRUE(client_->Drain().ok());
  constexpr char kDraining[] = "the daemon is draining";
  EXPECT_TRUE(HasStatus(RawRegister(ForRank(spec_, 0)), kUnavailable, kDraining));
  EXPECT_TRUE(HasStatus(client_->Register(ForRank(spec_, 1)), kUnavailable, kDraining));
  EXPECT_TRUE(
      HasStatus(RawPush({testing::ChunkOf(kJob, 0, 0, "w", 0, Grads(0)[0][0].substr(0, 64))}),
                kUnavailable, kDraining));
  const StepGradients grads = Grads(0);
  EXPECT_TRUE(
      HasStatus(client_->PushGradients(kJob, 1, 0, Items(grads, 1)), kUnavailable, kDraining));
  EXPECT_TRUE(HasStatus(RawCommit(kJob, 0, 0), kUnavailable, kDraining));
  EXPECT_TRUE(HasStatus(client_->Commit(kJob, 1, 0), kUnavailable, kDraining));
  EXPECT_TRUE(
      HasStatus(RawPull(kJob, "w", Format(v1::RECIPE_FP32), 0, In(20s)), kUnavailable, kDraining));
  v1::SetHyperparamsRequest hyper;
  hyper.set_job(kJob);
  hyper.set_lr(1e-2);
  EXPECT_TRUE(HasStatus(client_->SetHyperparams(hyper), kUnavailable, kDraining));
  // Status still answers (operators watch a draining daemon) and shows nothing changed.
  v1::StatusResponse response;
  ASSERT_TRUE(RawStatus("", &response).ok());
  EXPECT_TRUE(response.draining());
  EXPECT_TRUE(SameStatus(JobStatus(), before_));
  EXPECT_TRUE(client_->Drain().ok());  // idempotent
}

TEST_F(BadInputTest, ShutdownCompletesACommittedStepBeforeStopping) {
  const StepGradients grads = Grads(0);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(client_->PushGradients(kJob, r, 0, Items(grads, r)).ok());
  ASSERT_TRUE(client_->Commit(kJob, 0, 0).ok());
  absl::StatusOr<v1::CommitResponse> last = client_->Commit(kJob, 1, 0);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->step_started());
  server_->Shutdown();

  absl::StatusOr<std::shared_ptr<Job>> job = server_->daemon().registry().Find(kJob);
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::JobStatus status = (*job)->Status();
  EXPECT_EQ(status.applied_steps(), 1);
  for (const v1::TensorStatus& t : status.tensors()) EXPECT_EQ(t.version(), 1) << t.name();
  reference_.Step(grads, std::nullopt, 1.0);
  std::shared_ptr<const ServedTensor> served = (*job)->Served(0, 1);
  ASSERT_NE(served, nullptr);
  const HostBuffer* bytes = &served->Find(FormatKey{})->bytes;
  std::vector<float> master(bytes->size() / sizeof(float));
  std::memcpy(master.data(), bytes->data(), bytes->size());
  EXPECT_TRUE(BitIdentical(master, reference_.master(0)));
  EXPECT_TRUE(HasStatus(client_->Status(), kUnavailable));  // the port is closed
}

TEST_F(BadInputTest, HealthServiceAnswersServingUntilDrained) {
#ifdef PARAMD_HAVE_HEALTH_PROTO
  std::unique_ptr<grpc::health::v1::Health::Stub> health =
      grpc::health::v1::Health::NewStub(channel_);
  auto check = [&](grpc::health::v1::HealthCheckResponse::ServingStatus want) {
    grpc::ClientContext context;
    context.set_deadline(In(20s));
    grpc::health::v1::HealthCheckRequest request;  // "" = the whole server
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = health->Check(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.status(), want);
  };
  check(grpc::health::v1::HealthCheckResponse::SERVING);
  ASSERT_TRUE(client_->Drain().ok());
  check(grpc::health::v1::HealthCheckResponse::NOT_SERVING);
#else
  GTEST_SKIP() << "grpc/health/v1/health.proto (package grpc-proto) was not found at build time";
#endif
}

TEST(BackendChoiceTest, ACudaBackendThatCannotBeHadStopsTheStartWithAReason) {
  int devices = 0;
#ifdef PARAMD_TEST_HAS_CUDA_RUNTIME
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
#endif
  if (devices > 0) GTEST_SKIP() << "this machine has a GPU: cuda:0 is available here";
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_backend("cuda:0");
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition) << server.status();
  EXPECT_TRUE(absl::StrContains(server.status().message(), "cuda:0")) << server.status();
}

}  // namespace
}  // namespace paramd
