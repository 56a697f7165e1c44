// The `shm` transport's own contract, beyond the conformance suite: segments are private to the
// daemon's user, in-place reads are leased (bytes unchanged while the lease lasts, freed when it
// ends, by release or by expiry), and a killed daemon's segments are removed at the next start.
#include <fcntl.h>
#include <grp.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "paramd/v1/data.grpc.pb.h"
#include "server/job/job_memory.h"
#include "server/rpc/server.h"
#include "tests/integration/daemon_process.h"
#include "tests/unit/server/status_assertions.h"

extern char** environ;

namespace paramd {
namespace {

using std::chrono::milliseconds;
using testing::HasStatus;

// The segments an Attach names: job `job`'s (regions), or with no job the probe's.
absl::StatusOr<std::vector<std::string>> AskSegments(const std::string& address,
                                                     const std::string& job = "") {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::Data::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::AttachRequest request;
  request.set_transport("shm");
  if (job.empty()) {
    request.mutable_probe();
  } else {
    request.set_job(job);
    request.mutable_regions();
  }
  v1::AttachResponse response;
  if (absl::Status s = FromGrpcStatus(stub->Attach(&context, request, &response)); !s.ok()) {
    return s;
  }
  return std::vector<std::string>(response.shm().segments().begin(),
                                  response.shm().segments().end());
}

std::vector<std::string> SegmentNames(const std::string& address, const std::string& job = "") {
  absl::StatusOr<std::vector<std::string>> names = AskSegments(address, job);
  EXPECT_TRUE(names.ok()) << names.status();
  return names.ok() ? *names : std::vector<std::string>();
}

bool Exists(const std::string& path) { return std::filesystem::exists(path); }
std::string DirectoryOf(const std::string& path) {
  return std::filesystem::path(path).parent_path().string();
}

// A one-rank job with one 64x64 tensor.
v1::RegisterRequest JobSpec(const std::string& job) {
  v1::RegisterRequest request;
  request.set_job(job);
  request.set_world_size(1);
  v1::TensorSpec* t = request.add_tensors();
  t->set_name("w");
  t->set_rows(64);
  t->set_cols(64);
  t->set_grad_type(v1::ELEMENT_TYPE_FP32);
  v1::AdamwHyperparams* hyper = request.mutable_hyperparams();
  hyper->set_lr(1e-2);
  hyper->set_beta1(0.9);
  hyper->set_beta2(0.999);
  hyper->set_eps(1e-8);
  hyper->set_weight_decay(0.01);
  return request;
}

class ShmTest : public ::testing::Test {
 protected:
  // Starts the daemon on `listen` (shm on, by default).
  void StartServer(const std::string& listen) {
    v1::DaemonConfig config;
    config.set_listen(listen);
    config.set_metrics_listen("");
    config.set_step_threads(2);
    config.set_log_level("warning");
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartServer("127.0.0.1:0"));
    ClientOptions options;
    options.address = server_->address();
    options.transport = "shm";
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->Shutdown();
  }

  // Registers job "j" and uploads its weights.
  void StartJob() {
    absl::StatusOr<v1::RegisterResponse> registered = client_->Register(JobSpec("j"));
    ASSERT_TRUE(registered.ok()) << registered.status();
    ASSERT_EQ(client_->transport_name(), "shm");
    weights_.assign(64 * 64, 0.5f);
    const PushItem items[] = {{"w", std::as_bytes(std::span<const float>(weights_))}};
    ASSERT_TRUE(client_->UploadInitialWeights("j", items).ok());
  }

  void Step(int64_t step) {
    std::vector<float> grad(64 * 64, 0.01f * static_cast<float>(step + 1));
    const PushItem items[] = {{"w", std::as_bytes(std::span<const float>(grad))}};
    const absl::Status pushed = client_->PushGradients("j", 0, step, items);
    ASSERT_TRUE(pushed.ok()) << pushed;
    const absl::StatusOr<v1::CommitResponse> committed = client_->Commit("j", 0, step);
    ASSERT_TRUE(committed.ok()) << committed.status();
  }

