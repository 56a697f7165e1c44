// A job sharded over three real daemons (DESIGN.md §7) against the same job on one daemon, over
// real RPCs: three paramd::Servers on 127.0.0.1 port 0, each holding only its part of the job, and
// paramd::Client fanning out to them. Every step's served bytes of every tensor, in every format
// (fp32, bf16, fp8_tensor, fp8_delayed and the block formats, columnwise ones included), put
// together from the pieces, are bit-identical to the one daemon's: a tensor split over all three
// daemons, stochastic rounding of fp8 moments, global-norm clipping and a skipped step (a
// non-finite gradient in one daemon's rows only) included. A daemon that dies fails the job on the
// others by the deadline, naming it, and the trainers' calls end with that status.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/shard_map.h"
#include "server/registration.h"
#include "server/server.h"
#include "tests/unit/server/reference_job.h"

namespace paramd {
namespace {

using namespace std::chrono_literals;
using testing::ForRank;
using testing::MakeSpec;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::ServeFormatOf;
using testing::StepGradients;
using testing::ToBytes;

constexpr char kJob[] = "sharded";
constexpr int kWorld = 2;

// "embed" (600 x 16) weighs 3/4 of the job and is split over the three daemons; the others stay
// whole, one on each daemon. fp8 exp_avg rounded stochastically, fp16 exp_avg_sq, clipping on.
v1::RegisterRequest Spec(v1::MasterType master = v1::MASTER_TYPE_FP32) {
  v1::RegisterRequest spec = MakeSpec(kJob, kWorld,
                                      {{"embed", 600, 16, v1::ELEMENT_TYPE_FP32},
                                       {"w", 64, 32, v1::ELEMENT_TYPE_BF16},
                                       {"v", 130, 8, v1::ELEMENT_TYPE_FP32},
                                       {"b", 1, 10, v1::ELEMENT_TYPE_FP32}});
  v1::StatePolicy* policy = spec.mutable_state_policy();
  policy->set_master(master);
  policy->set_exp_avg(v1::MOMENT_TYPE_FP8);
  policy->set_exp_avg_rounding(v1::ROUNDING_STOCHASTIC);
  policy->set_exp_avg_sq(v1::MOMENT_TYPE_FP16);
  policy->set_exp_avg_sq_rounding(v1::ROUNDING_STOCHASTIC);
  spec.set_max_grad_norm(0.05);
  spec.clear_serve();
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_FP32, v1::DIRECTION_ROWWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_BF16, v1::DIRECTION_ROWWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_FP8_TENSOR, v1::DIRECTION_ROWWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_FP8_TENSOR, v1::DIRECTION_COLUMNWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_FP8_DELAYED, v1::DIRECTION_ROWWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_FP8_BLOCK, v1::DIRECTION_COLUMNWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_MXFP8, v1::DIRECTION_ROWWISE);
  return spec;
}

// A daemon on 127.0.0.1 port 0, checkpointing under `checkpoint_dir` where one is given.
std::unique_ptr<Server> StartDaemon(int peer_timeout_ms, const std::string& checkpoint_dir = "") {
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_step_threads(1);
  config.set_peer_timeout_ms(peer_timeout_ms);
  config.set_log_level("error");
  if (!checkpoint_dir.empty()) config.set_checkpoint_dir(checkpoint_dir);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<Client> Connect(const std::string& address, std::vector<std::string> daemons,
                                int attempts, const std::string& transport = "inline") {
  ClientOptions options;
  options.address = address;
  options.daemons = std::move(daemons);
  options.transport = transport;
  options.rpc_timeout = 20s;
  options.max_attempts = attempts;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// One job on a set of daemons, driven by one client per rank.
class Trainers {
 public:
  // `attempts`: ClientOptions::max_attempts. A split tensor's version 0 is made after its upload
  // returns: a push before it is UNAVAILABLE, and retried.
  Trainers(const v1::RegisterRequest& spec, const std::string& address,
           const std::vector<std::string>& daemons, int attempts = 20,
           const std::string& transport = "inline")
      : spec_(spec) {
    for (int r = 0; r < kWorld; ++r) {
      clients_.push_back(Connect(address, daemons, attempts, transport));
      if (clients_.back() == nullptr) return;
      absl::StatusOr<v1::RegisterResponse> registered = clients_.back()->Register(ForRank(spec, r));
      EXPECT_TRUE(registered.ok()) << registered.status();
    }
  }
  bool ok() const { return clients_.size() == kWorld && clients_.back() != nullptr; }
  Client& rank(int r) { return *clients_[static_cast<size_t>(r)]; }

  std::vector<PushItem> Items(const std::vector<std::string>& per_tensor) const {
    std::vector<PushItem> items;
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      items.push_back({spec_.tensors(i).name(), AsBytes(per_tensor[static_cast<size_t>(i)])});
    }
    return items;
  }
  absl::Status Upload(const std::vector<std::string>& weights) {
    return rank(0).UploadInitialWeights(kJob, Items(weights));
  }
  // Every rank pushes its gradients of `step`, then commits it; each call is made even where an
  // earlier one failed (a dead daemon's part fails, the others' go on). The first error.
  absl::Status Step(int64_t step, const StepGradients& grads) {
    absl::Status status;
    for (int r = 0; r < kWorld; ++r) {
      std::vector<std::string> mine;
      for (int i = 0; i < spec_.tensors_size(); ++i) mine.push_back(grads[i][r]);
      status.Update(rank(r).PushGradients(kJob, r, step, Items(mine)));
    }
    for (int r = 0; r < kWorld; ++r) status.Update(rank(r).Commit(kJob, r, step).status());
    return status;
  }
  // Rank 1's pull of every tensor at `version` in `format`.
  absl::StatusOr<std::vector<Pulled>> Pull(const v1::ServeFormat& format, int64_t version) {
    PullManyTarget target{kJob, {}, format, version};
    for (const v1::TensorSpec& t : spec_.tensors()) target.tensors.push_back(t.name());
    std::vector<Pulled> pulled;
    if (absl::Status s = rank(1).PullMany(target, 20s, &pulled); !s.ok()) return s;
    return pulled;
  }

 private:
  v1::RegisterRequest spec_;
  std::vector<std::unique_ptr<Client>> clients_;
};

class ShardedJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    single_ = StartDaemon(30000);
    ASSERT_NE(single_, nullptr);
    // peer_timeout_ms: a daemon that dies fails the rounds within seconds.
    for (int i = 0; i < 3; ++i) {
      daemons_.push_back(StartDaemon(i == 0 ? 2000 : 5000));
      ASSERT_NE(daemons_.back(), nullptr);
      names_.push_back(daemons_.back()->daemon().advertised_address());
    }
    std::sort(names_.begin(), names_.end());
  }
  void TearDown() override {
    for (auto& d : daemons_) {
      if (d != nullptr) d->Shutdown();
    }
    if (single_ != nullptr) single_->Shutdown();
  }

