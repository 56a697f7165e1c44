// Control.Checkpoint / Control.Restore over real RPCs, and the restore at start: a real
// paramd::Server on 127.0.0.1 port 0 with a checkpoint_dir in a temporary folder, and
// paramd::Client. A restored job serves the checkpoint's bytes in every format and trains on
// bit-identically; a daemon started again with the same checkpoint_dir comes back with the job;
// damaged checkpoints are refused naming the file (and the older one is used at start); refusals
// carry their documented codes and change nothing.
#include <arpa/inet.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/text_serializer.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/grpc_status.h"
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

constexpr char kJob[] = "durable";

v1::ServeFormat Format(v1::Recipe recipe) {
  v1::ServeFormat f;
  f.set_recipe(recipe);
  if (recipe == v1::RECIPE_FP8_DELAYED) f.set_amax_history(4);
  return f;
}

const std::vector<v1::ServeFormat>& Formats() {
  static const std::vector<v1::ServeFormat> formats = {
      Format(v1::RECIPE_FP32), Format(v1::RECIPE_BF16), Format(v1::RECIPE_FP8_TENSOR),
      Format(v1::RECIPE_FP8_DELAYED)};
  return formats;
}

// fp8 moments rounded stochastically (the generator's counters must come back too), clipping.
v1::RegisterRequest Spec() {
  v1::RegisterRequest spec = MakeSpec(
      kJob, 1, {{"w", 131, 257, v1::ELEMENT_TYPE_FP32}, {"b", 1, 1000, v1::ELEMENT_TYPE_BF16}});
  v1::StatePolicy* p = spec.mutable_state_policy();
  p->set_exp_avg(v1::MOMENT_TYPE_FP8);
  p->set_exp_avg_sq(v1::MOMENT_TYPE_FP8);
  p->set_exp_avg_rounding(v1::ROUNDING_STOCHASTIC);
  p->set_exp_avg_sq_rounding(v1::ROUNDING_STOCHASTIC);
  spec.set_max_grad_norm(0.5);
  spec.clear_serve();
  for (const v1::ServeFormat& f : Formats()) *spec.add_serve() = f;
  return spec;
}

std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

class CheckpointRpcTest : public ::testing::Test {
 protected:
  CheckpointRpcTest() : spec_(Spec()) {
    char pattern[] = "/tmp/paramd-checkpoints-XXXXXX";
    root_ = mkdtemp(pattern);
  }
  ~CheckpointRpcTest() override {
    client_.reset();
    server_.reset();
    std::filesystem::remove_all(root_);
  }

  v1::DaemonConfig Config(bool with_dir = true) const {
    v1::DaemonConfig config;
    config.set_listen("127.0.0.1:0");
    config.set_metrics_listen("");
    config.set_step_threads(2);
    config.set_max_chunk_bytes(1 << 16);
    config.set_log_level("error");
    if (with_dir) config.set_checkpoint_dir(root_);
    config.set_keep_checkpoints(2);
    return config;
  }

  // (Re)starts the daemon and connects; the old one stops first (its memory goes with it).
  void Start(const v1::DaemonConfig& config) {
    client_.reset();
    server_.reset();
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ClientOptions options;
    options.address = server_->address();
    options.transport = "inline";
    options.max_attempts = 1;
    options.daemons_wait =
        std::chrono::milliseconds(0);  // its lists name daemons that do not exist
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  void StartJob() {
    absl::StatusOr<v1::RegisterResponse> registered = client_->Register(ForRank(spec_, 0));
    ASSERT_TRUE(registered.ok()) << registered.status();
    std::vector<std::string> weights;
    for (const std::vector<float>& w : RandomWeights(spec_, 5)) weights.push_back(ToBytes(w));
    ASSERT_TRUE(client_->UploadInitialWeights(kJob, Items(weights)).ok());
  }

  std::vector<PushItem> Items(const std::vector<std::string>& per_tensor) const {
    std::vector<PushItem> items;
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      items.push_back({spec_.tensors(i).name(), AsBytes(per_tensor[static_cast<size_t>(i)])});
    }
    return items;
  }

