// The step coordinator (Job) on a real CpuBackend: pushes in any order give bit-identical weights
// equal to the independent reference (DESIGN.md §2: rank-ordered sums), hyper-parameters,
// idempotent retries, waiting pulls, version 0 and Status.
#include "server/job/job.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <deque>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tests/unit/server/job_harness.h"
#include "tests/unit/server/reference_job.h"

namespace paramd {
namespace {

using testing::BitIdentical;
using testing::ForRank;
using testing::HasStatus;
using testing::JobHarness;
using testing::MakeSpec;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::ReferenceJob;
using testing::RunTakenStep;
using testing::StepGradients;
using testing::ToBytes;

// Odd shapes: partial SIMD vectors and thread-pool blocks everywhere.
v1::RegisterRequest ThreeRankSpec(v1::ElementType type, const std::string& job = "job") {
  return MakeSpec(job, 3, {{"embed", 7, 33, type}, {"proj", 1, 129, type}, {"head", 19, 64, type}});
}

uint64_t GradSeed(int64_t step) { return 1000 + static_cast<uint64_t>(step); }

// ---------------------------------------------------------------------------------------------
// Arrival order does not change a bit.

// The lr and grad_scale every rank sends at `step` (unset on some steps).
std::optional<double> StepLr(int64_t step) {
  return step % 3 == 2 ? std::nullopt : std::optional<double>(1e-3 * (1.0 + 0.1 * step));
}
std::optional<double> StepGradScale(int64_t step) {
  return step % 4 == 1 ? std::nullopt : std::optional<double>(1.0 / 3.0 + 0.01 * step);
}

// One thing that reaches the job: a chunk, a commit, or the executor running the oldest taken step.
struct Event {
  enum Kind { kPush, kCommit } kind = kPush;
  int rank = 0;
  int tensor = 0;
  int64_t offset = 0;
  int64_t length = 0;
  double time = 0;  // events happen in time order
};

// Splits [0, bytes) into chunks at random element boundaries.
std::vector<std::pair<int64_t, int64_t>> RandomChunks(std::mt19937_64& rng, int64_t bytes,
                                                      int64_t element) {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  std::uniform_int_distribution<int64_t> elements(1, 48);
  for (int64_t offset = 0; offset < bytes;) {
    const int64_t length = std::min(bytes - offset, elements(rng) * element);
    chunks.emplace_back(offset, length);
    offset += length;
  }
  return chunks;
}

class JobArrivalOrderTest : public ::testing::TestWithParam<v1::ElementType> {};

TEST_P(JobArrivalOrderTest, ShuffledArrivalOrdersGiveBitIdenticalMasterWeights) {
  constexpr int kSteps = 24;
  constexpr int kOrders = 16;
  const v1::RegisterRequest spec = ThreeRankSpec(GetParam());
  const int ranks = spec.world_size();
  const int tensors = spec.tensors_size();
  const std::vector<std::vector<float>> initial = RandomWeights(spec, 7);
  std::vector<StepGradients> grads;
  ReferenceJob reference(spec, initial);
  for (int64_t s = 0; s < kSteps; ++s) {
    grads.push_back(RandomGradients(spec, GradSeed(s)));
    reference.Step(grads.back(), StepLr(s), StepGradScale(s).value_or(1.0));
  }

  for (int order = 0; order < kOrders; ++order) {
    SCOPED_TRACE(::testing::Message() << "arrival order " << order);
    std::mt19937_64 rng(order);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    JobHarness h(spec);
    std::vector<int> rank_order(static_cast<size_t>(ranks));
    std::iota(rank_order.begin(), rank_order.end(), 0);
    std::shuffle(rank_order.begin(), rank_order.end(), rng);
    for (int r : rank_order) ASSERT_TRUE(h.Register(r).ok());

    // Initial weights: random chunks in random order, some sent twice.
    std::vector<Event> uploads;
    for (int i = 0; i < tensors; ++i) {
      for (auto [offset, length] : RandomChunks(rng, testing::Elements(spec.tensors(i)) * 4, 4)) {
        uploads.push_back({Event::kPush, 0, i, offset, length});
        if (unit(rng) < 0.1) uploads.push_back(uploads.back());
      }
    }
    std::shuffle(uploads.begin(), uploads.end(), rng);
    for (const Event& e : uploads) {
      const std::string bytes = ToBytes(initial[static_cast<size_t>(e.tensor)]);
      ASSERT_TRUE(h.Push(0, 0, spec.tensors(e.tensor).name(), e.offset,
                         std::string_view(bytes).substr(e.offset, e.length),
                         v1::PUSH_KIND_INITIAL_WEIGHTS)
                      .ok());
    }

    // Steps handed over by a last commit, run in step order at random later moments, so the
    // next step's chunks and commits arrive while earlier steps wait or run.
    std::deque<StepWork> taken;
    auto maybe_run = [&](double probability) {
      while (!taken.empty() && unit(rng) < probability) {
        RunTakenStep(h.job(), taken.front());
        taken.pop_front();
      }
    };
    for (int64_t s = 0; s < kSteps; ++s) {
      std::vector<Event> events;
      std::vector<double> last_push(static_cast<size_t>(ranks), 0.0);
      for (int r = 0; r < ranks; ++r) {
        for (int i = 0; i < tensors; ++i) {
          const int64_t element = testing::GradElementBytes(spec.tensors(i).grad_type());
          for (auto [offset, length] :
               RandomChunks(rng, testing::Elements(spec.tensors(i)) * element, element)) {
            const double time = unit(rng);
            events.push_back({Event::kPush, r, i, offset, length, time});
            last_push[r] = std::max(last_push[r], time);
            if (unit(rng) < 0.05) {  // a retried chunk, later but before the rank commits
              const double retry = time + 0.5 * (1.0 - time);
              events.push_back({Event::kPush, r, i, offset, length, retry});
              last_push[r] = std::max(last_push[r], retry);
            }
          }
        }
      }
      for (int r = 0; r < ranks; ++r) {
        const double time = last_push[r] + unit(rng) * (1.0 - last_push[r]) + 1e-9;
        events.push_back({Event::kCommit, r, 0, 0, 0, time});
        if (unit(rng) < 0.2) events.push_back({Event::kCommit, r, 0, 0, 0, time + 1e-9});
      }
      std::sort(events.begin(), events.end(),
                [](const Event& a, const Event& b) { return a.time < b.time; });
      for (const Event& e : events) {
        if (e.kind == Event::kPush) {
          const std::string& bytes = grads[s][e.tensor][e.rank];
          const absl::StatusOr<ChunkBuffer::Stored> stored =
              h.Push(e.rank, s, spec.tensors(e.tensor).name(), e.offset,
                     std::string_view(bytes).substr(e.offset, e.length));
          ASSERT_TRUE(stored.ok()) << stored.status();
        } else {
          absl::StatusOr<CommitOutcome> outcome = h.Commit(e.rank, s, StepLr(s), StepGradScale(s));
          ASSERT_TRUE(outcome.ok()) << outcome.status();
          if (outcome->work) {
            EXPECT_EQ(outcome->work->step, s);
            taken.push_back(*outcome->work);
          }
        }
        maybe_run(0.02);
      }
    }
    maybe_run(1.0);

    const v1::JobStatus status = h.job().Status();
    EXPECT_EQ(status.next_step(), kSteps);
    EXPECT_EQ(status.applied_steps(), kSteps);
    for (int i = 0; i < tensors; ++i) {
      SCOPED_TRACE(spec.tensors(i).name());
      EXPECT_EQ(status.tensors(i).version(), kSteps);
      EXPECT_TRUE(BitIdentical(h.Master(i), reference.master(i)));
      EXPECT_TRUE(BitIdentical(h.Bf16(i), reference.Bf16(i)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GradTypes, JobArrivalOrderTest,
                         ::testing::Values(v1::ELEMENT_TYPE_FP32, v1::ELEMENT_TYPE_BF16),
                         [](const ::testing::TestParamInfo<v1::ElementType>& info) {
                           return info.param == v1::ELEMENT_TYPE_FP32 ? "Fp32Slots" : "Bf16Slots";
                         });

// ---------------------------------------------------------------------------------------------
// A job with its weights uploaded, every rank registered.

class JobTest : public ::testing::Test {
 protected:
  JobTest()
      : spec_(ThreeRankSpec(v1::ELEMENT_TYPE_FP32)),
        initial_(RandomWeights(spec_, 3)),
        h_(spec_),
        reference_(spec_, initial_) {}

  void SetUp() override {
    ASSERT_TRUE(h_.RegisterAll().ok());
    ASSERT_TRUE(h_.UploadWeights(initial_).ok());
  }

  // Runs step `step` on the job and the reference and compares every tensor bit for bit.
  void StepBoth(int64_t step, std::optional<double> commit_lr, double reference_lr,
                std::optional<double> grad_scale = std::nullopt) {
    const StepGradients grads = RandomGradients(spec_, GradSeed(step));
    ASSERT_TRUE(h_.RunFullStep(step, grads, commit_lr, grad_scale).ok());
    reference_.Step(grads, reference_lr, grad_scale.value_or(1.0));
    ExpectMatchesReference();
  }

  void ExpectMatchesReference() {
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      EXPECT_TRUE(BitIdentical(h_.Master(i), reference_.master(i))) << spec_.tensors(i).name();
    }
  }

  const v1::RegisterRequest spec_;
  const std::vector<std::vector<float>> initial_;
  JobHarness h_;
  ReferenceJob reference_;
};

TEST_F(JobTest, CommitLrOverridesTheJobLrAndSetHyperparamsSetsTheDefault) {
  StepBoth(0, 1e-2, 1e-2);  // commit lr wins over the registered 1e-3
  StepBoth(1, std::nullopt, 1e-3);

  v1::SetHyperparamsRequest set;
  set.set_job("job");
  set.set_lr(5e-3);
  set.set_weight_decay(0.1);
  absl::StatusOr<v1::AdamwHyperparams> hyper = h_.job().SetHyperparams(set);
  ASSERT_TRUE(hyper.ok()) << hyper.status();
  EXPECT_EQ(hyper->lr(), 5e-3);
  EXPECT_EQ(hyper->weight_decay(), 0.1);
  EXPECT_EQ(hyper->beta2(), 0.999);  // untouched
  reference_.hyper().set_lr(5e-3);
  reference_.hyper().set_weight_decay(0.1);
  EXPECT_EQ(h_.job().Status().hyperparams().lr(), 5e-3);

  StepBoth(2, std::nullopt, 5e-3);  // the new default
  StepBoth(3, 2e-3, 2e-3);          // a commit lr still wins
  StepBoth(4, std::nullopt, 5e-3, 0.25);
}

// A step runs with the hyperparameters the job had when its last rank committed: a SetHyperparams
// that arrives while the step waits for the executor changes the next step, not this one (so the
// daemons of a sharded job, whose executors run at their own pace, step with the same values).
TEST_F(JobTest, ASetHyperparamsWhileAStepWaitsToRunChangesOnlyLaterSteps) {
  const StepGradients grads = RandomGradients(spec_, GradSeed(0));
  for (int r = 0; r < spec_.world_size(); ++r) ASSERT_TRUE(h_.PushGradients(r, 0, grads).ok());
  std::optional<StepWork> taken;
  for (int r = 0; r < spec_.world_size(); ++r) {
    absl::StatusOr<CommitOutcome> outcome = h_.Commit(r, 0, std::nullopt, std::nullopt);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    if (outcome->work) taken = outcome->work;
  }
  ASSERT_TRUE(taken.has_value());
  v1::SetHyperparamsRequest set;
  set.set_job("job");
  set.set_lr(5e-3);
  set.set_weight_decay(0.1);
  ASSERT_TRUE(h_.job().SetHyperparams(set).ok());
  RunTakenStep(h_.job(), *taken);
  reference_.Step(grads, 1e-3, 1.0);  // the registered lr and weight decay
  ExpectMatchesReference();
  reference_.hyper().set_lr(5e-3);
  reference_.hyper().set_weight_decay(0.1);
  StepBoth(1, std::nullopt, 5e-3);
}

TEST_F(JobTest, DuplicatePushIsAcknowledgedWithoutEffect) {
  const StepGradients grads = RandomGradients(spec_, GradSeed(0));
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(h_.PushGradients(r, 0, grads).ok());
  const v1::JobStatus before = h_.Snapshot();
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<ChunkBuffer::Stored> again =
        h_.Push(r, 0, "proj", 256, std::string_view(grads[1][r]).substr(256, 256));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, ChunkBuffer::Stored::kDuplicate);
  }
  EXPECT_TRUE(testing::SameStatus(h_.Snapshot(), before));
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<CommitOutcome> outcome = h_.Commit(r, 0);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    if (outcome->work) RunTakenStep(h_.job(), *outcome->work);
  }
  reference_.Step(grads, std::nullopt, 1.0);
  ExpectMatchesReference();
}

TEST_F(JobTest, DuplicateCommitIsIdempotent) {
  const StepGradients grads = RandomGradients(spec_, GradSeed(0));
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(h_.PushGradients(r, 0, grads).ok());
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<CommitOutcome> outcome = h_.Commit(1, 0, 2e-3, 0.5);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->committed_ranks, 1);
    EXPECT_FALSE(outcome->step_started);
    EXPECT_FALSE(outcome->work.has_value());
  }
  const v1::JobStatus status = h_.job().Status();
  ASSERT_EQ(status.committed_ranks_size(), 1);
  EXPECT_EQ(status.committed_ranks(0), 1);
  EXPECT_EQ(status.next_step(), 0);

