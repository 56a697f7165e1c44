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
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/integration/sharded_run.h"

namespace paramd {
namespace {

using namespace std::chrono_literals;
using namespace sharded_run;

class ShardedJobTest : public ::testing::Test {
 protected:
  // peer_timeout_ms: a daemon that dies fails the rounds within seconds.
  void SetUp() override {
    ASSERT_TRUE(d_.Start("cpu", {{"cpu", 2000}, {"cpu", 5000}, {"cpu", 5000}}));
  }

  ShardedDaemons d_;
};

// Per master type: FP32, BF16 with int16 remainders, FP16.
class ShardedPolicyTest : public ShardedJobTest,
                          public ::testing::WithParamInterface<v1::MasterType> {};

TEST_P(ShardedPolicyTest, EveryStepServesTheOneDaemonJobsBytesInEveryFormat) {
  ExpectShardedRunMatchesOneDaemon(Spec(GetParam()), d_.single->address(), d_.sharded[1]->address(),
                                   d_.names, 12, StatusOf);
}

INSTANTIATE_TEST_SUITE_P(Masters, ShardedPolicyTest,
                         ::testing::Values(v1::MASTER_TYPE_FP32, v1::MASTER_TYPE_BF16_REMAINDER,
                                           v1::MASTER_TYPE_FP16),
                         [](const ::testing::TestParamInfo<v1::MasterType>& info) {
                           return std::string(v1::MasterType_Name(info.param));
                         });

// The split tensor 128 columns wide (the GPU kernels' tile path; cuda_sharded_test runs it there).
TEST_F(ShardedJobTest, AWideSplitTensorServesTheOneDaemonJobsBytesInEveryFormat) {
  ExpectShardedRunMatchesOneDaemon(Spec(v1::MASTER_TYPE_FP32, 128), d_.single->address(),
                                   d_.sharded[0]->address(), d_.names, 6, StatusOf);
}

// The whole fields of a state, compared one by one.
void ExpectSameState(const JobState& got, const JobState& want) {
  EXPECT_EQ(got.job, want.job);
  EXPECT_EQ(got.next_step, want.next_step);
  EXPECT_EQ(got.applied_steps, want.applied_steps);
  EXPECT_EQ(got.skipped_steps, want.skipped_steps);
  EXPECT_EQ(got.seed, want.seed);
  EXPECT_EQ(got.hyperparams.ShortDebugString(), want.hyperparams.ShortDebugString());
  EXPECT_EQ(got.state_policy.ShortDebugString(), want.state_policy.ShortDebugString());
  ASSERT_EQ(got.fields.size(), want.fields.size());
  for (size_t i = 0; i < want.fields.size(); ++i) {
    SCOPED_TRACE(absl::StrCat(want.fields[i].tensor, " ", want.fields[i].field));
    EXPECT_EQ(got.fields[i].tensor, want.fields[i].tensor);
    EXPECT_EQ(got.fields[i].field, want.fields[i].field);
    EXPECT_EQ(got.fields[i].type, want.fields[i].type);
    EXPECT_EQ(got.fields[i].shape, want.fields[i].shape);
    EXPECT_TRUE(got.fields[i].bytes == want.fields[i].bytes);
  }
}

// The whole job's state from the daemons' parts is the one daemon's, field for field (the split
// tensor's rows, chunk scales and fp8 scalars included); imported back, cut into the parts, the
// job trains on bit-identically. A hyperparameter change reaches every daemon.
TEST_F(ShardedJobTest, TheWholeStateExportsFromAndImportsIntoEveryDaemonsPart) {
  const v1::RegisterRequest spec = Spec(v1::MASTER_TYPE_BF16_REMAINDER);
  Trainers one(spec, d_.single->address(), {});
  Trainers three(spec, d_.sharded[1]->address(), d_.names);
  ASSERT_TRUE(one.ok() && three.ok());
  std::vector<std::string> weights;
  for (const std::vector<float>& w : RandomWeights(spec, 5)) weights.push_back(ToBytes(w));
  ASSERT_TRUE(one.Upload(weights).ok());
  ASSERT_TRUE(three.Upload(weights).ok());
  v1::SetHyperparamsRequest lr;
  lr.set_job(kJob);
  lr.set_lr(3e-3);
  for (int64_t step = 0; step < 3; ++step) {
    if (step == 1) {
      ASSERT_TRUE(one.rank(0).SetHyperparams(lr).ok());
      const absl::StatusOr<v1::SetHyperparamsResponse> set = three.rank(0).SetHyperparams(lr);
      ASSERT_TRUE(set.ok()) << set.status();
    }
    const StepGradients grads = RandomGradients(spec, 100 + static_cast<uint64_t>(step));
    ASSERT_TRUE(one.Step(step, grads).ok());
    ASSERT_TRUE(three.Step(step, grads).ok());
  }
  ASSERT_TRUE(one.Pull(spec.serve(0), 3).ok());
  ASSERT_TRUE(three.Pull(spec.serve(0), 3).ok());
  // Every daemon took the new learning rate.
  for (const std::string& name : d_.names) {
    const absl::StatusOr<v1::JobStatus> status = StatusOf(name);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->hyperparams().lr(), 3e-3) << name;
  }
  const absl::StatusOr<JobState> want = one.rank(0).ExportState(kJob);
  ASSERT_TRUE(want.ok()) << want.status();
  const absl::StatusOr<JobState> got = three.rank(0).ExportState(kJob);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->next_step, 3);
  ExpectSameState(*got, *want);

  // A state the job cannot take is refused whole, before any daemon imports a part.
  JobState bad = *got;
  bad.fields.back().shape.push_back(1);
  bad.fields.back().bytes.resize(bad.fields.back().bytes.size());
  JobState twisted = *got;
  twisted.fields[0].shape = {16, 600};  // embed's master, transposed
  for (const JobState* refused : {&twisted}) {
    const absl::Status status = three.rank(0).ImportState(*refused);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_NE(status.message().find("\"embed\""), std::string::npos) << status;
  }

