// Served formats over real RPCs (DESIGN.md §3, §5): a real paramd::Server on 127.0.0.1 port 0 and
// paramd::Client. A Pull of mxfp8 (rowwise and columnwise), fp8_block columnwise and fp8_tensor
// (both directions) answers a header whose scale_type, scale_shape, scale_bytes and data_bytes are
// kernels::ServeLayout's, then the data and the scales after it: together the backend's served
// bytes of that version, and the independent reference's. A step with a non-finite gradient is
// reported as `skipped` in the PullHeader of the version it publishes.
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
#include <vector>

#include "client/client.h"
#include "kernels/recipes.h"
#include "paramd/v1/data.grpc.pb.h"
#include "server/backend/backend.h"
#include "server/rpc/server.h"
#include "tests/unit/server/policy_reference_job.h"
#include "tests/unit/server/reference_job.h"

namespace paramd {
namespace {

using namespace std::chrono_literals;
using testing::BitIdentical;
using testing::ForRank;
using testing::FromBytes;
using testing::MakeSpec;
using testing::PolicyReferenceJob;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::StepGradients;
using testing::ToBytes;

constexpr char kJob[] = "formats";
constexpr int64_t kPullChunkBytes = 4096;

struct Served {
  v1::Recipe recipe;
  v1::Direction direction;
};
constexpr Served kFormats[] = {
    {v1::RECIPE_MXFP8, v1::DIRECTION_ROWWISE},
    {v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE},
    {v1::RECIPE_FP8_BLOCK, v1::DIRECTION_COLUMNWISE},
    {v1::RECIPE_FP8_TENSOR, v1::DIRECTION_ROWWISE},
    {v1::RECIPE_FP8_TENSOR, v1::DIRECTION_COLUMNWISE},
};

v1::ServeFormat Format(v1::Recipe recipe, v1::Direction direction) {
  v1::ServeFormat f;
  f.set_recipe(recipe);
  f.set_direction(direction);
  return f;
}

// Two ranks; several 128-row panels with a partial one, a 1-D tensor with a partial mxfp8 block,
// one element; fp8 exp_avg and fp16 exp_avg_sq.
v1::RegisterRequest Spec() {
  v1::RegisterRequest spec = MakeSpec(kJob, 2,
                                      {{"w", 131, 257, v1::ELEMENT_TYPE_FP32},
                                       {"b", 1, 1000, v1::ELEMENT_TYPE_BF16},
                                       {"s", 1, 1, v1::ELEMENT_TYPE_FP32}});
  spec.mutable_state_policy()->set_exp_avg(v1::MOMENT_TYPE_FP8);
  spec.mutable_state_policy()->set_exp_avg_sq(v1::MOMENT_TYPE_FP16);
  spec.clear_serve();
  for (const Served& f : kFormats) *spec.add_serve() = Format(f.recipe, f.direction);
  return spec;
}

v1::DaemonConfig TestConfig() {
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_step_threads(2);
  config.set_max_chunk_bytes(1 << 16);
  config.set_pull_chunk_bytes(kPullChunkBytes);  // pulls span many chunks, scales included
  config.set_log_level("error");
  return config;
}

std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

std::vector<uint8_t> Bytes(const std::vector<std::byte>& data) {
  std::vector<uint8_t> out(data.size());
  if (!data.empty()) std::memcpy(out.data(), data.data(), data.size());
  return out;
}

class ServedFormatsTest : public ::testing::Test {
 protected:
  ServedFormatsTest()
      : spec_(Spec()), initial_(RandomWeights(spec_, 23)), reference_(spec_, initial_) {}

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(TestConfig());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
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
    }
    std::vector<std::string> weights;
    for (const std::vector<float>& w : initial_) weights.push_back(ToBytes(w));
    const absl::Status uploaded = client_->UploadInitialWeights(kJob, Items(weights));
    ASSERT_TRUE(uploaded.ok()) << uploaded;
  }