  ASSERT_TRUE(h_.Commit(0, 0, 2e-3, 0.5).ok());
  absl::StatusOr<CommitOutcome> last = h_.Commit(2, 0, 2e-3, 0.5);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->committed_ranks, 3);
  EXPECT_TRUE(last->step_started);
  ASSERT_TRUE(last->work.has_value());
  EXPECT_EQ(last->work->step, 0);
  EXPECT_EQ(last->work->lr, 2e-3);
  EXPECT_EQ(last->work->grad_scale, 0.5);
  RunTakenStep(h_.job(), *last->work);
  reference_.Step(grads, 2e-3, 0.5);
  ExpectMatchesReference();
}

TEST_F(JobTest, CommitRetryAfterTheStepWasTakenOrRanSucceedsWithoutEffect) {
  const StepGradients grads = RandomGradients(spec_, GradSeed(0));
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(h_.PushGradients(r, 0, grads).ok());
  std::optional<StepWork> work;
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<CommitOutcome> outcome = h_.Commit(r, 0);
    ASSERT_TRUE(outcome.ok());
    if (outcome->work) work = outcome->work;
  }
  ASSERT_TRUE(work.has_value());
  // The step was taken but has not run: a retry is acknowledged, nothing more.
  absl::StatusOr<CommitOutcome> retry = h_.Commit(2, 0);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->committed_ranks, 3);
  EXPECT_FALSE(retry->step_started);
  EXPECT_FALSE(retry->work.has_value());

  RunTakenStep(h_.job(), *work);
  reference_.Step(grads, std::nullopt, 1.0);
  const v1::JobStatus before = h_.Snapshot();
  for (int r = 0; r < 3; ++r) {
    retry = h_.Commit(r, 0);
    ASSERT_TRUE(retry.ok()) << retry.status();
    EXPECT_EQ(retry->committed_ranks, 3);
    EXPECT_FALSE(retry->work.has_value());
  }
  EXPECT_TRUE(testing::SameStatus(h_.Snapshot(), before));
  ExpectMatchesReference();
  StepBoth(1, std::nullopt, 1e-3);
}