  // Two more steps, then the state of step 3 back in: the same two steps again serve the one
  // daemon's bytes.
  for (int64_t step = 3; step < 5; ++step) {
    ASSERT_TRUE(three.Step(step, RandomGradients(spec, 100 + static_cast<uint64_t>(step))).ok());
  }
  ASSERT_TRUE(three.Pull(spec.serve(0), 5).ok());
  const absl::Status imported = three.rank(0).ImportState(*got);
  ASSERT_TRUE(imported.ok()) << imported;
  for (int64_t step = 3; step < 5; ++step) {
    const StepGradients grads = RandomGradients(spec, 200 + static_cast<uint64_t>(step));
    ASSERT_TRUE(one.Step(step, grads).ok());
    ASSERT_TRUE(three.Step(step, grads).ok());
  }
  for (const v1::ServeFormat& format : spec.serve()) {
    SCOPED_TRACE(format.ShortDebugString());
    absl::StatusOr<std::vector<Pulled>> a = one.Pull(format, 5);
    absl::StatusOr<std::vector<Pulled>> b = three.Pull(format, 5);
    ASSERT_TRUE(a.ok() && b.ok());
    for (size_t i = 0; i < a->size(); ++i) {
      EXPECT_EQ((*b)[i].header.version(), 5);
      EXPECT_TRUE((*a)[i].data == (*b)[i].data) << i;
    }
  }
  const absl::StatusOr<JobState> after = three.rank(0).ExportState(kJob);
  ASSERT_TRUE(after.ok()) << after.status();
  const absl::StatusOr<JobState> after_one = one.rank(0).ExportState(kJob);
  ASSERT_TRUE(after_one.ok()) << after_one.status();
  ExpectSameState(*after, *after_one);
}

TEST_F(ShardedJobTest, InPlacePiecesViewEachOwnersRowsUnchangedUnderTheirLeases) {
  const v1::RegisterRequest spec = Spec();
  Trainers one(spec, d_.single->address(), {});
  Trainers three(spec, d_.sharded[1]->address(), d_.names, 20, "shm");
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
  // Every tensor at once (one in-place pull per owner): a whole tensor one view, "embed" its three
  // pieces in row order, each from its owner, all of version 3, the one daemon's bytes.
  ASSERT_TRUE(one.Step(2, RandomGradients(spec, 102)).ok());
  absl::StatusOr<std::vector<Pulled>> want3 = one.Pull(fp32, 3);
  ASSERT_TRUE(want3.ok()) << want3.status();
  PullManyTarget all{kJob, {"b", "embed", "w", "v"}, fp32, 3};
  absl::StatusOr<std::vector<PulledView>> many = three.rank(1).PullInPlaceMany(all, 20s);
  ASSERT_TRUE(many.ok()) << many.status();
  ASSERT_EQ(many->size(), 6u);
  const std::vector<int> tensor_of = {3, 0, 0, 0, 1, 2};  // spec order: embed, w, v, b
  std::set<int> embed_owners;
  for (size_t i = 0; i < many->size(); ++i) {
    const PulledView& v = (*many)[i];
    const std::vector<std::byte>& of = (*want3)[static_cast<size_t>(tensor_of[i])].data;
    EXPECT_EQ(v.header.version(), 3);
    const int64_t row_bytes = v.header.data_bytes() / v.header.rows();
    EXPECT_TRUE(std::memcmp(v.data.data(), of.data() + v.row_begin * row_bytes,
                            static_cast<size_t>(v.header.data_bytes())) == 0)
        << i;
    if (tensor_of[i] == 0) embed_owners.insert(v.owner);
  }
  EXPECT_EQ((*many)[1].row_begin, 0);
  EXPECT_GT((*many)[2].row_begin, 0);
  EXPECT_GT((*many)[3].row_begin, (*many)[2].row_begin);
  EXPECT_EQ(embed_owners.size(), 3u);
  EXPECT_TRUE(three.rank(1).Release(*many).ok());
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
    absl::StatusOr<std::vector<Pulled>> at_three = three.Pull(spec.serve(0), 3);
    ASSERT_TRUE(at_three.ok()) << at_three.status();
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
    // The job steps on from there (its daemons' agreement rounds of step 2 start afresh), to the
    // same version 3.
    const absl::Status stepped = three.Step(2, RandomGradients(spec, 102));
    ASSERT_TRUE(stepped.ok()) << stepped;
    absl::StatusOr<std::vector<Pulled>> three_again = three.Pull(spec.serve(0), 3);
    ASSERT_TRUE(three_again.ok()) << three_again.status();
    for (size_t i = 0; i < three_again->size(); ++i) {
      EXPECT_EQ((*three_again)[i].data, (*at_three)[i].data) << i;
    }
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
  Trainers three(spec, d_.sharded[1]->address(), d_.names, /*attempts=*/1);
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
  const std::string dead_name = d_.sharded[dead]->daemon().advertised_address();
  d_.sharded[dead]->Shutdown();
  d_.sharded[dead].reset();
  // Its push fails at once; the others' parts still take theirs, and the step agreement waits for
  // the dead daemon until the deadline.
  const auto started = std::chrono::steady_clock::now();
  (void)three.Step(1, RandomGradients(spec, 2));
  size_t waiter = 0;  // d_.sharded[0] has peer_timeout_ms = 2000
  absl::Status failed;
  while (std::chrono::steady_clock::now() - started < 20s) {
    failed = d_.sharded[waiter]->daemon().registry().Find(kJob).value()->CheckUsable();
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