  v1::JobStatus JobStatus() {
    absl::StatusOr<v1::StatusResponse> status = client_->Status("j");
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() && status->jobs_size() == 1 ? status->jobs(0) : v1::JobStatus();
  }

  // Release is sent without waiting (the daemon ends the lease as the call arrives), so a test
  // that counts leases after one waits for the count to get there.
  bool LeasesReach(int64_t count) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (JobStatus().leases() != count) {
      if (std::chrono::steady_clock::now() >= give_up) return false;
      std::this_thread::sleep_for(milliseconds(2));
    }
    return true;
  }

  // Job "j"'s rank 0 slot places of `step`, asked over `stub`.
  static absl::Status AttachStep(v1::Data::Stub& stub, int64_t step, v1::AttachResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::AttachRequest request;
    request.set_job("j");
    request.set_rank(0);
    request.set_transport("shm");
    request.mutable_slots()->set_step(step);
    return FromGrpcStatus(stub.Attach(&context, request, response));
  }

  // paramd_pushed_bytes_total{transport="shm"} as the daemon exports it; -1 where it has none.
  double ShmPushedBytes() {
    const std::string text =
        prometheus::TextSerializer().Serialize(server_->daemon().metrics().registry().Collect());
    const std::string series = "paramd_pushed_bytes_total{transport=\"shm\"} ";
    const size_t at = text.find(series);
    return at == std::string::npos ? -1 : std::stod(text.substr(at + series.size()));
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
  std::vector<float> weights_;
};

TEST_F(ShmTest, SegmentsAndTheirDirectoryAreOwnerOnly) {
  StartJob();
  std::vector<std::string> names = SegmentNames(server_->address(), "j");
  ASSERT_FALSE(names.empty());
  for (const std::string& name : SegmentNames(server_->address())) names.push_back(name);
  for (const std::string& name : names) {
    struct stat st;
    ASSERT_EQ(stat(name.c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << name;
    EXPECT_EQ(st.st_uid, geteuid()) << name;
    ASSERT_EQ(stat(DirectoryOf(name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 0777, 0700u) << name;
  }
}

TEST_F(ShmTest, EachJobHasSegmentsOfItsOwnNamedToItAloneThatGoWithTheJob) {
  StartJob();
  ClientOptions options;
  options.address = server_->address();
  options.transport = "shm";
  absl::StatusOr<std::unique_ptr<Client>> other = Client::Connect(options);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE((*other)->Register(JobSpec("k")).ok());
  ASSERT_EQ((*other)->transport_name(), "shm");
  const PushItem items[] = {{"w", std::as_bytes(std::span<const float>(weights_))}};
  ASSERT_TRUE((*other)->UploadInitialWeights("k", items).ok());
  ASSERT_NO_FATAL_FAILURE(Step(0));

  const std::vector<std::string> j = SegmentNames(server_->address(), "j");
  const std::vector<std::string> k = SegmentNames(server_->address(), "k");
  const std::vector<std::string> probe = SegmentNames(server_->address());
  ASSERT_FALSE(j.empty());
  ASSERT_FALSE(k.empty());
  for (const std::string& name : j) {
    EXPECT_EQ(std::count(k.begin(), k.end(), name), 0) << name << " is named to both jobs";
    EXPECT_EQ(std::count(probe.begin(), probe.end(), name), 0) << name << " is named to a probe";
  }
  EXPECT_TRUE(HasStatus(AskSegments(server_->address(), "nope"), absl::StatusCode::kNotFound,
                        "no job \"nope\""));
  // Job k goes, and its segments with it; job j keeps its own and steps on.
  other->reset();
  ASSERT_TRUE(client_->DeleteJob("k").ok());
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::any_of(k.begin(), k.end(), Exists) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  for (const std::string& name : k) EXPECT_FALSE(Exists(name)) << name << " outlived its job";
  for (const std::string& name : j) EXPECT_TRUE(Exists(name)) << name;
  ASSERT_NO_FATAL_FAILURE(Step(1));
  Pulled pulled;
  ASSERT_TRUE(client_->Pull({"j", "w", {}, 2}, milliseconds(10000), &pulled).ok());
  EXPECT_EQ(pulled.header.version(), 2);
}

TEST_F(ShmTest, AProcessOfAnotherUserCannotOpenTheSegments) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to run a child as another user (nobody); the owner-only mode is "
                    "checked by SegmentsAreOwnerOnly";
  }
  StartJob();
  for (const std::string& name : SegmentNames(server_->address(), "j")) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // Only async-signal-safe calls in the child of a threaded process.
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
      const int ro = open(name.c_str(), O_RDONLY);
      const int ro_errno = errno;
      const int rw = open(name.c_str(), O_RDWR);
      const int rw_errno = errno;
      _exit(ro < 0 && ro_errno == EACCES && rw < 0 && rw_errno == EACCES ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "user nobody " << (WEXITSTATUS(status) == 2 ? "could not be become" : "opened ") << name;
  }
}

TEST_F(ShmTest, InPlaceReadsStayUnchangedUnderTheirLeaseWhileStepsRun) {
  StartJob();
  PullTarget target{"j", "w", {}, 0};
  absl::StatusOr<PulledView> view =
      client_->PullInPlace(target, milliseconds(10000), milliseconds(60000));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->header.version(), 0);
  const std::vector<std::byte> version0(view->data.begin(), view->data.end());
  ASSERT_EQ(version0.size(), weights_.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(version0.data(), weights_.data(), version0.size()), 0);
  EXPECT_EQ(JobStatus().leases(), 1);

  for (int64_t step = 0; step < 3; ++step) Step(step);
  absl::StatusOr<PulledView> latest =
      client_->PullInPlace({"j", "w", {}, 3}, milliseconds(10000), milliseconds(60000));
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->header.version(), 3);
  EXPECT_NE(std::memcmp(latest->data.data(), version0.data(), version0.size()), 0);
  EXPECT_EQ(JobStatus().leases(), 2);
  ASSERT_TRUE(client_->Release(*latest).ok());
  // Three steps later, the leased version 0 is still there, byte for byte.
  EXPECT_EQ(std::memcmp(view->data.data(), version0.data(), version0.size()), 0);

  ASSERT_TRUE(client_->Release(*view).ok());
  EXPECT_TRUE(LeasesReach(0)) << "leases: " << JobStatus().leases();
}

TEST_F(ShmTest, ALeaseNobodyReleasesExpires) {
  StartJob();
  absl::StatusOr<PulledView> view =
      client_->PullInPlace({"j", "w", {}, 0}, milliseconds(10000), milliseconds(2000));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(JobStatus().leases(), 1);  // 2 s: room for a loaded machine between the two calls
  // The reaper ends it after its deadline (and within about a second of it).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (JobStatus().leases() != 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(JobStatus().leases(), 0);
  EXPECT_TRUE(client_->Release(*view).ok());  // releasing an expired lease is harmless
}

TEST_F(ShmTest, ReleasedLeasesLetTheStepReuseItsBuffers) {
  StartJob();
  constexpr int64_t kVersionBytes = 64 * 64 * sizeof(float);
  // What the shared memory in use is made of: the job's served versions, its gradient slots, and
  // the rest (constant). A step's weights are published before its gradient slots go back to the
  // spares, and a pull's server side lets go of its version a moment after its answer, so a push
  // (or the transport's look-ahead) may take another slot set, and a step another version's
  // buffers, each within the job's bound (kSlotSets, kServedVersions) on a loaded machine.
  struct Use {
    int64_t served = -1;
    int64_t rest = -1;
  };
  auto use = [this] {
    absl::StatusOr<v1::StatusResponse> status = client_->Status("j");
    if (!status.ok() || status->jobs_size() != 1) return Use{};
    const v1::JobStatus& job = status->jobs(0);
    return Use{job.served_bytes(),
               status->shm_used_bytes() - job.slot_bytes() - job.served_bytes()};
  };
  // Waiting for each step keeps the steps apart.
  auto step_and_wait = [this](int64_t step) {
    Step(step);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (JobStatus().applied_steps() < step + 1 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    ASSERT_EQ(JobStatus().applied_steps(), step + 1);
  };
  for (int64_t step = 0; step < 2; ++step) step_and_wait(step);
  const Use settled = use();
  ASSERT_GE(settled.rest, 0);
  // Every version is leased in place and released before the next step: the steps go on (a leased
  // version is never overwritten, so a version held past the bound would stop them), reusing the
  // buffers of released versions.
  for (int64_t step = 2; step < 12; ++step) {
    absl::StatusOr<PulledView> view =
        client_->PullInPlace({"j", "w", {}, step}, milliseconds(10000), milliseconds(60000));
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_TRUE(client_->Release(*view).ok());
    ASSERT_TRUE(LeasesReach(0)) << "leases: " << JobStatus().leases();
    step_and_wait(step);
    const Use now = use();
    EXPECT_LE(now.served, kServedVersions * kVersionBytes) << "after step " << step;
    EXPECT_EQ(now.rest, settled.rest) << "shared memory grew after step " << step;
  }
  Pulled last;
  ASSERT_TRUE(client_->Pull({"j", "w", {}, 12}, milliseconds(10000), &last).ok());
}

// A rank learns the next step's slot places before it commits (the transport asks once a push is
// done), so its next push writes at once; steps further ahead are refused.
TEST_F(ShmTest, TheNextStepsSlotsAreSetAsideEarly) {
  StartJob();
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Data::NewStub(channel);
  auto attach = [&](int64_t step, v1::AttachResponse* response) {
    return AttachStep(*stub, step, response);
  };
  v1::AttachResponse now, ahead, too_far, later;
  ASSERT_TRUE(attach(0, &now).ok());
  ASSERT_TRUE(attach(1, &ahead).ok());
  const absl::Status refused = attach(2, &too_far);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  ASSERT_EQ(now.slots_size(), 1);
  ASSERT_EQ(ahead.slots_size(), 1);
  EXPECT_GE(ahead.slots(0).segment(), 0);
  EXPECT_EQ(ahead.slots(0).received(), 0);
  // Step 1's slot is its own (step 0's may be written meanwhile) and is the one step 1 collects.
  EXPECT_FALSE(ahead.slots(0).segment() == now.slots(0).segment() &&
               ahead.slots(0).offset() == now.slots(0).offset());
  Step(0);
  ASSERT_TRUE(attach(1, &later).ok());
  EXPECT_EQ(later.slots(0).segment(), ahead.slots(0).segment());
  EXPECT_EQ(later.slots(0).offset(), ahead.slots(0).offset());
}

// A chunk of marks (PushChunk.marks, what the placed transports send) is taken mark by mark, as the
// same marks in chunks of their own would be: counted each, a repeat acknowledged as a duplicate,
// and the first one refused ends the stream with its status while those before it stand.
TEST_F(ShmTest, AChunkOfMarksIsTakenMarkByMarkAndTheFirstRefusedEndsTheStream) {
  StartJob();
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Data::NewStub(channel);
  v1::AttachResponse places;
  ASSERT_TRUE(AttachStep(*stub, 0, &places).ok());
  ASSERT_EQ(places.slots_size(), 1);
  const int64_t bytes = places.slots(0).bytes();
  ASSERT_EQ(bytes, 64 * 64 * 4);
  auto push = [&](v1::PushChunk chunk, v1::PushResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto writer = stub->Push(&context, response);
    chunk.set_last(true);
    writer->WriteLast(chunk, grpc::WriteOptions());
    return FromGrpcStatus(writer->Finish());
  };
  v1::PushChunk chunk;
  chunk.set_job("j");
  chunk.set_rank(0);
  chunk.set_step(0);
  chunk.set_kind(v1::PUSH_KIND_GRADIENT);
  chunk.mutable_marks();  // none
  v1::PushResponse response;
  absl::Status empty = push(chunk, &response);
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument) << empty;
  EXPECT_TRUE(absl::StrContains(empty.message(), "names none")) << empty;

  auto add = [&](const std::string& tensor, int64_t offset, int64_t length) {
    v1::InPlaceMarks::Entry* entry = chunk.mutable_marks()->add_entries();
    entry->set_tensor(tensor);
    entry->set_offset(offset);
    entry->mutable_mark()->set_bytes(length);
    entry->mutable_mark()->set_memory(v1::PLACE_MEMORY_HOST);
    entry->mutable_mark()->set_instance(places.instance());
  };
  // The first half, the first half again (a duplicate), then a tensor the job lacks.
  add("w", 0, bytes / 2);
  add("w", 0, bytes / 2);
  add("nope", 0, bytes / 2);
  add("w", bytes / 2, bytes / 2);  // never reached
  response.Clear();
  absl::Status refused = push(chunk, &response);
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "nope")) << refused;
  EXPECT_EQ(JobStatus().tensors(0).version(), 0);
  // The first half stood, the second did not: marking both now stores the second alone.
  chunk.mutable_marks()->clear_entries();
  add("w", 0, bytes / 2);
  add("w", bytes / 2, bytes / 2);
  response.Clear();
  ASSERT_TRUE(push(chunk, &response).ok());
  EXPECT_EQ(response.chunks_stored(), 1);
  EXPECT_EQ(response.chunks_duplicate(), 1);
  // Each mark stored counts its bytes once, under the transport whose memory they were written in.
  EXPECT_EQ(ShmPushedBytes(), static_cast<double>(bytes));
  const absl::StatusOr<v1::CommitResponse> committed = client_->Commit("j", 0, 0);
  ASSERT_TRUE(committed.ok()) << committed.status();
}