TEST_F(JobTest, AddWaiterFiresExactlyOnceWhenTheVersionIsPublished) {
  int fired = 0;
  const uint64_t id = h_.job().AddWaiter(1, 1, [&fired] { ++fired; });
  EXPECT_NE(id, 0u);
  const StepGradients grads = RandomGradients(spec_, GradSeed(0));
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(h_.PushGradients(r, 0, grads).ok());
  std::optional<StepWork> work;
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<CommitOutcome> outcome = h_.Commit(r, 0);
    ASSERT_TRUE(outcome.ok());
    if (outcome->work) work = outcome->work;
  }
  EXPECT_EQ(fired, 0);  // taken is not published
  ASSERT_TRUE(work.has_value());
  RunTakenStep(h_.job(), *work);
  reference_.Step(grads, std::nullopt, 1.0);
  EXPECT_EQ(fired, 1);
  EXPECT_FALSE(h_.job().RemoveWaiter(id));  // it fired: nothing to remove

  StepBoth(1, std::nullopt, 1e-3);
  EXPECT_EQ(fired, 1);

  // A version already there is not waited for: 0 and the callback is dropped.
  EXPECT_EQ(h_.job().AddWaiter(1, 2, [&fired] { ++fired; }), 0u);
  EXPECT_EQ(h_.job().AddWaiter(0, 0, [&fired] { ++fired; }), 0u);
  ASSERT_TRUE(h_.RunFullStep(2, RandomGradients(spec_, GradSeed(2))).ok());
  EXPECT_EQ(fired, 1);
}

