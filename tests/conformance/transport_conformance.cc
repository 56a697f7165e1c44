#include "tests/conformance/transport_conformance.h"

#include <grpcpp/create_channel.h>

#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "common/grpc_status.h"
#include "reference/adamw_reference.h"
#include "tests/integration/http_get.h"

namespace paramd::testing {
namespace {

std::vector<float> Floats(const Pulled& pulled) {
  std::vector<float> v(pulled.data.size() / sizeof(float));
  std::memcpy(v.data(), pulled.data.data(), pulled.data.size());
  return v;
}

}  // namespace

// nccl: the daemon in a process of its own, on GPU 1 where there are two (PARAMD_NCCL_TEST_BACKEND,
// set by the nccl suite's binary), else on this process's GPU 0, each process another host to
// NCCL (NCCL_HOSTID) so that it takes two ranks on one GPU, talking over loopback sockets.
void TransportConformanceTest::StartDaemonProcess(const std::string& listen) {
  const char* backend = std::getenv("PARAMD_NCCL_TEST_BACKEND");
  const std::string on = backend != nullptr ? backend : "cuda:1";
  std::vector<std::string> env;
  if (on == "cuda:0") {
    setenv("NCCL_HOSTID", "paramd-conformance-trainer", 0);
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    env = {"NCCL_HOSTID=paramd-conformance-daemon", "NCCL_SOCKET_IFNAME=lo"};
  }
  const std::string config = ::testing::TempDir() + "/nccl_daemon.textproto";
  std::ofstream(config) << "max_chunk_bytes: " << kChunkBytes << "\n";
  // Its metrics on a port chosen here: a process does not tell which one it bound.
  const std::string metrics = FreeLoopbackAddress();
  process_ = std::make_unique<DaemonProcess>(
      ParamdBinary(PARAMD_BINARY), ::testing::TempDir(),
      std::vector<std::string>{"--config=" + config, "--listen=" + listen, "--backend=" + on,
                               "--step_threads=2", "--metrics_listen=" + metrics},
      env);
  address_ = process_->address();
  metrics_address_ = metrics;
}

void TransportConformanceTest::SetUp() {
  if (GetParam() == "nccl") {
    StartDaemonProcess("127.0.0.1:0");
    if (address_.empty()) {
      GTEST_SKIP() << "transport nccl needs a daemon on a cuda:N backend in a process of its own, "
                      "which did not start here (no GPU, or no paramd binary)";
    }
    Connect();
    return;
  }
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");  // a test that reads it restarts the daemon with it
  config.set_step_threads(2);
  config.set_max_chunk_bytes(kChunkBytes);
  config.set_log_level("warning");
  // cuda_ipc needs a daemon on a GPU; where none can start there, the test skips with the reason.
  const bool gpu = GetParam() == "cuda_ipc";
  if (gpu) config.set_backend("cuda:0");
  config_ = config;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  if (gpu && !server.ok()) {
    GTEST_SKIP() << "transport " << GetParam() << " needs a daemon on cuda:0: " << server.status();
  }
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  address_ = server_->address();
  metrics_address_ = server_->metrics_address();
  Connect();
}

void TransportConformanceTest::Connect() {
  channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  control_ = v1::Control::NewStub(channel_);
  data_ = v1::Data::NewStub(channel_);
  TransportContext context{channel_, kChunkBytes};
  for (const TransportEntry& entry : Transports()) {
    if (entry.name != GetParam()) continue;
    if (std::string why = entry.why_not_viable(context); !why.empty()) {
      GTEST_SKIP() << "transport " << GetParam() << " is not viable here: " << why;
    }
    absl::StatusOr<std::unique_ptr<Transport>> transport = entry.make(context);
    ASSERT_TRUE(transport.ok()) << transport.status();
    transport_ = *std::move(transport);
  }
  ASSERT_NE(transport_, nullptr) << "no transport named " << GetParam();
  hyper_.set_lr(1e-2);
  hyper_.set_beta1(0.9);
  hyper_.set_beta2(0.999);
  hyper_.set_eps(1e-8);
  hyper_.set_weight_decay(0.01);
}

void TransportConformanceTest::TearDown() {
  transport_.reset();
  if (server_) server_->Shutdown();
  process_.reset();
}

void TransportConformanceTest::RestartServer() {
  if (process_ != nullptr) {
    const std::string address = address_;
    process_.reset();
    StartDaemonProcess(address);
    ASSERT_EQ(address_, address) << "the daemon did not start again at " << address;
    ASSERT_TRUE(channel_->WaitForConnected(Soon())) << "no connection to the restarted daemon";
    return;
  }
  const std::string address = server_->address();
  server_->Shutdown();
  server_.reset();
  v1::DaemonConfig config = config_;
  config.set_listen(address);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  metrics_address_ = server_->metrics_address();
  ASSERT_TRUE(channel_->WaitForConnected(Soon())) << "no connection to the restarted daemon";
}

bool TransportConformanceTest::LeasesReach(const std::string& job, int64_t count) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Leases(job) != count) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