  void RunStep(int64_t step) {
    const StepGradients grads = RandomGradients(spec_, 70 + step);
    std::vector<std::string> mine;
    for (int i = 0; i < spec_.tensors_size(); ++i) mine.push_back(grads[i][0]);
    const absl::Status pushed = client_->PushGradients(kJob, 0, step, Items(mine));
    ASSERT_TRUE(pushed.ok()) << pushed;
    absl::StatusOr<v1::CommitResponse> committed = client_->Commit(kJob, 0, step, 2e-3, 1.0);
    ASSERT_TRUE(committed.ok()) << committed.status();
    // As a trainer does: the next step's gradients come from this step's weights.
    Pulled pulled;
    const absl::Status status = client_->Pull({kJob, "w", Formats()[0], step + 1}, 20s, &pulled);
    ASSERT_TRUE(status.ok()) << status;
  }

  // Every format of every tensor at `version`.
  std::vector<std::vector<std::byte>> PullAll(int64_t version) {
    std::vector<std::vector<std::byte>> out;
    for (const v1::TensorSpec& t : spec_.tensors()) {
      for (const v1::ServeFormat& f : Formats()) {
        Pulled pulled;
        const absl::Status status = client_->Pull({kJob, t.name(), f, version}, 20s, &pulled);
        EXPECT_TRUE(status.ok()) << status;
        EXPECT_EQ(pulled.header.version(), version);
        out.push_back(pulled.data);
      }
    }
    return out;
  }

  int64_t NextStep() {
    absl::StatusOr<v1::StatusResponse> status = client_->Status(kJob);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? status->jobs(0).next_step() : -1;
  }

  // The value of one series of the daemon's metrics (labels in name order), or -1 without it.
  double Metric(const std::string& series) {
    const std::string text =
        prometheus::TextSerializer().Serialize(server_->daemon().metrics().registry().Collect());
    const size_t at = text.find(series + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + series.size() + 1));
  }

  // Whether Status reports a checkpoint of the job being written or restored.
  bool CheckpointUnderWay() {
    absl::StatusOr<v1::StatusResponse> status = client_->Status(kJob);
    EXPECT_TRUE(status.ok()) << status.status();
    return !status.ok() || status->jobs(0).has_checkpoint_progress();
  }

  v1::RegisterRequest spec_;  // a test may give it a daemon list before StartJob
  std::string root_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(CheckpointRpcTest, ARestoredJobServesTheCheckpointAndTrainsOnBitIdentically) {
  Start(Config());
  StartJob();
  for (int64_t step = 0; step < 3; ++step) RunStep(step);
  absl::StatusOr<v1::CheckpointResponse> written = client_->Checkpoint(kJob);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->version(), 3);
  EXPECT_EQ(written->path(), root_ + "/" + kJob + "/step-000000000003");
  EXPECT_TRUE(std::filesystem::exists(written->path() + "/manifest.pb"));
  EXPECT_GT(written->bytes(), 131 * 257 * 6);  // fp32 master and two fp8 moments at least
  EXPECT_FALSE(CheckpointUnderWay());          // only while it is written
  EXPECT_EQ(
      Metric(R"(paramd_checkpoints_total{operation="write",outcome="ok",training_job="durable"})"),
      1);
  EXPECT_EQ(Metric(R"(paramd_checkpoint_version{operation="write",training_job="durable"})"), 3);
  EXPECT_GT(
      Metric(R"(paramd_checkpoint_timestamp_seconds{operation="write",training_job="durable"})"),
      1.6e9);
  const auto at_checkpoint = PullAll(3);
  for (int64_t step = 3; step < 5; ++step) RunStep(step);
  const auto trained_on = PullAll(5);

  // Into the idle job: it goes back to version 3 and trains on to the same bytes.
  absl::StatusOr<v1::RestoreResponse> restored = client_->Restore(kJob, written->path());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->version(), 3);
  EXPECT_FALSE(restored->registered());
  EXPECT_EQ(NextStep(), 3);
  EXPECT_EQ(
      Metric(
          R"(paramd_checkpoints_total{operation="restore",outcome="ok",training_job="durable"})"),
      1);
  EXPECT_EQ(Metric(R"(paramd_job_version{training_job="durable"})"), 3);
  EXPECT_FALSE(CheckpointUnderWay());
  EXPECT_EQ(PullAll(3), at_checkpoint);
  for (int64_t step = 3; step < 5; ++step) RunStep(step);
  EXPECT_EQ(PullAll(5), trained_on);

  // Into no job: registered from the manifest, from the newest checkpoint.
  ASSERT_TRUE(client_->DeleteJob(kJob).ok());
  restored = client_->Restore(kJob);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(restored->registered());
  EXPECT_EQ(restored->path(), written->path());
  EXPECT_EQ(PullAll(3), at_checkpoint);
  // The trainer registers again as it was and is told where to resume.
  absl::StatusOr<v1::RegisterResponse> again = client_->Register(ForRank(spec_, 0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->next_step(), 3);
  EXPECT_EQ(again->version(), 3);
  for (int64_t step = 3; step < 5; ++step) RunStep(step);
  EXPECT_EQ(PullAll(5), trained_on);
}