// A trainer woken by the last tensor of a step may ask Status, export or import at once: by then
// the step counts as run.
TEST_F(JobTest, TheLastTensorsPullersSeeTheStepCountedAsRun) {
  const int last = spec_.tensors_size() - 1;
  v1::JobStatus seen;
  ASSERT_NE(h_.job().AddWaiter(last, 1, [&] { seen = h_.job().Status(); }), 0u);
  ASSERT_TRUE(h_.RunFullStep(0, RandomGradients(spec_, GradSeed(0))).ok());
  EXPECT_EQ(seen.applied_steps(), 1);
  EXPECT_EQ(seen.tensors(last).version(), 1);
  EXPECT_GT(seen.last_step_seconds(), 0);
}

TEST_F(JobTest, WaitersFireForTheirOwnTensorAndVersionOnly) {
  int tensor0_v2 = 0, tensor2_v1 = 0;
  ASSERT_NE(h_.job().AddWaiter(0, 2, [&] { ++tensor0_v2; }), 0u);
  ASSERT_NE(h_.job().AddWaiter(2, 1, [&] { ++tensor2_v1; }), 0u);
  ASSERT_TRUE(h_.RunFullStep(0, RandomGradients(spec_, GradSeed(0))).ok());
  EXPECT_EQ(tensor0_v2, 0);
  EXPECT_EQ(tensor2_v1, 1);
  ASSERT_TRUE(h_.RunFullStep(1, RandomGradients(spec_, GradSeed(1))).ok());
  EXPECT_EQ(tensor0_v2, 1);
  EXPECT_EQ(tensor2_v1, 1);
}