  std::unique_ptr<Server> single_;
  std::vector<std::unique_ptr<Server>> daemons_;
  std::vector<std::string> names_;  // sorted: the job's daemon list
};

// Trains `steps` steps of `spec` on the daemon at `single` and on the daemons `names` (sorted,
// reached first at `address`), and checks every served format of every tensor, byte for byte,
// after every step. `status_of` gives a daemon's Status of the job: the one-daemon job's clip, the
// sharded daemons' skipped steps.
void ExpectShardedRunMatchesOneDaemon(
    const v1::RegisterRequest& spec, const std::string& single, const std::string& address,
    const std::vector<std::string>& names, int steps,
    const std::function<absl::StatusOr<v1::JobStatus>(const std::string&)>& status_of) {
  // The layout this test means: "embed" in three pieces, one per daemon.
  v1::RegisterRequest listed = spec;
  listed.mutable_daemons()->Assign(names.begin(), names.end());
  const absl::StatusOr<ShardMap> map = JobShardMap(listed, "", kCpuDevice);
  ASSERT_TRUE(map.ok()) << map.status();
  ASSERT_EQ(map->tensors[0].size(), 3u);

  Trainers one(spec, single, {});
  Trainers three(spec, address, names);
  ASSERT_TRUE(one.ok() && three.ok());
  EXPECT_EQ(three.rank(0).transport_name(),
            absl::StrCat(names[0], "=inline,", names[1], "=inline,", names[2], "=inline"));
  // Each daemon holds its part alone: no daemon holds every tensor.
  for (const std::string& name : names) {
    const absl::StatusOr<v1::JobStatus> status = status_of(name);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_LT(status->tensors_size(), spec.tensors_size());
  }

  std::vector<std::string> weights;
  for (const std::vector<float>& w : RandomWeights(spec, 5)) weights.push_back(ToBytes(w));
  const absl::Status uploaded_one = one.Upload(weights);
  ASSERT_TRUE(uploaded_one.ok()) << uploaded_one;
  const absl::Status uploaded = three.Upload(weights);
  ASSERT_TRUE(uploaded.ok()) << uploaded;

  constexpr int kSkipped = 4;
  int clipped = 0;
  for (int64_t step = 0; step <= steps; ++step) {
    SCOPED_TRACE(absl::StrCat("version ", step));
    for (const v1::ServeFormat& format : spec.serve()) {
      absl::StatusOr<std::vector<Pulled>> want = one.Pull(format, step);
      absl::StatusOr<std::vector<Pulled>> got = three.Pull(format, step);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      for (size_t i = 0; i < want->size(); ++i) {
        SCOPED_TRACE(
            absl::StrCat(spec.tensors(static_cast<int>(i)).name(), " ", format.ShortDebugString()));
        const Pulled& w = (*want)[i];
        const Pulled& g = (*got)[i];
        EXPECT_EQ(g.header.version(), step);
        EXPECT_EQ(g.header.skipped(), w.header.skipped());
        EXPECT_EQ(g.header.rows(), w.header.rows());
        EXPECT_EQ(g.header.data_bytes(), w.header.data_bytes());
        EXPECT_EQ(g.header.scale_bytes(), w.header.scale_bytes());
        ASSERT_EQ(g.data.size(), w.data.size());
        ASSERT_TRUE(std::memcmp(g.data.data(), w.data.data(), w.data.size()) == 0);
      }
    }
    if (step == steps) break;
    StepGradients grads = RandomGradients(spec, 100 + static_cast<uint64_t>(step));
    if (step == kSkipped) {
      // Rank 1's "embed" row 590: the last piece's rows, on one daemon only.
      std::vector<float> g = testing::FromBytes<float>(grads[0][1]);
      g[590 * 16 + 3] = std::numeric_limits<float>::infinity();
      grads[0][1] = ToBytes(g);
    }
    ASSERT_TRUE(one.Step(step, grads).ok());
    ASSERT_TRUE(three.Step(step, grads).ok());
    const absl::StatusOr<v1::JobStatus> status = status_of(single);
    ASSERT_TRUE(status.ok()) << status.status();
    if (status->last_clip() < 1.0) ++clipped;
  }
  EXPECT_GT(clipped, steps / 2);  // the clip was in effect on most steps
  for (const std::string& name : names) {
    const absl::StatusOr<v1::JobStatus> status = status_of(name);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->skipped_steps(), 1);
  }
}