TEST_F(CheckpointRpcTest, ADaemonStartedAgainWithItsCheckpointDirComesBackWithTheJob) {
  Start(Config());
  StartJob();
  for (int64_t step = 0; step < 2; ++step) RunStep(step);
  ASSERT_TRUE(client_->Checkpoint(kJob).ok());
  const auto at_checkpoint = PullAll(2);
  RunStep(2);  // lost with the daemon: it was not checkpointed
  Start(Config());
  EXPECT_EQ(NextStep(), 2);
  // The trainer registers again as it was, is told where to resume, and pulls that version.
  absl::StatusOr<v1::RegisterResponse> again = client_->Register(ForRank(spec_, 0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->next_step(), 2);
  EXPECT_EQ(again->version(), 2);
  EXPECT_EQ(PullAll(2), at_checkpoint);
}

// The first registration after a restore may change the world size and serve formats: the job
// is made again with them and holds the restored state. The formats it kept serve the same bytes,
// a new fp8_tensor format starts as a new job's would, and the job trains on with its new ranks.
// Once a rank has registered, or for any other field, a different description is
// FAILED_PRECONDITION naming the field.
TEST_F(CheckpointRpcTest, AfterARestoreTheWorldSizeAndServeFormatsMayChange) {
  Start(Config());
  StartJob();
  for (int64_t step = 0; step < 3; ++step) RunStep(step);
  ASSERT_TRUE(client_->Checkpoint(kJob).ok());
  const std::vector<std::vector<std::byte>> at_checkpoint = PullAll(3);
  Start(Config());

  v1::RegisterRequest other_tensors = ForRank(spec_, 0);
  other_tensors.mutable_tensors(0)->set_rows(132);
  absl::StatusOr<v1::RegisterResponse> refused = client_->Register(other_tensors);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("rows"), std::string::npos) << refused.status();

  // Two ranks; bf16 and fp8_tensor kept, fp32 and fp8_delayed dropped, mxfp8 added.
  v1::RegisterRequest wider = spec_;
  wider.set_world_size(2);
  wider.clear_serve();
  for (v1::Recipe r : {v1::RECIPE_BF16, v1::RECIPE_FP8_TENSOR, v1::RECIPE_MXFP8}) {
    *wider.add_serve() = Format(r);
  }
  for (int rank : {0, 1}) {
    absl::StatusOr<v1::RegisterResponse> registered = client_->Register(ForRank(wider, rank));
    ASSERT_TRUE(registered.ok()) << registered.status();
    EXPECT_EQ(registered->next_step(), 3);
    EXPECT_EQ(registered->version(), 3);
  }
  // The kept formats serve the checkpoint's bytes (PullAll's order: tensor, then Formats()).
  for (int t = 0; t < spec_.tensors_size(); ++t) {
    for (int f : {1, 2}) {
      Pulled pulled;
      const absl::Status status =
          client_->Pull({kJob, spec_.tensors(t).name(), Formats()[f], 3}, 20s, &pulled);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(pulled.data, at_checkpoint[static_cast<size_t>(t) * Formats().size() + f])
          << spec_.tensors(t).name() << " format " << f;
    }
    Pulled dropped;
    EXPECT_FALSE(
        client_->Pull({kJob, spec_.tensors(t).name(), Formats()[0], 3}, 1s, &dropped).ok());
  }
  // Both ranks push and commit step 3; version 4 is served in the new format.
  const StepGradients grads = RandomGradients(wider, 90);
  for (int rank : {0, 1}) {
    std::vector<std::string> mine;
    for (int i = 0; i < spec_.tensors_size(); ++i) mine.push_back(grads[i][rank]);
    ASSERT_TRUE(client_->PushGradients(kJob, rank, 3, Items(mine)).ok());
  }
  for (int rank : {0, 1}) ASSERT_TRUE(client_->Commit(kJob, rank, 3, 2e-3, 1.0).ok());
  Pulled mx;
  const absl::Status pulled = client_->Pull({kJob, "w", Format(v1::RECIPE_MXFP8), 4}, 20s, &mx);
  ASSERT_TRUE(pulled.ok()) << pulled;
  EXPECT_EQ(mx.header.version(), 4);

  // The ranks have taken the job as it now is.
  v1::RegisterRequest third = wider;
  third.set_world_size(3);
  refused = client_->Register(ForRank(third, 0));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("world_size"), std::string::npos) << refused.status();

  // A format that carries state, added at a restore, starts as a new job's: fp8_delayed (with
  // its history empty) serves the version the job restored.
  ASSERT_TRUE(client_->Checkpoint(kJob).ok());
  Start(Config());
  v1::RegisterRequest delayed = wider;
  *delayed.add_serve() = Format(v1::RECIPE_FP8_DELAYED);
  for (int rank : {0, 1}) {
    absl::StatusOr<v1::RegisterResponse> registered = client_->Register(ForRank(delayed, rank));
    ASSERT_TRUE(registered.ok()) << registered.status();
    EXPECT_EQ(registered->next_step(), 4);
  }
  Pulled fp8;
  const absl::Status got = client_->Pull({kJob, "w", Format(v1::RECIPE_FP8_DELAYED), 4}, 20s, &fp8);
  ASSERT_TRUE(got.ok()) << got;
  EXPECT_EQ(fp8.header.version(), 4);
}