TEST_F(JobTest, RemoveWaiterBeforePublicationReturnsTrueAndTheCallbackNeverFires) {
  int fired = 0;
  const uint64_t id = h_.job().AddWaiter(0, 1, [&fired] { ++fired; });
  ASSERT_NE(id, 0u);
  EXPECT_TRUE(h_.job().RemoveWaiter(id));
  EXPECT_FALSE(h_.job().RemoveWaiter(id));
  ASSERT_TRUE(h_.RunFullStep(0, RandomGradients(spec_, GradSeed(0))).ok());
  ASSERT_TRUE(h_.RunFullStep(1, RandomGradients(spec_, GradSeed(1))).ok());
  EXPECT_EQ(fired, 0);
}

TEST_F(JobTest, ServedReturnsTheNewestVersionOnlyOnceItIsPublished) {
  EXPECT_EQ(h_.job().Served(0, 0)->version, 0);
  EXPECT_EQ(h_.job().Served(0, 1), nullptr);
  std::shared_ptr<const ServedTensor> leased = h_.job().Served(0, 0);
  const std::vector<uint8_t> leased_bytes = leased->Find(FormatKey{})->bytes.ToVector();
  StepBoth(0, std::nullopt, 1e-3);
  StepBoth(1, std::nullopt, 1e-3);
  StepBoth(2, std::nullopt, 1e-3);
  EXPECT_EQ(h_.job().Served(0, 1)->version, 3);  // the newest, not the lowest acceptable
  EXPECT_EQ(h_.job().Served(0, 4), nullptr);
  // A lease keeps its version's bytes unchanged while later steps publish.
  EXPECT_EQ(leased->version, 0);
  EXPECT_EQ(leased->Find(FormatKey{})->bytes.ToVector(), leased_bytes);
}