// A daemon's Status of the job, over RPC.
absl::StatusOr<v1::JobStatus> StatusOf(const std::string& address) {
  std::unique_ptr<Client> client = Connect(address, {}, 5);
  if (client == nullptr) return absl::UnavailableError(absl::StrCat("no daemon at ", address));
  absl::StatusOr<v1::StatusResponse> status = client->Status(kJob);
  if (!status.ok()) return status.status();
  if (status->jobs_size() != 1) return absl::NotFoundError("no job");
  return status->jobs(0);
}

// Per master type: FP32, BF16 with int16 remainders, FP16.
class ShardedPolicyTest : public ShardedJobTest,
                          public ::testing::WithParamInterface<v1::MasterType> {};

TEST_P(ShardedPolicyTest, EveryStepServesTheOneDaemonJobsBytesInEveryFormat) {
  ExpectShardedRunMatchesOneDaemon(Spec(GetParam()), single_->address(), daemons_[1]->address(),
                                   names_, 12, StatusOf);
}

INSTANTIATE_TEST_SUITE_P(Masters, ShardedPolicyTest,
                         ::testing::Values(v1::MASTER_TYPE_FP32, v1::MASTER_TYPE_BF16_REMAINDER,
                                           v1::MASTER_TYPE_FP16),
                         [](const ::testing::TestParamInfo<v1::MasterType>& info) {
                           return std::string(v1::MasterType_Name(info.param));
                         });