int64_t TransportConformanceTest::Leases(const std::string& job) {
  v1::StatusRequest request;
  request.set_job(job);
  grpc::ClientContext context;
  v1::StatusResponse response;
  const grpc::Status status = control_->Status(&context, request, &response);
  if (!status.ok() || response.jobs_size() != 1) return -1;
  return response.jobs(0).leases();
}

Deadline TransportConformanceTest::Soon() const {
  return std::chrono::system_clock::now() + std::chrono::seconds(30);
}

void TransportConformanceTest::Register(const std::string& job,
                                        const std::vector<v1::TensorSpec>& tensors, int world_size,
                                        const std::vector<v1::ServeFormat>& serve) {
  for (int rank = 0; rank < world_size; ++rank) {
    v1::RegisterRequest request;
    request.set_job(job);
    request.set_rank(rank);
    request.set_world_size(world_size);
    for (const auto& t : tensors) *request.add_tensors() = t;
    for (const auto& f : serve) *request.add_serve() = f;
    *request.mutable_hyperparams() = hyper_;
    grpc::ClientContext context;
    v1::RegisterResponse response;
    grpc::Status status = control_->Register(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    // Declares the rank's transport as a client does after it registers (Client::Register): the
    // daemon reports it in Status and counts the rank's bytes under it.
    v1::AttachRequest attach;
    attach.set_job(job);
    attach.set_rank(rank);
    attach.set_transport(GetParam());
    attach.mutable_declare()->set_reason("the transport under test");
    grpc::ClientContext attach_context;
    v1::AttachResponse attached;
    status = data_->Attach(&attach_context, attach, &attached);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
}

absl::Status TransportConformanceTest::Commit(const std::string& job, int rank, int64_t step,
                                              double grad_scale) {
  v1::CommitRequest request;
  request.set_job(job);
  request.set_rank(rank);
  request.set_step(step);
  request.set_grad_scale(grad_scale);
  grpc::ClientContext context;
  v1::CommitResponse response;
  return FromGrpcStatus(data_->Commit(&context, request, &response));
}

TEST_P(TransportConformanceTest, InitialWeightsComeBackUnchangedAsVersionZero) {
  Register("w", {Spec("a", 3, 5), Spec("b", 1, 1)}, 1);
  const std::vector<float> a = Random(15, 1, 1.0f), b = {42.0f};
  const PushItem items[] = {{"a", Bytes(a)}, {"b", Bytes(b)}};
  ASSERT_TRUE(transport_->Push({"w", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, items, Soon()).ok());
  Pulled pulled;
  ASSERT_TRUE(transport_->Pull(Target("w", "a", 0), Soon(), &pulled).ok());
  EXPECT_EQ(pulled.header.version(), 0);
  EXPECT_EQ(pulled.header.rows(), 3);
  EXPECT_EQ(pulled.header.cols(), 5);
  EXPECT_EQ(Floats(pulled), a);
  ASSERT_TRUE(transport_->Pull(Target("w", "b", 0), Soon(), &pulled).ok());
  EXPECT_EQ(Floats(pulled), b);
}

TEST_P(TransportConformanceTest, PushedGradientsOfEveryRankGiveTheReferenceStep) {
  constexpr int kRanks = 3;
  constexpr size_t kN = 1000;
  Register("g", {Spec("t", 10, 100)}, kRanks);
  std::vector<float> p = Random(kN, 2, 0.02f);
  const PushItem init[] = {{"t", Bytes(p)}};
  ASSERT_TRUE(transport_->Push({"g", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  std::vector<float> m(kN, 0.0f), v(kN, 0.0f);
  const reference::Hyper hyper{hyper_.lr(), hyper_.beta1(), hyper_.beta2(), hyper_.eps(),
                               hyper_.weight_decay()};
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> grads;
    for (int r = 0; r < kRanks; ++r) grads.push_back(Random(kN, 100 + 10 * step + r, 1e-3f));
    for (int r = kRanks - 1; r >= 0; --r) {  // arrival order must not matter
      const PushItem items[] = {{"t", Bytes(grads[r])}};
      ASSERT_TRUE(transport_->Push({"g", r, step, v1::PUSH_KIND_GRADIENT}, items, Soon()).ok());
      ASSERT_TRUE(Commit("g", r, step, 1.0 / kRanks).ok());
    }
    std::vector<const float*> slots;
    for (const auto& g : grads) slots.push_back(g.data());
    std::vector<float> gs(kN);
    for (size_t i = 0; i < kN; ++i) {
      gs[i] = reference::SumSlotsFp32(slots.data(), kRanks, i) * static_cast<float>(1.0 / kRanks);
    }
    reference::AdamwStepFp32(hyper, step + 1, gs.data(), p.data(), m.data(), v.data(), kN);
    Pulled pulled;
    ASSERT_TRUE(transport_->Pull(Target("g", "t", step + 1), Soon(), &pulled).ok());
    EXPECT_EQ(pulled.header.version(), step + 1);
    ASSERT_EQ(pulled.data.size(), kN * sizeof(float));
    EXPECT_EQ(std::memcmp(pulled.data.data(), p.data(), pulled.data.size()), 0)
        << "step " << step << " differs from the reference";
  }
}

TEST_P(TransportConformanceTest, LargeTensorsCrossInManyChunksExactly) {
  // 3 MiB + 4 bytes: dozens of chunks and a ragged last one.
  constexpr int64_t kCols = (3 << 20) / 4 + 1;
  Register("big", {Spec("t", 1, kCols)}, 1);
  const std::vector<float> p = Random(kCols, 3, 1.0f);
  const PushItem items[] = {{"t", Bytes(p)}};
  ASSERT_TRUE(transport_->Push({"big", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, items, Soon()).ok());
  Pulled pulled;
  ASSERT_TRUE(transport_->Pull(Target("big", "t", 0), Soon(), &pulled).ok());
  EXPECT_EQ(Floats(pulled), p);
}

// /metrics counts a gradient's bytes and a pull's under the transport that moved them, and under
// no other: the daemon knows a rank's transport from its Attach (pushes) and from the pull request
// (pulls), not from the memory the bytes lie in, which two transports may share (cuda_ipc and
// nccl both move bytes in and out of the daemon's exported GPU memory).
TEST_P(TransportConformanceTest, BytesMovedAreCountedUnderTheTransportThatMovedThem) {
  constexpr int64_t kRows = 4, kCols = 1000;
  constexpr int64_t kBytes = kRows * kCols * static_cast<int64_t>(sizeof(float));
  if (process_ == nullptr) {  // an in-process daemon serves /metrics only when asked to
    config_.set_metrics_listen("127.0.0.1:0");
    RestartServer();
  }
  Register("m", {Spec("t", kRows, kCols)}, 1);
  const std::vector<float> p = Random(kRows * kCols, 7, 1.0f), g = Random(kRows * kCols, 8, 1e-3f);
  const PushItem init[] = {{"t", Bytes(p)}};
  ASSERT_TRUE(transport_->Push({"m", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  Pulled pulled;
  ASSERT_TRUE(transport_->Pull(Target("m", "t", 0), Soon(), &pulled).ok());

  const std::vector<std::string> names = {"inline", "shm", "cuda_ipc", "nccl"};
  auto counts = [&](const std::string& family) {
    const std::string page = HttpGet(metrics_address_, "/metrics");
    EXPECT_FALSE(page.empty()) << "no /metrics page at " << metrics_address_;
    std::map<std::string, double> by;
    for (const std::string& name : names) {
      by[name] = MetricValue(page, family + "{transport=\"" + name + "\"}");
    }
    return by;
  };
  const std::map<std::string, double> pushed_before = counts("paramd_pushed_bytes_total");
  const std::map<std::string, double> pulled_before = counts("paramd_pulled_bytes_total");
  const PushItem items[] = {{"t", Bytes(g)}};
  ASSERT_TRUE(transport_->Push({"m", 0, 0, v1::PUSH_KIND_GRADIENT}, items, Soon()).ok());
  ASSERT_TRUE(Commit("m", 0, 0).ok());
  ASSERT_TRUE(transport_->Pull(Target("m", "t", 1), Soon(), &pulled).ok());
  ASSERT_EQ(pulled.header.version(), 1);
  const std::map<std::string, double> pushed = counts("paramd_pushed_bytes_total");
  // A pull's bytes may be counted after the puller has them (a stream counts once its last write
  // is done): the page is read until they are there, for at most 10 s.
  std::map<std::string, double> pulled_after = counts("paramd_pulled_bytes_total");
  for (const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       pulled_after.at(GetParam()) - pulled_before.at(GetParam()) < kBytes &&
       std::chrono::steady_clock::now() < give_up;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    pulled_after = counts("paramd_pulled_bytes_total");
  }
  for (const std::string& name : names) {
    const double expected = name == GetParam() ? static_cast<double>(kBytes) : 0.0;
    EXPECT_EQ(pushed.at(name) - pushed_before.at(name), expected)
        << "pushed bytes under transport=\"" << name << "\" (the rank uses " << GetParam() << ")";
    EXPECT_EQ(pulled_after.at(name) - pulled_before.at(name), expected)
        << "pulled bytes under transport=\"" << name << "\" (the rank uses " << GetParam() << ")";
  }
}

TEST_P(TransportConformanceTest, PullWaitsUntilTheVersionIsPublished) {
  Register("wait", {Spec("t", 1, 64)}, 1);
  const std::vector<float> p = Random(64, 4, 1.0f), g = Random(64, 5, 1.0f);
  const PushItem init[] = {{"t", Bytes(p)}};
  ASSERT_TRUE(transport_->Push({"wait", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  Pulled pulled;
  absl::Status pull_status;
  std::thread puller(
      [&] { pull_status = transport_->Pull(Target("wait", "t", 1), Soon(), &pulled); });
  const PushItem items[] = {{"t", Bytes(g)}};
  ASSERT_TRUE(transport_->Push({"wait", 0, 0, v1::PUSH_KIND_GRADIENT}, items, Soon()).ok());
  ASSERT_TRUE(Commit("wait", 0, 0).ok());
  puller.join();
  ASSERT_TRUE(pull_status.ok()) << pull_status;
  EXPECT_EQ(pulled.header.version(), 1);
  EXPECT_NE(Floats(pulled), p);
}

TEST_P(TransportConformanceTest, PullOfAVersionThatNeverComesEndsAtTheDeadline) {
  Register("late", {Spec("t", 1, 8)}, 1);
  const std::vector<float> p(8, 1.0f);
  const PushItem init[] = {{"t", Bytes(p)}};
  ASSERT_TRUE(transport_->Push({"late", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  Pulled pulled;
  const absl::Status status =
      transport_->Pull(Target("late", "t", 5),
                       std::chrono::system_clock::now() + std::chrono::milliseconds(200), &pulled);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
}

// Several tensors in one pull: each answer is the tensor asked for in that position, byte for byte
// what a pull of it alone gives, the call waits for the version of every one, and in-place views
// (where the transport has them) show the same bytes until their leases end together.
TEST_P(TransportConformanceTest, PullManyGivesEveryTensorAsAPullOfItAlone) {
  const std::vector<std::string> names = {"a", "b", "c"};
  Register("many", {Spec("a", 4, 16), Spec("b", 1, 1000), Spec("c", 33, 3)}, 1);
  std::vector<std::vector<float>> p = {Random(64, 21, 1.0f), Random(1000, 22, 1.0f),
                                       Random(99, 23, 1.0f)};
  std::vector<PushItem> init, grads;
  std::vector<std::vector<float>> g;
  for (size_t i = 0; i < names.size(); ++i) {
    init.push_back({names[i], Bytes(p[i])});
    g.push_back(Random(p[i].size(), 30 + static_cast<uint32_t>(i), 1e-2f));
  }
  for (size_t i = 0; i < names.size(); ++i) grads.push_back({names[i], Bytes(g[i])});
  ASSERT_TRUE(transport_->Push({"many", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  PullManyTarget target{"many", {"c", "a", "b"}, {}, 1};
  target.format.set_recipe(v1::RECIPE_FP32);
  std::vector<Pulled> many;
  absl::Status many_status;
  std::thread puller([&] { many_status = transport_->PullMany(target, Soon(), &many); });
  ASSERT_TRUE(transport_->Push({"many", 0, 0, v1::PUSH_KIND_GRADIENT}, grads, Soon()).ok());
  ASSERT_TRUE(Commit("many", 0, 0).ok());
  puller.join();
  ASSERT_TRUE(many_status.ok()) << many_status;
  ASSERT_EQ(many.size(), 3u);
  for (size_t i = 0; i < target.tensors.size(); ++i) {
    Pulled alone;
    ASSERT_TRUE(transport_->Pull(Target("many", target.tensors[i], 1), Soon(), &alone).ok());
    EXPECT_EQ(many[i].header.tensor(), target.tensors[i]);
    EXPECT_EQ(many[i].header.version(), 1);
    EXPECT_EQ(many[i].data, alone.data) << target.tensors[i];
  }
  EXPECT_NE(Floats(many[1]), p[0]);  // "a" was stepped

  std::vector<PulledView> views;
  if (transport_->PullInPlaceMany(target, Soon(), std::chrono::seconds(30), &views).ok()) {
    ASSERT_EQ(views.size(), 3u);
    std::vector<uint64_t> leases;
    for (size_t i = 0; i < views.size(); ++i) {
      EXPECT_EQ(views[i].header.tensor(), target.tensors[i]);
      leases.push_back(views[i].lease);
      if (views[i].header.place_on_device()) continue;  // GPU memory: not read by this suite
      ASSERT_EQ(views[i].data.size(), many[i].data.size());
      EXPECT_EQ(std::memcmp(views[i].data.data(), many[i].data.data(), views[i].data.size()), 0);
    }
    EXPECT_TRUE(transport_->ReleaseMany(leases, Soon()).ok());
  }
}

// Headers of tensors already published leave in one message to a pull that asks for batches
// (PullRequest.batch_headers), one message each to a pull that does not; where the daemon streams
// the bytes instead (no place), every header is followed by its bytes either way.
TEST_P(TransportConformanceTest, PublishedTensorsHeadersComeBatchedOnlyWhenAsked) {
  const std::vector<std::string> names = {"a", "b", "c"};
  Register("batch", {Spec("a", 4, 16), Spec("b", 1, 1000), Spec("c", 33, 3)}, 1);
  std::vector<std::vector<float>> p = {Random(64, 41, 1.0f), Random(1000, 42, 1.0f),
                                       Random(99, 43, 1.0f)};
  std::vector<PushItem> init;
  for (size_t i = 0; i < names.size(); ++i) init.push_back({names[i], Bytes(p[i])});
  ASSERT_TRUE(transport_->Push({"batch", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  struct Answer {
    int messages = 0;                  // messages carrying headers
    std::vector<std::string> tensors;  // in the order they came
    bool placed = true;
    std::vector<uint64_t> leases;
  };
  auto pull = [&](bool batch) {
    v1::PullRequest request;
    request.set_job("batch");
    for (const std::string& name : names) request.add_tensors(name);
    request.mutable_format()->set_recipe(v1::RECIPE_FP32);
    request.set_delivery(v1::PULL_DELIVERY_PLACE);
    request.set_batch_headers(batch);
    grpc::ClientContext context;
    context.set_deadline(Soon());
    std::unique_ptr<grpc::ClientReader<v1::PullChunk>> reader = data_->Pull(&context, request);
    Answer answer;
    v1::PullChunk chunk;
    auto take = [&answer](const v1::PullHeader& header) {
      answer.tensors.push_back(header.tensor());
      answer.placed = answer.placed && header.has_place();
      if (header.has_place()) answer.leases.push_back(header.lease());
    };
    while (reader->Read(&chunk)) {
      if (chunk.has_header()) take(chunk.header());
      for (const v1::PullHeader& header : chunk.headers().headers()) take(header);
      answer.messages += chunk.has_header() || chunk.has_headers() ? 1 : 0;
    }
    EXPECT_TRUE(reader->Finish().ok());
    return answer;
  };
  const Answer alone = pull(false);
  const Answer batched = pull(true);
  EXPECT_EQ(alone.tensors, names);
  EXPECT_EQ(batched.tensors, names);
  EXPECT_EQ(alone.messages, 3);
  EXPECT_EQ(batched.placed, alone.placed);
  EXPECT_EQ(batched.messages, batched.placed ? 1 : 3);
  std::vector<uint64_t> leases = alone.leases;
  leases.insert(leases.end(), batched.leases.begin(), batched.leases.end());
  if (!leases.empty()) EXPECT_TRUE(transport_->ReleaseMany(leases, Soon()).ok());
}

// A pull of several tensors one of which never reaches the version ends at its deadline, and the
// daemon goes on serving (the waiters of the others are gone with the call).
TEST_P(TransportConformanceTest, PullManyOfAVersionThatNeverComesEndsAtTheDeadline) {
  Register("stuck", {Spec("x", 1, 8), Spec("y", 2, 8)}, 1);
  const std::vector<float> x(8, 1.0f), y(16, 2.0f);
  const PushItem init[] = {{"x", Bytes(x)}, {"y", Bytes(y)}};
  ASSERT_TRUE(transport_->Push({"stuck", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  PullManyTarget target{"stuck", {"x", "y"}, {}, 2};
  std::vector<Pulled> out;
  const absl::Status status = transport_->PullMany(
      target, std::chrono::system_clock::now() + std::chrono::milliseconds(200), &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  // Version 1 comes later; a pull of it works.
  const std::vector<float> gx(8, 0.5f), gy(16, 0.25f);
  const PushItem items[] = {{"x", Bytes(gx)}, {"y", Bytes(gy)}};
  ASSERT_TRUE(transport_->Push({"stuck", 0, 0, v1::PUSH_KIND_GRADIENT}, items, Soon()).ok());
  ASSERT_TRUE(Commit("stuck", 0, 0).ok());
  target.min_version = 1;
  EXPECT_TRUE(transport_->PullMany(target, Soon(), &out).ok());
}

// A pull naming several tensors is refused, changing nothing, unless it asks for places, names
// each tensor once, and does not also name `tensor`.
TEST_P(TransportConformanceTest, ABadPullOfSeveralTensorsIsRefused) {
  Register("bad", {Spec("x", 1, 8)}, 1);
  const std::vector<float> x(8, 1.0f);
  const PushItem init[] = {{"x", Bytes(x)}};
  ASSERT_TRUE(transport_->Push({"bad", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  auto pull = [&](const v1::PullRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    std::unique_ptr<grpc::ClientReader<v1::PullChunk>> reader = data_->Pull(&context, request);
    v1::PullChunk chunk;
    int headers = 0;
    while (reader->Read(&chunk)) headers += chunk.has_header() ? 1 : 0;
    const absl::Status status = FromGrpcStatus(reader->Finish());
    EXPECT_EQ(headers, 0) << "a refused pull sent a header";
    return status;
  };
  v1::PullRequest streamed;
  streamed.set_job("bad");
  streamed.add_tensors("x");
  EXPECT_EQ(pull(streamed).code(), absl::StatusCode::kInvalidArgument);
  v1::PullRequest twice = streamed;
  twice.set_delivery(v1::PULL_DELIVERY_PLACE);
  twice.add_tensors("x");
  EXPECT_EQ(pull(twice).code(), absl::StatusCode::kInvalidArgument);
  v1::PullRequest both = streamed;
  both.set_delivery(v1::PULL_DELIVERY_PLACE);
  both.set_tensor("x");
  EXPECT_EQ(pull(both).code(), absl::StatusCode::kInvalidArgument);
  v1::PullRequest unknown = streamed;
  unknown.set_delivery(v1::PULL_DELIVERY_PLACE);
  unknown.add_tensors("nope");
  EXPECT_EQ(pull(unknown).code(), absl::StatusCode::kNotFound);
}

TEST_P(TransportConformanceTest, RepeatedPushIsAcknowledgedAndADifferentOneRefused) {
  Register("idem", {Spec("t", 1, 256)}, 1);
  const std::vector<float> p = Random(256, 6, 1.0f), g = Random(256, 7, 1.0f);
  std::vector<float> other = g;
  other[100] += 1.0f;
  const PushItem init[] = {{"t", Bytes(p)}};
  ASSERT_TRUE(transport_->Push({"idem", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  const PushItem same[] = {{"t", Bytes(g)}};
  const PushItem changed[] = {{"t", Bytes(other)}};
  const PushTarget target{"idem", 0, 0, v1::PUSH_KIND_GRADIENT};
  ASSERT_TRUE(transport_->Push(target, same, Soon()).ok());
  EXPECT_TRUE(transport_->Push(target, same, Soon()).ok());
  EXPECT_EQ(transport_->Push(target, changed, Soon()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Commit("idem", 0, 0).ok());
}

// One transport object across two starts of the daemon at one address: whatever it mapped or
// cached from the first (segments, IPC handles, slot places asked ahead, the bytes it knows were
// received), the second start's step sees the gradient pushed to it and pulls read its weights.
TEST_P(TransportConformanceTest, ADaemonRestartedAtTheSameAddressGetsWhatIsPushedToIt) {
  constexpr size_t kN = 1000;
  const std::vector<float> p = Random(kN, 11, 0.02f), g = Random(kN, 12, 1e-3f);
  std::vector<float> first;
  for (int start = 0; start < 2; ++start) {
    if (start == 1) ASSERT_NO_FATAL_FAILURE(RestartServer());
    ASSERT_NO_FATAL_FAILURE(Register("again", {Spec("t", 10, 100)}, 1));
    const PushItem init[] = {{"t", Bytes(p)}};
    ASSERT_TRUE(
        transport_->Push({"again", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
    const PushItem items[] = {{"t", Bytes(g)}};
    const absl::Status pushed =
        transport_->Push({"again", 0, 0, v1::PUSH_KIND_GRADIENT}, items, Soon());
    ASSERT_TRUE(pushed.ok()) << pushed;
    const absl::Status committed = Commit("again", 0, 0);
    ASSERT_TRUE(committed.ok()) << "start " << start << ": " << committed;
    Pulled pulled;
    const absl::Status pulled_status = transport_->Pull(Target("again", "t", 1), Soon(), &pulled);
    ASSERT_TRUE(pulled_status.ok()) << "start " << start << ": " << pulled_status;
    if (start == 0) {
      first = Floats(pulled);
      EXPECT_NE(first, p);
    } else {
      EXPECT_EQ(Floats(pulled), first) << "the restarted daemon's step or pull went wrong";
    }
    // An in-place view in host memory (shm) must show the same bytes. (A cuda_ipc view is GPU
    // memory, which this suite does not read; its copy-out pull above went through the same
    // place lookup.)
    PulledView view;
    if (transport_->PullInPlace(Target("again", "t", 1), Soon(), std::chrono::seconds(30), &view)
            .ok()) {
      if (!view.header.place_on_device()) {
        ASSERT_EQ(view.data.size(), pulled.data.size());
        EXPECT_EQ(std::memcmp(view.data.data(), pulled.data.data(), view.data.size()), 0);
      }
      EXPECT_TRUE(transport_->Release(view.lease, Soon()).ok());
    }
  }
}

TEST_P(TransportConformanceTest, Bf16GradientsAndBf16WeightsCrossIntact) {
  v1::ServeFormat bf16, fp32;
  bf16.set_recipe(v1::RECIPE_BF16);
  fp32.set_recipe(v1::RECIPE_FP32);  // served only when listed
  Register("half", {Spec("t", 7, 13, v1::ELEMENT_TYPE_BF16)}, 1, {bf16, fp32});
  const std::vector<float> p = Random(91, 8, 1.0f);
  const PushItem init[] = {{"t", Bytes(p)}};
  ASSERT_TRUE(transport_->Push({"half", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  Pulled pulled;
  ASSERT_TRUE(transport_->Pull(Target("half", "t", 0, v1::RECIPE_BF16), Soon(), &pulled).ok());
  ASSERT_EQ(pulled.data.size(), 91 * sizeof(uint16_t));
  std::vector<uint16_t> served(91);
  std::memcpy(served.data(), pulled.data.data(), pulled.data.size());
  for (size_t i = 0; i < 91; ++i) EXPECT_EQ(served[i], reference::Bf16FromFloat(p[i])) << i;

  std::vector<uint16_t> grad(91);
  for (size_t i = 0; i < 91; ++i) grad[i] = reference::Bf16FromFloat(0.01f * static_cast<float>(i));
  const PushItem items[] = {{"t", std::as_bytes(std::span<const uint16_t>(grad))}};
  ASSERT_TRUE(transport_->Push({"half", 0, 0, v1::PUSH_KIND_GRADIENT}, items, Soon()).ok());
  ASSERT_TRUE(Commit("half", 0, 0).ok());
  std::vector<float> expected = p, m(91, 0.0f), v(91, 0.0f), gs(91);
  std::vector<const uint16_t*> slots = {grad.data()};
  for (size_t i = 0; i < 91; ++i) gs[i] = reference::SumSlotsBf16(slots.data(), 1, i);
  reference::AdamwStepFp32(
      {hyper_.lr(), hyper_.beta1(), hyper_.beta2(), hyper_.eps(), hyper_.weight_decay()}, 1,
      gs.data(), expected.data(), m.data(), v.data(), 91);
  ASSERT_TRUE(transport_->Pull(Target("half", "t", 1), Soon(), &pulled).ok());
  EXPECT_EQ(Floats(pulled), expected);
}

// Each transport's instance says what it can do (TransportTraits), as this build makes it; callers
// decide from these, never from the name. The behaviour they promise is checked by the tests
// below (views in place, where the places lie).
TEST_P(TransportConformanceTest, TraitsSayWhatTheTransportCanDo) {
  struct Expected {
    bool reads_device_memory;
    bool views_in_place;
    std::optional<Memory> memory;
  };
  const std::map<std::string, Expected> expected = {
      {"inline", {false, false, std::nullopt}},
      {"shm", {false, true, Memory::kHost}},
      {"cuda_ipc", {true, true, Memory::kDevice}},
      {"nccl", {true, false, Memory::kDevice}},
  };
  const auto it = expected.find(GetParam());
  ASSERT_NE(it, expected.end()) << "add transport " << GetParam() << "'s traits to this table";
  const TransportTraits traits = transport_->traits();
  EXPECT_EQ(traits.reads_device_memory, it->second.reads_device_memory);
  EXPECT_EQ(traits.views_in_place, it->second.views_in_place);
  EXPECT_EQ(traits.memory, it->second.memory);
  // Only a transport with places views them.
  if (traits.views_in_place) EXPECT_TRUE(traits.memory.has_value());
}

// PullInPlace means the same on every transport: where the transport reads in place (its traits
// say so), the view holds the served bytes, where its traits say they lie, under a lease the
// daemon counts until Release returns; where it cannot, it says so (FAILED_PRECONDITION) and
// takes no lease. Releasing an ended or unknown lease is no error.
TEST_P(TransportConformanceTest, PullInPlaceLeasesTheServedBytesUntilReleased) {
  Register("view", {Spec("t", 2, 8)}, 1);
  const std::vector<float> p = Random(16, 7, 1.0f);
  const PushItem init[] = {{"t", Bytes(p)}};
  ASSERT_TRUE(transport_->Push({"view", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  PulledView view;
  const absl::Status status =
      transport_->PullInPlace(Target("view", "t", 0), Soon(), std::chrono::seconds(30), &view);
  EXPECT_EQ(status.ok(), transport_->traits().views_in_place) << status;
  if (!status.ok()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_EQ(Leases("view"), 0);
    EXPECT_TRUE(transport_->Release(view.lease, Soon()).ok());
    EXPECT_TRUE(transport_->Release(12345, Soon()).ok());
    return;
  }
  EXPECT_NE(view.lease, 0u);
  EXPECT_EQ(view.header.version(), 0);
  EXPECT_EQ(view.header.tensor(), "t");
  EXPECT_EQ(view.header.place_on_device(), transport_->traits().memory == Memory::kDevice);
  ASSERT_EQ(view.data.size(), p.size() * sizeof(float));
  if (!view.header.place_on_device()) {  // GPU memory: not read by this suite
    EXPECT_EQ(std::memcmp(view.data.data(), p.data(), view.data.size()), 0);
  }
  EXPECT_EQ(Leases("view"), 1);
  ASSERT_TRUE(transport_->Release(view.lease, Soon()).ok());
  EXPECT_TRUE(LeasesReach("view", 0));                        // ended as the call arrives
  EXPECT_TRUE(transport_->Release(view.lease, Soon()).ok());  // ended already: harmless
  EXPECT_TRUE(transport_->Release(12345, Soon()).ok());       // never taken: harmless
}

TEST_P(TransportConformanceTest, PullInPlaceManyLeasesEveryTensorAndReleaseManyEndsThemAll) {
  Register("views", {Spec("a", 1, 8), Spec("b", 2, 8)}, 1);
  const std::vector<float> a = Random(8, 8, 1.0f), b = Random(16, 9, 1.0f);
  const PushItem init[] = {{"a", Bytes(a)}, {"b", Bytes(b)}};
  ASSERT_TRUE(transport_->Push({"views", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  const PullManyTarget target{"views", {"b", "a"}, {}, 0};
  std::vector<PulledView> views;
  const absl::Status status =
      transport_->PullInPlaceMany(target, Soon(), std::chrono::seconds(30), &views);
  EXPECT_EQ(status.ok(), transport_->traits().views_in_place) << status;
  if (!status.ok()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_EQ(Leases("views"), 0);
    const uint64_t none[] = {1, 2};
    EXPECT_TRUE(transport_->ReleaseMany(none, Soon()).ok());
    return;
  }
  ASSERT_EQ(views.size(), 2u);
  const std::vector<float>* expected[] = {&b, &a};
  std::vector<uint64_t> leases;
  for (size_t i = 0; i < views.size(); ++i) {
    EXPECT_EQ(views[i].header.tensor(), target.tensors[i]);
    EXPECT_NE(views[i].lease, 0u);
    leases.push_back(views[i].lease);
    ASSERT_EQ(views[i].data.size(), expected[i]->size() * sizeof(float));
    if (views[i].header.place_on_device()) continue;  // GPU memory: not read by this suite
    EXPECT_EQ(std::memcmp(views[i].data.data(), expected[i]->data(), views[i].data.size()), 0);
  }
  EXPECT_NE(leases[0], leases[1]);
  EXPECT_EQ(Leases("views"), 2);
  ASSERT_TRUE(transport_->ReleaseMany(leases, Soon()).ok());
  EXPECT_TRUE(LeasesReach("views", 0));
  EXPECT_TRUE(transport_->ReleaseMany(leases, Soon()).ok());  // ended already: harmless
}

}  // namespace paramd::testing