// The daemon list is part of the job a checkpoint keeps: the daemon started again comes back
// with it; a rank registering another list is FAILED_PRECONDITION naming the field and showing
// both lists (a restore lets the world size change, not the list); a Restore into a job
// registered with another list is INVALID_ARGUMENT and changes nothing.
// A free TCP port of 127.0.0.1 (bound, then let go), for a daemon that restarts at its address.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  close(fd);
  return ntohs(address.sin_port);
}

TEST_F(CheckpointRpcTest, TheDaemonListComesBackWithTheJobAndMayNotChange) {
  // A job sharded over two real daemons, each at a fixed address: this one checkpoints its part
  // and restarts there; the other runs on.
  const std::string self = absl::StrCat("127.0.0.1:", FreePort());
  const std::string other = absl::StrCat("127.0.0.1:", FreePort());
  // A checkpoint of the job is every daemon's: the other one writes its part in a dir of its own.
  v1::DaemonConfig other_config = Config(/*with_dir=*/false);
  std::filesystem::create_directories(root_ + "/other");
  other_config.set_checkpoint_dir(root_ + "/other");
  other_config.set_listen(other);
  absl::StatusOr<std::unique_ptr<Server>> peer = Server::Start(other_config);
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::vector<std::string> daemons = {self, other};
  std::sort(daemons.begin(), daemons.end());
  for (const std::string& d : daemons) spec_.add_daemons(d);
  v1::DaemonConfig config = Config();
  config.set_listen(self);
  Start(config);
  StartJob();
  RunStep(0);
  ASSERT_TRUE(client_->Checkpoint(kJob).ok());
  Start(config);
  EXPECT_EQ(NextStep(), 1);
  const auto listed = [&] {
    absl::StatusOr<v1::StatusResponse> status = client_->Status(kJob);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? std::vector<std::string>(status->jobs(0).daemons().begin(),
                                                  status->jobs(0).daemons().end())
                       : std::vector<std::string>();
  };
  EXPECT_EQ(listed(), daemons);

  // Another list, sent to this daemon alone (a client would send it to each daemon it names).
  v1::RegisterRequest moved = spec_;
  moved.clear_daemons();
  std::vector<std::string> moved_list = {self, "127.0.0.1:1"};
  std::sort(moved_list.begin(), moved_list.end());
  for (const std::string& d : moved_list) moved.add_daemons(d);
  moved.set_world_size(2);
  const std::unique_ptr<v1::Control::Stub> stub = v1::Control::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::RegisterResponse response;
  const absl::Status refused =
      FromGrpcStatus(stub->Register(&context, ForRank(moved, 0), &response));
  ASSERT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find(absl::StrCat("registered with daemons [", daemons[0], ", ",
                                                daemons[1], "]; this request lists daemons [",
                                                moved_list[0], ", ", moved_list[1], "]")),
            std::string::npos)
      << refused;
  EXPECT_EQ(NextStep(), 1);
  absl::StatusOr<v1::RegisterResponse> again = client_->Register(ForRank(spec_, 0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->next_step(), 1);

  ASSERT_TRUE(client_->DeleteJob(kJob).ok());
  v1::RegisterRequest alone = spec_;
  alone.clear_daemons();
  ASSERT_TRUE(client_->Register(ForRank(alone, 0)).ok());
  absl::StatusOr<v1::RestoreResponse> restored = client_->Restore(kJob);
  ASSERT_EQ(restored.status().code(), absl::StatusCode::kInvalidArgument) << restored.status();
  EXPECT_NE(restored.status().message().find(absl::StrCat(
                "over daemons [", daemons[0], ", ", daemons[1],
                "]; the job here is registered with daemons [] (the daemon called alone): the "
                "field daemons must be the checkpoint's")),
            std::string::npos)
      << restored.status();
  EXPECT_EQ(listed(), std::vector<std::string>());
  EXPECT_EQ(NextStep(), 0);
  (*peer)->Shutdown();
}