TEST_F(ShardedJobTest, InPlacePiecesViewEachOwnersRowsUnchangedUnderTheirLeases) {
  const v1::RegisterRequest spec = Spec();
  Trainers one(spec, single_->address(), {});
  Trainers three(spec, daemons_[1]->address(), names_, 20, "shm");
  ASSERT_TRUE(one.ok() && three.ok());
  std::vector<std::string> weights;
  for (const std::vector<float>& w : RandomWeights(spec, 5)) weights.push_back(ToBytes(w));
  ASSERT_TRUE(one.Upload(weights).ok());
  ASSERT_TRUE(three.Upload(weights).ok());
  for (int64_t step = 0; step < 2; ++step) {
    const StepGradients grads = RandomGradients(spec, 100 + static_cast<uint64_t>(step));
    const absl::Status stepped_one = one.Step(step, grads);
    ASSERT_TRUE(stepped_one.ok()) << stepped_one;
    const absl::Status stepped = three.Step(step, grads);
    ASSERT_TRUE(stepped.ok()) << stepped;
  }
  // "embed" fp32 at version 2: three views, each its owner's rows of the one daemon's bytes.
  const v1::ServeFormat fp32 = spec.serve(0);
  absl::StatusOr<std::vector<Pulled>> want = one.Pull(fp32, 2);
  ASSERT_TRUE(want.ok()) << want.status();
  const std::vector<std::byte>& whole = (*want)[0].data;
  absl::StatusOr<std::vector<PulledView>> views =
      three.rank(0).PullInPlacePieces({kJob, "embed", fp32, 2}, 20s);
  ASSERT_TRUE(views.ok()) << views.status();
  ASSERT_EQ(views->size(), 3u);
  int64_t row = 0;
  std::vector<std::vector<std::byte>> held;
  for (const PulledView& v : *views) {
    EXPECT_EQ(v.row_begin, row);
    EXPECT_EQ(v.header.version(), 2);
    const size_t bytes = static_cast<size_t>(v.header.rows() * 16 * 4);
    ASSERT_EQ(v.header.data_bytes(), static_cast<int64_t>(bytes));
    EXPECT_TRUE(std::memcmp(v.data.data(), whole.data() + row * 16 * 4, bytes) == 0);
    held.emplace_back(v.data.begin(), v.data.begin() + static_cast<std::ptrdiff_t>(bytes));
    row += v.header.rows();
  }
  EXPECT_EQ(row, 600);
  // Another step runs while the views are leased (a daemon keeps two versions of a tensor): their
  // bytes stay.
  ASSERT_TRUE(three.Step(2, RandomGradients(spec, 102)).ok());
  ASSERT_TRUE(three.Pull(fp32, 3).ok());
  for (size_t p = 0; p < views->size(); ++p) {
    EXPECT_TRUE(std::memcmp((*views)[p].data.data(), held[p].data(), held[p].size()) == 0) << p;
  }
  EXPECT_TRUE(three.rank(0).Release(*views).ok());
  // A tensor held whole is one view, from its owner.
  absl::StatusOr<std::vector<PulledView>> b =
      three.rank(0).PullInPlacePieces({kJob, "b", fp32, 3}, 20s);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 1u);
  EXPECT_EQ((*b)[0].header.rows(), 1);
  EXPECT_TRUE(three.rank(0).Release(*b).ok());
  // A split tensor is refused by PullInPlace, which gives one view.
  EXPECT_EQ(three.rank(0).PullInPlace({kJob, "embed", fp32, 3}, 20s).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ShardedCheckpointTest, ACheckpointAndRestoreOfAShardedJobTakeEveryDaemonsPart) {
  char pattern[] = "/tmp/paramd-sharded-checkpoints-XXXXXX";
  const std::string root = mkdtemp(pattern);
  std::vector<std::unique_ptr<Server>> daemons;
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) {
    const std::string dir = absl::StrCat(root, "/", i);
    std::filesystem::create_directories(dir);
    daemons.push_back(StartDaemon(30000, dir));
    ASSERT_NE(daemons.back(), nullptr);
    names.push_back(daemons.back()->daemon().advertised_address());
  }
  std::sort(names.begin(), names.end());
  {
    const v1::RegisterRequest spec = Spec();
    Trainers three(spec, names[0], names);
    ASSERT_TRUE(three.ok());
    std::vector<std::string> weights;
    for (const std::vector<float>& w : RandomWeights(spec, 5)) weights.push_back(ToBytes(w));
    ASSERT_TRUE(three.Upload(weights).ok());
    for (int64_t step = 0; step < 2; ++step) {
      ASSERT_TRUE(three.Step(step, RandomGradients(spec, 100 + static_cast<uint64_t>(step))).ok());
    }
    absl::StatusOr<std::vector<Pulled>> at_two = three.Pull(spec.serve(0), 2);
    ASSERT_TRUE(at_two.ok()) << at_two.status();
    absl::StatusOr<v1::CheckpointResponse> written = three.rank(0).Checkpoint(kJob);
    ASSERT_TRUE(written.ok()) << written.status();
    EXPECT_EQ(written->version(), 2);
    // Each daemon wrote its part.
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(std::filesystem::exists(absl::StrCat(root, "/", i, "/", kJob)));
    }
    ASSERT_TRUE(three.Step(2, RandomGradients(spec, 102)).ok());
    ASSERT_TRUE(three.Pull(spec.serve(0), 3).ok());
    absl::StatusOr<v1::RestoreResponse> restored = three.rank(0).Restore(kJob);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(restored->version(), 2);
    // Every daemon serves version 2 again: the pieces put together are the bytes pulled before.
    absl::StatusOr<std::vector<Pulled>> again = three.Pull(spec.serve(0), 2);
    ASSERT_TRUE(again.ok()) << again.status();
    for (size_t i = 0; i < again->size(); ++i) {
      EXPECT_EQ((*again)[i].header.version(), 2);
      EXPECT_EQ((*again)[i].data, (*at_two)[i].data) << i;
    }
    // A sharded job's whole state is not exported or imported from one daemon yet.
    EXPECT_EQ(three.rank(0).ExportState(kJob).status().code(), absl::StatusCode::kUnimplemented);
  }
  for (auto& d : daemons) d->Shutdown();
  std::filesystem::remove_all(root);
}