TEST_F(JobTest, StatusReportsVersionsAppliedStepsAndStateBytes) {
  v1::JobStatus s = h_.job().Status();
  EXPECT_EQ(s.name(), "job");
  EXPECT_EQ(s.world_size(), 3);
  EXPECT_EQ(s.registered_ranks_size(), 3);
  EXPECT_EQ(s.next_step(), 0);
  EXPECT_EQ(s.applied_steps(), 0);
  EXPECT_EQ(s.committed_ranks_size(), 0);
  EXPECT_EQ(s.state_policy().master(), v1::MASTER_TYPE_FP32);
  ASSERT_EQ(s.serve_size(), 2);
  EXPECT_EQ(s.serve(0).recipe(), v1::RECIPE_BF16);
  EXPECT_EQ(s.serve(1).recipe(), v1::RECIPE_FP32);
  int64_t elements = 0;
  ASSERT_EQ(s.tensors_size(), 3);
  for (int i = 0; i < 3; ++i) {
    const v1::TensorStatus& t = s.tensors(i);
    EXPECT_EQ(t.name(), spec_.tensors(i).name());
    EXPECT_EQ(t.rows(), spec_.tensors(i).rows());
    EXPECT_EQ(t.cols(), spec_.tensors(i).cols());
    EXPECT_EQ(t.grad_type(), v1::ELEMENT_TYPE_FP32);
    EXPECT_EQ(t.version(), 0);
    EXPECT_EQ(t.state_bytes(), 12 * t.rows() * t.cols());  // fp32 master, exp_avg, exp_avg_sq
    elements += t.rows() * t.cols();
  }
  EXPECT_EQ(s.state_bytes(), 12 * elements);
  EXPECT_EQ(s.served_bytes(), 6 * elements);  // version 0 in fp32 and bf16

  const StepGradients grads = RandomGradients(spec_, GradSeed(0));
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(h_.PushGradients(r, 0, grads).ok());
  ASSERT_TRUE(h_.Commit(2, 0).ok());
  ASSERT_TRUE(h_.Commit(0, 0).ok());
  s = h_.job().Status();
  EXPECT_EQ(std::vector<int32_t>(s.committed_ranks().begin(), s.committed_ranks().end()),
            (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(s.slot_bytes(), 3 * 4 * elements);  // one fp32 slot per rank
  absl::StatusOr<CommitOutcome> last = h_.Commit(1, 0);
  ASSERT_TRUE(last.ok() && last->work);
  s = h_.job().Status();
  EXPECT_EQ(s.next_step(), 1);
  EXPECT_EQ(s.applied_steps(), 0);  // taken, not run
  EXPECT_EQ(s.committed_ranks_size(), 0);
  EXPECT_EQ(s.tensors(0).version(), 0);

  RunTakenStep(h_.job(), *last->work);
  s = h_.job().Status();
  EXPECT_EQ(s.applied_steps(), 1);
  for (const v1::TensorStatus& t : s.tensors()) EXPECT_EQ(t.version(), 1);
  EXPECT_EQ(s.state_bytes(), 12 * elements);
  EXPECT_GE(s.last_step_seconds(), 0.0);
}

TEST_F(JobTest, RegisterReportsThePublishedVersionAndTheStepCollected) {
  absl::StatusOr<v1::RegisterResponse> r = h_.job().Register(ForRank(spec_, 1), 4096);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->next_step(), 0);
  EXPECT_EQ(r->version(), 0);
  EXPECT_EQ(r->max_chunk_bytes(), 4096);

  const StepGradients grads = RandomGradients(spec_, GradSeed(0));
  for (int rank = 0; rank < 3; ++rank) ASSERT_TRUE(h_.PushGradients(rank, 0, grads).ok());
  std::optional<StepWork> work;
  for (int rank = 0; rank < 3; ++rank) {
    absl::StatusOr<CommitOutcome> outcome = h_.Commit(rank, 0);
    ASSERT_TRUE(outcome.ok());
    if (outcome->work) work = outcome->work;
  }
  ASSERT_TRUE(work.has_value());
  // Step 0 is taken but not run: the job collects step 1, version 1 is not published yet.
  r = h_.job().Register(ForRank(spec_, 1), 4096);
  EXPECT_EQ(r->next_step(), 1);
  EXPECT_EQ(r->version(), 0);
  EXPECT_EQ(h_.job().Status().tensors(0).version(), 0);
  RunTakenStep(h_.job(), *work);
  r = h_.job().Register(ForRank(spec_, 1), 4096);
  EXPECT_EQ(r->next_step(), 1);
  EXPECT_EQ(r->version(), 1);
}

TEST(JobVersionZeroTest, VersionZeroServesTheInitialWeightsAndTheirBf16Cast) {
  const v1::RegisterRequest spec = MakeSpec("v0", 2, {{"w", 3, 67, v1::ELEMENT_TYPE_BF16}});
  std::vector<float> w = RandomWeights(spec, 11)[0];
  // Edges of the cast: ties to even, values that round up to the next binade, the largest finite
  // initial weights, subnormals and signed zeros.
  const std::vector<float> edges = {
      1.0f + 0x1p-8f, 1.0f + 0x3p-8f, 0x1.fffffep0f, 0x1.fffffep126f, -0x1.fffffep126f, FLT_MIN,
      0x1p-140f,      -0x1p-149f,     0.0f,          -0.0f,           65504.0f,         -3.0e-39f};
  std::copy(edges.begin(), edges.end(), w.begin());
  JobHarness h(spec);
  ASSERT_TRUE(h.RegisterAll().ok());
  EXPECT_TRUE(h.Master(0).empty());  // nothing published before the upload
  ASSERT_TRUE(h.UploadWeights({w}, 100).ok());
  EXPECT_EQ(h.job().Served(0, 0)->version, 0);
  EXPECT_TRUE(BitIdentical(h.Master(0), w));
  std::vector<uint16_t> cast;
  for (float x : w) cast.push_back(reference::Bf16FromFloat(x));
  EXPECT_TRUE(BitIdentical(h.Bf16(0), cast));
  EXPECT_EQ(h.job().Register(ForRank(spec, 1), 4096).value().version(), 0);
}

TEST(JobVersionZeroTest, VersionZeroIsPublishedOnlyWhenEveryByteArrived) {
  const v1::RegisterRequest spec = MakeSpec("v0", 1, {{"w", 1, 64, v1::ELEMENT_TYPE_FP32}});
  const std::string bytes = ToBytes(RandomWeights(spec, 1)[0]);
  JobHarness h(spec);
  ASSERT_TRUE(h.RegisterAll().ok());
  int fired = 0;
  ASSERT_NE(h.job().AddWaiter(0, 0, [&fired] { ++fired; }), 0u);
  ASSERT_TRUE(h.Push(0, 0, "w", 128, bytes.substr(128), v1::PUSH_KIND_INITIAL_WEIGHTS).ok());
  EXPECT_EQ(fired, 0);
  EXPECT_EQ(h.job().Status().tensors(0).version(), -1);
  EXPECT_EQ(h.job().Register(ForRank(spec, 0), 4096).value().version(), -1);
  ASSERT_TRUE(h.Push(0, 0, "w", 0, bytes.substr(0, 128), v1::PUSH_KIND_INITIAL_WEIGHTS).ok());
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(h.job().Status().tensors(0).version(), 0);
  EXPECT_EQ(h.job().Status().tensors(0).state_bytes(), 12 * 64);
}

// PUSH_MODE_PRE_REDUCED: the ranks reduce among themselves and one rank pushes the sum (rank 0:
// this daemon is the job's only owner); the others only commit. Reduced in the daemon's order (an
// fp32 sum in rank order), the steps are full mode's bit for bit; a push from another rank, and
// the pushing rank's commit before its push, are refused.
TEST(JobPreReducedTest, OneRankPushesTheSumAndTheStepsAreFullModes) {
  const v1::RegisterRequest full = ThreeRankSpec(v1::ELEMENT_TYPE_FP32, "full");
  v1::RegisterRequest pre = ThreeRankSpec(v1::ELEMENT_TYPE_FP32, "pre");
  pre.set_push_mode(v1::PUSH_MODE_PRE_REDUCED);
  JobHarness a(full), b(pre);
  const std::vector<std::vector<float>> initial = RandomWeights(full, 7);
  for (JobHarness* h : {&a, &b}) {
    ASSERT_TRUE(h->RegisterAll().ok());
    ASSERT_TRUE(h->UploadWeights(initial).ok());
  }
  for (int64_t step = 0; step < 4; ++step) {
    const testing::StepGradients grads = RandomGradients(full, 50 + static_cast<uint64_t>(step));
    ASSERT_TRUE(a.RunFullStep(step, grads, std::nullopt, 1.0 / 3).ok());
    EXPECT_TRUE(
        HasStatus(b.Commit(0, step), absl::StatusCode::kFailedPrecondition, "push every chunk"));
    for (int i = 0; i < full.tensors_size(); ++i) {
      const std::vector<std::string>& per_rank = grads[static_cast<size_t>(i)];
      std::vector<float> sum = testing::FromBytes<float>(per_rank[0]);
      for (int r = 1; r < 3; ++r) {
        const std::vector<float> g = testing::FromBytes<float>(per_rank[static_cast<size_t>(r)]);
        for (size_t e = 0; e < sum.size(); ++e) sum[e] += g[e];
      }
      EXPECT_TRUE(HasStatus(b.PushTensor(1, step, i, per_rank[1], 256),
                            absl::StatusCode::kFailedPrecondition, "rank 0 pushes"));
      ASSERT_TRUE(b.PushTensor(0, step, i, testing::ToBytes(sum), 256).ok());
    }
    for (int r = 2; r >= 0; --r) {
      absl::StatusOr<CommitOutcome> outcome = b.Commit(r, step, std::nullopt, 1.0 / 3);
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      if (outcome->work) testing::RunTakenStep(b.job(), *outcome->work);
    }
    for (int i = 0; i < full.tensors_size(); ++i) {
      EXPECT_TRUE(BitIdentical(b.Master(i), a.Master(i)))
          << full.tensors(i).name() << ", step " << step;
    }
  }
  EXPECT_EQ(b.job().Status().applied_steps(), 4);
}

}  // namespace
}  // namespace paramd
