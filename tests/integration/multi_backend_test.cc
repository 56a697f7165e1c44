// A daemon of several backends (DaemonConfig.backend "cpu:0,cpu:1,cpu:2"): one process, one port,
// one owner of a job's shards per backend, each addressed "host:port/BACKEND" and reached through
// the call's :authority (common/owner_address.h). A job registered with the daemon's address alone
// is sharded over its backends and serves, step by step and in every format, the bytes of the
// same job on a one-backend daemon. A backend the daemon does not hold is NOT_FOUND naming those it
// holds; the metrics of all backends are one page, each series labeled with its backend; a drain
// of one backend drains the daemon; and each backend's checkpoints come back at its restart.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/owner_address.h"
#include "tests/integration/http_get.h"
#include "tests/integration/sharded_run.h"

namespace paramd {
namespace {

using namespace sharded_run;
using paramd::testing::HttpGet;

constexpr char kBackends[] = "cpu:0,cpu:1,cpu:2";

std::unique_ptr<Server> StartBackends(const std::string& listen, const std::string& checkpoint_dir,
                                      const std::string& metrics_listen = "") {
  v1::DaemonConfig config;
  config.set_listen(listen);
  config.set_backend(kBackends);
  config.set_metrics_listen(metrics_listen);
  config.set_step_threads(3);
  config.set_memory_budget_bytes(int64_t{3} << 30);
  config.set_log_level("error");
  if (!checkpoint_dir.empty()) config.set_checkpoint_dir(checkpoint_dir);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

class MultiBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    single_ = StartDaemon(30000);
    daemon_ = StartBackends("127.0.0.1:0", "", "127.0.0.1:0");
    ASSERT_TRUE(single_ != nullptr && daemon_ != nullptr);
    ASSERT_EQ(daemon_->backends(), 3u);
    names_ = daemon_->daemon().backend_addresses();
  }
  void TearDown() override {
    if (daemon_ != nullptr) daemon_->Shutdown();
    if (single_ != nullptr) single_->Shutdown();
  }

  std::unique_ptr<Server> single_;
  std::unique_ptr<Server> daemon_;
  std::vector<std::string> names_;
};

TEST_F(MultiBackendTest, EachBackendIsAnOwnerOfItsOwnAtTheDaemonsPort) {
  const std::string& address = daemon_->daemon().advertised_address();
  EXPECT_EQ(names_, (std::vector<std::string>{
                        JoinOwnerAddress(daemon_->address(), "cpu:0"),
                        JoinOwnerAddress(daemon_->address(), "cpu:1"),
                        JoinOwnerAddress(daemon_->address(), "cpu:2"),
                    }));
  EXPECT_EQ(address, names_[0]);
  for (size_t i = 0; i < names_.size(); ++i) {
    EXPECT_EQ(daemon_->daemon(i).advertised_address(), names_[i]);
    EXPECT_EQ(daemon_->daemon(i).backend_name(), absl::StrCat("cpu:", i));
    // Each takes a third of the budget and of the step threads.
    EXPECT_EQ(daemon_->daemon(i).memory_budget().limit().host, int64_t{1} << 30);
    EXPECT_EQ(daemon_->daemon(i).config().step_threads(), 1);
    // Its Status, reached at its own address, is its own, and lists every backend's address.
    std::unique_ptr<Client> client = Connect(names_[i], {}, 5);
    ASSERT_NE(client, nullptr);
    absl::StatusOr<v1::StatusResponse> status = client->Status("");
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->backend(), absl::StrCat("cpu:", i));
    EXPECT_EQ(status->advertise_address(), names_[i]);
    EXPECT_EQ(std::vector<std::string>(status->backend_addresses().begin(),
                                       status->backend_addresses().end()),
              names_);
  }
  // The daemon's address alone reaches its first backend.
  std::unique_ptr<Client> plain = Connect(daemon_->address(), {}, 5);
  ASSERT_NE(plain, nullptr);
  absl::StatusOr<v1::StatusResponse> status = plain->Status("");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->backend(), "cpu:0");
}