// The same over a network: tests/integration/netns_sharded_test.sh starts the three daemons and
// the one-daemon job's daemon each in a network namespace of its own, runs this test in another
// with PARAMD_NETNS_DAEMONS (the three, comma-separated) and PARAMD_NETNS_SINGLE, and the bytes
// cross veth interfaces (transport inline) for hundreds of steps (PARAMD_NETNS_STEPS).
TEST(ShardedJobOverANetworkTest, HundredsOfStepsMatchOneDaemonAcrossNamespaces) {
  const char* daemons = std::getenv("PARAMD_NETNS_DAEMONS");
  const char* single = std::getenv("PARAMD_NETNS_SINGLE");
  if (daemons == nullptr || single == nullptr) {
    GTEST_SKIP() << "run by tests/integration/netns_sharded_test.sh (ctest netns_sharded), which "
                    "sets PARAMD_NETNS_DAEMONS and PARAMD_NETNS_SINGLE";
  }
  std::vector<std::string> names = absl::StrSplit(daemons, ',');
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), 3u);
  const char* steps = std::getenv("PARAMD_NETNS_STEPS");
  ExpectShardedRunMatchesOneDaemon(Spec(), single, names[0], names, steps ? std::atoi(steps) : 300,
                                   StatusOf);
}

TEST_F(ShardedJobTest, ADeadDaemonFailsTheJobOnTheOthersByTheDeadline) {
  const v1::RegisterRequest spec = Spec();
  // No retries: a call to the dead daemon fails at once.
  Trainers three(spec, daemons_[1]->address(), names_, /*attempts=*/1);
  ASSERT_TRUE(three.ok());
  std::vector<std::string> weights;
  for (const std::vector<float>& w : RandomWeights(spec, 5)) weights.push_back(ToBytes(w));
  const absl::Status uploaded = three.Upload(weights);
  ASSERT_TRUE(uploaded.ok()) << uploaded;
  ASSERT_TRUE(three.Pull(spec.serve(0), 0).ok());  // version 0 made, as a trainer waits for it
  ASSERT_TRUE(three.Step(0, RandomGradients(spec, 1)).ok());
  ASSERT_TRUE(three.Pull(spec.serve(0), 1).ok());

  // The daemon with the 2 s peer deadline stays (the third one's is 5 s); another one dies.
  size_t dead = 1;
  const std::string dead_name = daemons_[dead]->daemon().advertised_address();
  daemons_[dead]->Shutdown();
  daemons_[dead].reset();
  // Its push fails at once; the others' parts still take theirs, and the step agreement waits for
  // the dead daemon until the deadline.
  const auto started = std::chrono::steady_clock::now();
  (void)three.Step(1, RandomGradients(spec, 2));
  size_t waiter = 0;  // daemons_[0] has peer_timeout_ms = 2000
  absl::Status failed;
  while (std::chrono::steady_clock::now() - started < 20s) {
    failed = daemons_[waiter]->daemon().registry().Find(kJob).value()->CheckUsable();
    if (!failed.ok()) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_FALSE(failed.ok()) << "the job did not fail within 20 s";
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
  EXPECT_TRUE(absl::IsAborted(failed)) << failed;
  EXPECT_NE(failed.message().find(dead_name), std::string::npos) << failed;
  EXPECT_NE(failed.message().find("holds version 1"), std::string::npos) << failed;
  // A trainer's pull now ends with the job's status instead of waiting, naming the dead daemon.
  absl::StatusOr<std::vector<Pulled>> pulled = three.Pull(spec.serve(0), 2);
  ASSERT_FALSE(pulled.ok());
  EXPECT_TRUE(absl::IsAborted(pulled.status())) << pulled.status();
  EXPECT_NE(pulled.status().message().find("failed at step 1"), std::string::npos)
      << pulled.status();
  EXPECT_NE(pulled.status().message().find(dead_name), std::string::npos) << pulled.status();
}

}  // namespace
}  // namespace paramd