// A push's marks fill as many messages as the daemon's max_chunk_bytes allows (its largest
// message is 64 KiB larger): the marks of 4000 tensors, about 100 KB, against a daemon of 4 KiB
// chunks, which refuses any message over 68 KiB.
TEST_F(ShmTest, MarksOfManyTensorsTravelInMessagesTheDaemonTakes) {
  client_.reset();
  server_->Shutdown();
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_step_threads(2);
  config.set_log_level("warning");
  config.set_max_chunk_bytes(4096);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  ClientOptions options;
  options.address = server_->address();
  options.transport = "shm";
  client_ = Client::Connect(options).value();
  v1::RegisterRequest request;
  request.set_job("many");
  request.set_world_size(1);
  constexpr int kTensors = 4000;
  for (int i = 0; i < kTensors; ++i) {
    v1::TensorSpec* t = request.add_tensors();
    t->set_name("t" + std::to_string(i));
    t->set_rows(1);
    t->set_cols(64);
    t->set_grad_type(v1::ELEMENT_TYPE_FP32);
  }
  request.mutable_hyperparams()->set_lr(1e-2);
  request.mutable_hyperparams()->set_beta1(0.9);
  request.mutable_hyperparams()->set_beta2(0.999);
  request.mutable_hyperparams()->set_eps(1e-8);
  ASSERT_TRUE(client_->Register(request).ok());
  ASSERT_EQ(client_->transport_name(), "shm");
  const std::vector<float> ones(64, 1.0f);
  std::vector<PushItem> items;
  for (const v1::TensorSpec& t : request.tensors()) {
    items.push_back({t.name(), std::as_bytes(std::span<const float>(ones))});
  }
  ASSERT_TRUE(client_->UploadInitialWeights("many", items).ok());
  const absl::Status pushed = client_->PushGradients("many", 0, 0, items);
  ASSERT_TRUE(pushed.ok()) << pushed;
  ASSERT_TRUE(client_->Commit("many", 0, 0).ok());
  Pulled pulled;
  const PullTarget last{"many", request.tensors(kTensors - 1).name(), {}, 1};
  ASSERT_TRUE(client_->Pull(last, std::chrono::seconds(20), &pulled).ok());
  EXPECT_EQ(pulled.header.version(), 1);
  EXPECT_EQ(ShmPushedBytes(), kTensors * 64 * 4.0);
}