  std::vector<PushItem> Items(const std::vector<std::string>& per_tensor) const {
    std::vector<PushItem> items;
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      items.push_back({spec_.tensors(i).name(), AsBytes(per_tensor[static_cast<size_t>(i)])});
    }
    return items;
  }

  // Every rank pushes and commits `step`.
  void RunStep(int64_t step, const StepGradients& grads) {
    for (int r = 0; r < spec_.world_size(); ++r) {
      std::vector<std::string> mine;
      for (int i = 0; i < spec_.tensors_size(); ++i) mine.push_back(grads[i][r]);
      const absl::Status pushed = client_->PushGradients(kJob, r, step, Items(mine));
      ASSERT_TRUE(pushed.ok()) << pushed;
    }
    for (int r = 0; r < spec_.world_size(); ++r) {
      absl::StatusOr<v1::CommitResponse> committed =
          client_->Commit(kJob, r, step, std::nullopt, 0.5);
      ASSERT_TRUE(committed.ok()) << committed.status();
    }
  }

  // The backend's bytes of `version` of a tensor in one format (the version must be the newest).
  std::vector<uint8_t> BackendBytes(int tensor, int64_t version, const Served& f) {
    absl::StatusOr<std::shared_ptr<Job>> job = server_->daemon().registry().Find(kJob);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {};
    std::shared_ptr<const ServedTensor> served = (*job)->Served(tensor, version);
    if (served == nullptr || served->version != version) {
      ADD_FAILURE() << "version " << version << " is not the newest";
      return {};
    }
    const ServedFormat* format = served->Find(FormatKey{f.recipe, f.direction});
    return format == nullptr ? std::vector<uint8_t>() : format->bytes.ToVector();
  }

  // Pulls every format of every tensor at `version` and checks header, bytes and reference.
  void ExpectPullsMatch(int64_t version, bool skipped) {
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      const v1::TensorSpec& t = spec_.tensors(i);
      for (const Served& f : kFormats) {
        SCOPED_TRACE(::testing::Message()
                     << t.name() << " " << v1::Recipe_Name(f.recipe) << "/"
                     << v1::Direction_Name(f.direction) << " version " << version);
        Pulled pulled;
        const absl::Status status =
            client_->Pull({kJob, t.name(), Format(f.recipe, f.direction), version}, 20s, &pulled);
        ASSERT_TRUE(status.ok()) << status;
        const v1::PullHeader& h = pulled.header;
        const kernels::ServeBufferLayout layout = kernels::ServeLayout(
            KernelRecipe(f.recipe), KernelDirection(f.direction), t.rows(), t.cols());
        EXPECT_EQ(h.version(), version);
        EXPECT_EQ(h.skipped(), skipped);
        EXPECT_EQ(h.rows(), t.rows());
        EXPECT_EQ(h.cols(), t.cols());
        EXPECT_EQ(h.format().recipe(), f.recipe);
        EXPECT_EQ(h.format().direction(), f.direction);
        EXPECT_EQ(h.data_bytes(), layout.data_bytes);
        EXPECT_EQ(h.data_bytes(), t.rows() * t.cols());  // one E4M3 byte per element
        EXPECT_EQ(h.scale_bytes(), layout.scale_bytes);
        EXPECT_EQ(h.scale_type(),
                  f.recipe == v1::RECIPE_MXFP8 ? v1::SCALE_TYPE_E8M0 : v1::SCALE_TYPE_FP32_INV);
        ASSERT_EQ(h.scale_shape_size(), 2);
        EXPECT_EQ(h.scale_shape(0), layout.scale_rows);
        EXPECT_EQ(h.scale_shape(1), layout.scale_cols);
        EXPECT_EQ(h.scale_bytes(),
                  h.scale_shape(0) * h.scale_shape(1) * (f.recipe == v1::RECIPE_MXFP8 ? 1 : 4));
        // The shapes data.proto documents.
        auto ceil = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
        if (f.recipe == v1::RECIPE_MXFP8 && f.direction == v1::DIRECTION_ROWWISE) {
          EXPECT_EQ(layout.scale_rows, t.rows());
          EXPECT_EQ(layout.scale_cols, ceil(t.cols(), 32));
        } else if (f.recipe == v1::RECIPE_MXFP8) {
          EXPECT_EQ(layout.scale_rows, ceil(t.rows(), 32));
          EXPECT_EQ(layout.scale_cols, t.cols());
        } else if (f.recipe == v1::RECIPE_FP8_BLOCK) {  // columnwise: transposed
          EXPECT_EQ(layout.scale_rows, ceil(t.cols(), 128));
          EXPECT_EQ(layout.scale_cols, ceil(t.rows(), 128));
        } else {
          EXPECT_EQ(layout.scale_count, 1);
        }
        const std::vector<uint8_t> bytes = Bytes(pulled.data);
        EXPECT_EQ(static_cast<int64_t>(bytes.size()), h.data_bytes() + h.scale_bytes());
        EXPECT_TRUE(BitIdentical(bytes, BackendBytes(i, version, f)));
        EXPECT_TRUE(BitIdentical(bytes, reference_.Served(i, f.recipe, f.direction)));
      }
    }
  }

  const v1::RegisterRequest spec_;
  const std::vector<std::vector<float>> initial_;
  PolicyReferenceJob reference_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ServedFormatsTest, PullHeadersDescribeTheLayoutAndTheBytesAreTheBackendsDataThenScales) {
  ExpectPullsMatch(0, false);
  for (int64_t step = 0; step < 3; ++step) {
    const StepGradients grads = RandomGradients(spec_, 60 + static_cast<uint64_t>(step));
    RunStep(step, grads);
    ASSERT_TRUE(reference_.Step(grads, std::nullopt, 0.5));
    ExpectPullsMatch(step + 1, false);
  }
}