TEST_F(CheckpointRpcTest, CheckpointsComeByThemselvesEveryNSteps) {
  v1::DaemonConfig config = Config();
  config.set_checkpoint_every_steps(2);
  config.set_keep_checkpoints(10);
  Start(config);
  StartJob();
  for (int64_t step = 0; step < 5; ++step) RunStep(step);
  EXPECT_EQ(PullAll(5).size(), 8u);
  // Steps 1 and 3 ended at versions 2 and 4, each queuing a checkpoint for the schedule's thread:
  // each holds the state after the steps committed when its writing began (so a step committed
  // in between may be in it), and the job's later steps wait while it is written.
  const std::string job_dir = root_ + "/" + kJob;
  std::vector<int64_t> versions;
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (versions.size() < 2 && std::chrono::steady_clock::now() < give_up) {
    versions.clear();
    for (const auto& entry : std::filesystem::directory_iterator(job_dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("step-", 0) == 0) versions.push_back(std::stoll(name.substr(5)));
    }
    std::this_thread::sleep_for(10ms);
  }
  std::sort(versions.begin(), versions.end());
  ASSERT_EQ(versions.size(), 2u);
  EXPECT_TRUE(versions[0] == 2 || versions[0] == 3) << versions[0];
  EXPECT_TRUE(versions[1] == 4 || versions[1] == 5) << versions[1];
  // The daemon started again takes the newest.
  Start(Config());
  EXPECT_EQ(NextStep(), versions[1]);
}

TEST_F(CheckpointRpcTest, AClientWaitsForADaemonThatComesBackUpToItsReconnectTimeout) {
  Start(Config());
  StartJob();
  RunStep(0);
  ASSERT_TRUE(client_->Checkpoint(kJob).ok());
  const std::string address = server_->address();
  ClientOptions options;
  options.address = address;
  options.transport = "inline";
  options.max_attempts = 1;
  options.reconnect_timeout = 60s;
  absl::StatusOr<std::unique_ptr<Client>> patient = Client::Connect(options);
  ASSERT_TRUE(patient.ok()) << patient.status();
  options.reconnect_timeout = 0ms;
  absl::StatusOr<std::unique_ptr<Client>> impatient = Client::Connect(options);
  ASSERT_TRUE(impatient.ok()) << impatient.status();
  client_.reset();
  server_.reset();  // the daemon is gone
  EXPECT_EQ((*impatient)->Status(kJob).status().code(), absl::StatusCode::kUnavailable);
  // It comes back at the same address half a second later, with the job from its checkpoint.
  v1::DaemonConfig config = Config();
  config.set_listen(address);
  absl::StatusOr<std::unique_ptr<Server>> restarted = absl::UnavailableError("not yet");
  std::thread restart([&] {
    std::this_thread::sleep_for(500ms);  // the time the daemon is down, not a synchronization
    restarted = Server::Start(config);
  });
  absl::StatusOr<v1::StatusResponse> status = (*patient)->Status(kJob);
  restart.join();
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->jobs(0).next_step(), 1);
}