TEST_F(MultiBackendTest, ABackendTheDaemonDoesNotHoldIsNotFoundNamingThoseItHolds) {
  for (const std::string backend : {"cpu:7", "cuda:0"}) {
    std::unique_ptr<Client> client = Connect(JoinOwnerAddress(daemon_->address(), backend), {}, 1);
    ASSERT_NE(client, nullptr);
    absl::StatusOr<v1::StatusResponse> status = client->Status("");
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.status().code(), absl::StatusCode::kNotFound) << status.status();
    EXPECT_TRUE(absl::StrContains(status.status().message(), names_[2])) << status.status();
    // Nothing registers there.
    absl::StatusOr<v1::RegisterResponse> registered = client->Register(ForRank(Spec(), 0));
    ASSERT_FALSE(registered.ok());
    EXPECT_EQ(registered.status().code(), absl::StatusCode::kNotFound) << registered.status();
  }
  // The first backend holds no job: the misrouted Register reached none.
  for (size_t i = 0; i < daemon_->backends(); ++i) {
    EXPECT_TRUE(daemon_->daemon(i).registry().Jobs().empty());
  }
}

TEST_F(MultiBackendTest, EveryStepServesTheOneBackendDaemonsBytesInEveryFormat) {
  // The owners named one by one.
  std::vector<std::string> sorted = names_;
  std::sort(sorted.begin(), sorted.end());
  ExpectShardedRunMatchesOneDaemon(Spec(v1::MASTER_TYPE_BF16_REMAINDER), single_->address(),
                                   daemon_->address(), sorted, 12, StatusOf);
}

TEST_F(MultiBackendTest, TheDaemonsAddressAloneShardsAJobOverItsBackends) {
  const v1::RegisterRequest spec = Spec();
  // No daemon list, and a list naming the daemon by its address: both become its backends.
  const std::string expected =
      absl::StrCat(names_[0], "=inline,", names_[1], "=inline,", names_[2], "=inline");
  {
    Trainers trainers(spec, daemon_->address(), {});
    ASSERT_TRUE(trainers.ok());
    EXPECT_EQ(trainers.rank(0).transport_name(), expected);
    EXPECT_EQ(trainers.rank(1).transport_name(), expected);
    std::vector<std::string> weights;
    for (const std::vector<float>& w : RandomWeights(spec, 5)) weights.push_back(ToBytes(w));
    ASSERT_TRUE(trainers.Upload(weights).ok());
    ASSERT_TRUE(trainers.Step(0, RandomGradients(spec, 100)).ok());
    absl::StatusOr<std::vector<Pulled>> pulled = trainers.Pull(spec.serve(0), 1);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    // Each backend holds a part of the job, none all of it; "embed" is split over all three.
    for (size_t i = 0; i < daemon_->backends(); ++i) {
      absl::StatusOr<v1::JobStatus> status = StatusOf(names_[i]);
      ASSERT_TRUE(status.ok()) << status.status();
      EXPECT_LT(status->tensors_size(), spec.tensors_size());
      EXPECT_TRUE(std::any_of(status->tensors().begin(), status->tensors().end(),
                              [](const v1::TensorStatus& t) { return t.name() == "embed"; }));
      EXPECT_EQ(status->next_step(), 1);
    }
    absl::StatusOr<v1::GetLayoutResponse> layout = trainers.rank(0).GetLayout(kJob);
    ASSERT_TRUE(layout.ok()) << layout.status();
    std::map<std::string, int> pieces;
    for (const v1::GetLayoutResponse::Placement& p : layout->placements()) {
      ++pieces[p.daemon()];
      EXPECT_EQ(p.device(), -1) << p.ShortDebugString();
    }
    EXPECT_EQ(pieces.size(), 3u);
    ASSERT_TRUE(trainers.rank(0).DeleteJob(kJob).ok());
  }
  {
    Trainers trainers(spec, daemon_->address(), {daemon_->address()});
    ASSERT_TRUE(trainers.ok());
    EXPECT_EQ(trainers.rank(0).transport_name(), expected);
  }
}