TEST_F(ServedFormatsTest, APullStreamsTheHeaderThenBoundedChunksOfDataThenScales) {
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::Data::Stub> data = v1::Data::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 20s);
  v1::PullRequest request;
  request.set_job(kJob);
  request.set_tensor("w");
  *request.mutable_format() = Format(v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE);
  std::unique_ptr<grpc::ClientReader<v1::PullChunk>> reader = data->Pull(&context, request);
  v1::PullChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  ASSERT_TRUE(chunk.has_header());
  const v1::PullHeader header = chunk.header();
  std::vector<uint8_t> bytes;
  int chunks = 0;
  while (reader->Read(&chunk)) {
    ASSERT_FALSE(chunk.has_header()) << "a second header";
    EXPECT_LE(static_cast<int64_t>(chunk.data().size()), kPullChunkBytes);
    bytes.insert(bytes.end(), chunk.data().begin(), chunk.data().end());
    ++chunks;
  }
  ASSERT_TRUE(reader->Finish().ok());
  const int64_t total = header.data_bytes() + header.scale_bytes();
  EXPECT_EQ(chunks, (total + kPullChunkBytes - 1) / kPullChunkBytes);
  EXPECT_TRUE(
      BitIdentical(bytes, BackendBytes(0, 0, {v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE})));
  // The data, then the scales: the E8M0 codes of the reference after its E4M3 codes.
  const reference::ServedRef want =
      reference::ServeRef(reference::RecipeRef::kMxfp8, true, initial_[0].data(), 131, 257, 1.0f);
  EXPECT_TRUE(BitIdentical(std::vector<uint8_t>(bytes.begin(), bytes.begin() + header.data_bytes()),
                           want.data));
  EXPECT_TRUE(BitIdentical(std::vector<uint8_t>(bytes.begin() + header.data_bytes(), bytes.end()),
                           want.scales));
}

TEST_F(ServedFormatsTest, AStepWithANonFiniteGradientIsReportedSkippedInThePullHeader) {
  const StepGradients g0 = RandomGradients(spec_, 70);
  RunStep(0, g0);
  ASSERT_TRUE(reference_.Step(g0, std::nullopt, 0.5));
  ExpectPullsMatch(1, false);

  StepGradients bad = RandomGradients(spec_, 71);
  std::vector<float> w = FromBytes<float>(bad[0][1]);
  w[4321] = std::numeric_limits<float>::quiet_NaN();
  bad[0][1] = ToBytes(w);
  RunStep(1, bad);
  ASSERT_FALSE(reference_.Step(bad, std::nullopt, 0.5));
  ExpectPullsMatch(2, true);  // version 1's bytes, re-served
  absl::StatusOr<v1::StatusResponse> status = client_->Status(kJob);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->jobs(0).skipped_steps(), 1);
  EXPECT_EQ(status->jobs(0).applied_steps(), 1);

  const StepGradients g2 = RandomGradients(spec_, 72);
  RunStep(2, g2);
  ASSERT_TRUE(reference_.Step(g2, std::nullopt, 0.5));
  ExpectPullsMatch(3, false);
}

}  // namespace
}  // namespace paramd