TEST_F(CheckpointRpcTest, DamagedCheckpointsAreRefusedNamingTheFileAndTheOlderOneIsUsed) {
  Start(Config());
  StartJob();
  RunStep(0);
  absl::StatusOr<v1::CheckpointResponse> older = client_->Checkpoint(kJob);
  ASSERT_TRUE(older.ok()) << older.status();
  const auto at_older = PullAll(1);
  RunStep(1);
  absl::StatusOr<v1::CheckpointResponse> newer = client_->Checkpoint(kJob);
  ASSERT_TRUE(newer.ok()) << newer.status();
  const auto at_newer = PullAll(2);
  const std::string file = newer->path() + "/state-00000.bin";
  ASSERT_TRUE(std::filesystem::exists(file));
  {  // one bit flipped in the middle of the state
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(std::filesystem::file_size(file) / 2));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(file) / 2));
    f.write(&c, 1);
  }
  absl::StatusOr<v1::RestoreResponse> refused = client_->Restore(kJob, newer->path());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_NE(refused.status().message().find(file), std::string::npos) << refused.status();
  EXPECT_EQ(NextStep(), 2);  // nothing changed
  EXPECT_EQ(PullAll(2), at_newer);
  // A truncated file is refused the same way.
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 7);
  refused = client_->Restore(kJob, newer->path());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_EQ(
      Metric(
          R"(paramd_checkpoints_total{operation="restore",outcome="failed",training_job="durable"})"),
      2);
  // The older one still restores, and a daemon started again takes it (the newest is damaged).
  Start(Config());
  EXPECT_EQ(NextStep(), 1);
  ASSERT_TRUE(client_->Register(ForRank(spec_, 0)).ok());
  EXPECT_EQ(PullAll(1), at_older);
}

TEST_F(CheckpointRpcTest, RefusalsCarryTheirCodesAndChangeNothing) {
  Start(Config(/*with_dir=*/false));
  StartJob();
  EXPECT_EQ(client_->Checkpoint(kJob).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->Restore(kJob).status().code(), absl::StatusCode::kFailedPrecondition);

  Start(Config());
  StartJob();
  EXPECT_EQ(client_->Checkpoint("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Restore(kJob).status().code(), absl::StatusCode::kNotFound);  // none yet
  RunStep(0);
  absl::StatusOr<v1::CheckpointResponse> written = client_->Checkpoint(kJob);
  ASSERT_TRUE(written.ok()) << written.status();
  // Only the job's own checkpoints under checkpoint_dir.
  for (const std::string& path :
       {std::string("/etc"), root_, written->path() + "/..", written->path() + "/manifest.pb"}) {
    EXPECT_EQ(client_->Restore(kJob, path).status().code(), absl::StatusCode::kInvalidArgument)
        << path;
  }
  // A job collecting pushes is not replaced under its trainers.
  const StepGradients grads = RandomGradients(spec_, 99);
  ASSERT_TRUE(client_->PushGradients(kJob, 0, 1, Items({grads[0][0], grads[1][0]})).ok());
  EXPECT_EQ(client_->Restore(kJob, written->path()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(client_->Commit(kJob, 0, 1, 2e-3, 1.0).ok());
  EXPECT_EQ(PullAll(2).size(), 8u);
  // keep_checkpoints = 2: the third removes the oldest.
  ASSERT_TRUE(client_->Checkpoint(kJob).ok());
  RunStep(2);
  absl::StatusOr<v1::CheckpointResponse> third = client_->Checkpoint(kJob);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->removed(), 1);
  EXPECT_FALSE(std::filesystem::exists(written->path()));
}

}  // namespace
}  // namespace paramd