// A daemon restarted at the same address has new segments (the old ones are gone with it): the
// trainer's transport must notice, whatever it cached (mappings, slot places asked ahead), and
// neither write gradients into nor read weights from the old daemon's memory.
TEST_F(ShmTest, ARestartedDaemonIsNeverReadOrWrittenThroughTheOldOnesMemory) {
  // One step of the same job on a fresh daemon: its served version 1, copied out and in place.
  auto one_step = [this](std::vector<uint8_t>* copied, std::vector<uint8_t>* in_place) {
    StartJob();
    Step(0);
    Pulled pulled;
    ASSERT_TRUE(client_->Pull({"j", "w", {}, 1}, milliseconds(10000), &pulled).ok());
    copied->assign(reinterpret_cast<const uint8_t*>(pulled.data.data()),
                   reinterpret_cast<const uint8_t*>(pulled.data.data()) + pulled.data.size());
    absl::StatusOr<PulledView> view =
        client_->PullInPlace({"j", "w", {}, 1}, milliseconds(10000), milliseconds(60000));
    ASSERT_TRUE(view.ok()) << view.status();
    in_place->assign(reinterpret_cast<const uint8_t*>(view->data.data()),
                     reinterpret_cast<const uint8_t*>(view->data.data()) + view->data.size());
    ASSERT_TRUE(client_->Release(*view).ok());
  };
  std::vector<uint8_t> first_copied, first_in_place;
  one_step(&first_copied, &first_in_place);
  EXPECT_EQ(first_copied, first_in_place);
  // The trainer has pushed step 0 and asked for step 1's places ahead; then the daemon goes and
  // another starts on the same address (the job registered again, as after a restart without a
  // checkpoint). The client object stays.
  const std::string address = server_->address();
  server_->Shutdown();
  server_.reset();
  ASSERT_NO_FATAL_FAILURE(StartServer(address));
  std::vector<uint8_t> second_copied, second_in_place;
  one_step(&second_copied, &second_in_place);
  EXPECT_EQ(second_copied, first_copied) << "the step did not see the pushed gradient";
  EXPECT_EQ(second_in_place, first_copied);
  EXPECT_EQ(JobStatus().trainers_size(), 1) << "the new daemon was not told the transport";
}