TEST_F(MultiBackendTest, TheMetricsOfEveryBackendAreOnePageLabeledByBackend) {
  {
    Trainers trainers(Spec(), daemon_->address(), {});
    ASSERT_TRUE(trainers.ok());
  }
  const std::string page = HttpGet(daemon_->metrics_address(), "/metrics");
  ASSERT_FALSE(page.empty()) << "no answer from " << daemon_->metrics_address();
  // One TYPE line per family (the text format allows no second), every backend's series in it.
  std::map<std::string, int> types;
  for (const absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::StartsWith(line, "# TYPE ")) {
      ++types[std::string(line.substr(7, line.find(' ', 7) - 7))];
    }
  }
  ASSERT_FALSE(types.empty()) << page;
  for (const auto& [family, count] : types) EXPECT_EQ(count, 1) << family;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(absl::StrContains(page, absl::StrCat("paramd_jobs{backend=\"cpu:", i, "\"} 1")))
        << page;
  }
}

TEST_F(MultiBackendTest, ADrainOfOneBackendDrainsTheDaemon) {
  std::unique_ptr<Client> client = Connect(names_[2], {}, 1);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Drain().ok());
  for (size_t i = 0; i < daemon_->backends(); ++i) EXPECT_TRUE(daemon_->daemon(i).draining()) << i;
}

// A checkpoint of a job on the daemon's backends: each backend writes its part under
// checkpoint_dir/BACKEND (':' as '_'), and a restart of the daemon at the same address restores
// every part; the job steps on to the bytes it served before.
TEST(MultiBackendCheckpointTest, EachBackendsPartComesBackAtTheDaemonsRestart) {
  char pattern[] = "/tmp/paramd-multi-backend-XXXXXX";
  const std::string root = mkdtemp(pattern);
  std::unique_ptr<Server> daemon = StartBackends("127.0.0.1:0", root);
  ASSERT_NE(daemon, nullptr);
  const std::string listen = daemon->address();
  const v1::RegisterRequest spec = Spec();
  std::vector<std::string> weights;
  for (const std::vector<float>& w : RandomWeights(spec, 5)) weights.push_back(ToBytes(w));
  absl::StatusOr<std::vector<Pulled>> at_three;
  {
    Trainers trainers(spec, listen, {});
    ASSERT_TRUE(trainers.ok());
    ASSERT_TRUE(trainers.Upload(weights).ok());
    for (int64_t step = 0; step < 2; ++step) {
      ASSERT_TRUE(
          trainers.Step(step, RandomGradients(spec, 100 + static_cast<uint64_t>(step))).ok());
    }
    ASSERT_TRUE(trainers.Pull(spec.serve(0), 2).ok());
    absl::StatusOr<v1::CheckpointResponse> written = trainers.rank(0).Checkpoint(kJob);
    ASSERT_TRUE(written.ok()) << written.status();
    EXPECT_EQ(written->version(), 2);
    for (const char* dir : {"cpu_0", "cpu_1", "cpu_2"}) {
      EXPECT_TRUE(std::filesystem::exists(absl::StrCat(root, "/", dir, "/", kJob))) << dir;
    }
    ASSERT_TRUE(trainers.Step(2, RandomGradients(spec, 102)).ok());
    at_three = trainers.Pull(spec.serve(0), 3);
    ASSERT_TRUE(at_three.ok()) << at_three.status();
  }
  daemon->Shutdown();
  daemon.reset();
  // The same address: the job's daemon list names it.
  daemon = StartBackends(listen, root);
  ASSERT_NE(daemon, nullptr);
  for (size_t i = 0; i < daemon->backends(); ++i) {
    EXPECT_TRUE(daemon->daemon(i).registry().Find(kJob).ok()) << i;
  }
  {
    Trainers trainers(spec, listen, {});
    ASSERT_TRUE(trainers.ok());
    const absl::Status stepped = trainers.Step(2, RandomGradients(spec, 102));
    ASSERT_TRUE(stepped.ok()) << stepped;
    absl::StatusOr<std::vector<Pulled>> again = trainers.Pull(spec.serve(0), 3);
    ASSERT_TRUE(again.ok()) << again.status();
    for (size_t i = 0; i < again->size(); ++i) {
      EXPECT_EQ((*again)[i].data, (*at_three)[i].data) << i;
    }
  }
  daemon->Shutdown();
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace paramd