TEST_F(ShmTest, StatusReportsEachRanksTransportAndWhy) {
  StartJob();
  const v1::JobStatus status = JobStatus();
  ASSERT_EQ(status.trainers_size(), 1);
  EXPECT_EQ(status.trainers(0).transport(), "shm");
  EXPECT_EQ(status.trainers(0).reason(), "asked for by name");
  EXPECT_TRUE(status.shared_memory());
}

// On a cpu backend the GPU transports are listed but not offered: nccl, named, is refused with the
// reason, its Attach opens no session, and the automatic choice goes on to shm saying why it
// skipped cuda_ipc and nccl.
TEST_F(ShmTest, NcclIsNotOfferedOnACpuBackendAndTheAutomaticChoiceSaysWhy) {
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  TransportContext context;
  context.channel = channel;
  std::string reason;
  const absl::StatusOr<std::unique_ptr<Transport>> named =
      ChooseTransport("nccl", context, &reason);
  ASSERT_EQ(named.status().code(), absl::StatusCode::kFailedPrecondition) << named.status();
  EXPECT_TRUE(absl::StrContains(named.status().message(), "cuda:N") ||
              absl::StrContains(named.status().message(), "without NCCL"))
      << named.status();
  auto stub = v1::Data::NewStub(channel);
  grpc::ClientContext call;
  call.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::AttachRequest open;
  open.set_transport("nccl");
  open.mutable_nccl_open();
  v1::AttachResponse response;
  const grpc::Status refused = stub->Attach(&call, open, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
  EXPECT_FALSE(response.has_nccl());
  const absl::StatusOr<std::unique_ptr<Transport>> chosen =
      ChooseTransport("auto", context, &reason);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ((*chosen)->name(), "shm");
  EXPECT_TRUE(absl::StrContains(reason, "cuda_ipc: ")) << reason;
  EXPECT_TRUE(absl::StrContains(reason, "nccl: ")) << reason;
}

TEST(ShmReclaimTest, AKilledDaemonsSegmentsAreRemovedAtTheNextStartAndACleanExitRemovesItsOwn) {
  const std::string dir = ::testing::TempDir();
  std::vector<std::string> killed_names;
  {
    testing::DaemonProcess first(PARAMD_BINARY, dir);
    killed_names = SegmentNames(first.address());
    ASSERT_FALSE(killed_names.empty());
    first.Stop(SIGKILL);
  }
  for (const std::string& name : killed_names) EXPECT_TRUE(Exists(name)) << name;
  ASSERT_FALSE(killed_names.empty());
  const std::string killed_directory = DirectoryOf(killed_names[0]);

  testing::DaemonProcess second(PARAMD_BINARY, dir);
  ASSERT_FALSE(second.address().empty());
  for (const std::string& name : killed_names) {
    EXPECT_FALSE(Exists(name)) << name << " of the killed daemon is still there";
  }
  EXPECT_FALSE(Exists(killed_directory)) << killed_directory << " of the killed daemon";
  const std::vector<std::string> own = SegmentNames(second.address());
  ASSERT_FALSE(own.empty());
  for (const std::string& name : own) EXPECT_TRUE(Exists(name)) << name;
  const int status = second.Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  for (const std::string& name : own) {
    EXPECT_FALSE(Exists(name)) << name << " outlived a clean exit";
    EXPECT_FALSE(Exists(DirectoryOf(name))) << name << "'s directory outlived a clean exit";
  }
}

TEST(ShmGroupTest, AMemberOfTheListenGroupMapsTheSegmentsItIsToldOfAndCannotListOthers) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to run a child as another user (nobody, group nogroup)";
  }
  const std::string dir = ::testing::TempDir() + "/shm_group_test." + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  v1::DaemonConfig config;
  config.set_listen("unix:" + dir + "/paramd.sock");
  config.set_listen_group("nogroup");
  config.set_metrics_listen("");
  config.set_log_level("warning");
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.address = (*server)->address();
  options.transport = "shm";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<v1::RegisterResponse> registered = (*client)->Register(JobSpec("g"));
  ASSERT_TRUE(registered.ok()) << registered.status();
  const std::vector<std::string> names = SegmentNames((*server)->address(), "g");
  ASSERT_FALSE(names.empty());
  struct stat st;
  ASSERT_EQ(stat(names[0].c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, 65534u);
  const std::string segment_dir = DirectoryOf(names[0]);
  ASSERT_EQ(stat(segment_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0710u);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls in the child of a threaded process.
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    const int told = open(names[0].c_str(), O_RDWR);
    if (told < 0) _exit(3);  // the segment it was told of
    close(told);
    const int listed = open(segment_dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (listed >= 0) {  // may open for search, never read the names
      char buffer[4096];
      if (syscall(SYS_getdents64, listed, buffer, sizeof(buffer)) >= 0) _exit(4);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << (WEXITSTATUS(status) == 2   ? "nobody:nogroup could not be become"
          : WEXITSTATUS(status) == 3 ? "a member of the group could not open its segment"
                                     : "a member of the group listed the segments");
  client->reset();
  (*server)->Shutdown();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace paramd
