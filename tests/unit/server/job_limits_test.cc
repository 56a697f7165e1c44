// What bounds a job's memory (issue: no request can make the daemon allocate past its budget):
// the budget a Register reserves from, the footprint it reserves, the cap on gradient slot sets
// and on served versions, and the bookkeeping a many-rank job costs, measured against the
// footprint in the resident set.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/error_reason.h"
#include "server/backend/cpu_backend.h"
#include "server/job/job.h"
#include "server/job/job_memory.h"
#include "server/memory_budget.h"
#include "server/registry.h"
#include "tests/unit/server/job_harness.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/resident_bytes.h"
#include "tests/unit/server/status_assertions.h"

namespace paramd {
namespace {

using testing::ForRank;
using testing::HasStatus;
using testing::JobHarness;
using testing::MakeSpec;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::ResidentBytes;
using testing::RunTakenStep;

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(MemoryBudgetTest, AReservationBeyondTheLimitIsRefusedWithTheBytesAskedAndLeft) {
  MemoryBudget budget({100, 0});
  absl::StatusOr<MemoryBudget::Reservation> first = budget.Reserve("\"a\"", {60, 0});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(HasStatus(budget.Reserve("\"b\"", {41, 0}), absl::StatusCode::kResourceExhausted,
                        "job \"b\" needs up to 41 bytes of host memory"));
  EXPECT_TRUE(HasStatus(budget.Reserve("\"b\"", {41, 0}), absl::StatusCode::kResourceExhausted,
                        "memory_budget_bytes is 100 and 40 of it are free"));
  EXPECT_EQ(budget.used().host, 60);  // the refusal reserved nothing
  // A backend without GPU memory has no device budget at all.
  EXPECT_TRUE(HasStatus(budget.Reserve("\"c\"", {1, 1}), absl::StatusCode::kResourceExhausted,
                        "device_memory_budget_bytes is 0"));
  absl::StatusOr<MemoryBudget::Reservation> second = budget.Reserve("\"b\"", {40, 0});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(budget.used().host, 100);
  *first = MemoryBudget::Reservation();  // given back when it goes
  EXPECT_EQ(budget.used().host, 40);
}

TEST(MemoryBudgetTest, TheMachineHasMemoryAvailable) {
  absl::StatusOr<int64_t> available = HostMemoryAvailable();
  ASSERT_TRUE(available.ok()) << available.status();
  EXPECT_GT(*available, 64 * kMiB);
}

TEST(JobFootprintTest, CountsTheFormulaAndWhatTheDaemonKeepsAroundIt) {
  const v1::RegisterRequest spec =
      MakeSpec("f", 3, {{"w", 64, 64, v1::ELEMENT_TYPE_FP32}, {"b", 1, 64, v1::ELEMENT_TYPE_BF16}});
  const MemoryBytes cpu = JobFootprint(spec, BackendPlacement{false});
  // More than the formula's steady state (two served versions, two slot sets).
  EXPECT_GT(cpu.host, JobRegistry::JobBytes(spec));
  EXPECT_EQ(cpu.device, 0);
  // Each part by hand: 12 B of fp32 state, fp32 + bf16 served (3 versions), 3 slot sets of 3
  // ranks, the FP32 upload and an import's staging of the state.
  const int64_t n_w = 64 * 64, n_b = 64;
  const int64_t data =
      (12 + 3 * 6 + 3 * 3 * 4 + 4 + 12) * n_w + (12 + 3 * 6 + 3 * 3 * 2 + 4 + 12) * n_b;
  EXPECT_GE(cpu.host, data);
  const int64_t records = 2 * TensorRecordBytes(spec.tensors(0)) + 9 * SlotRecordBytes(4 * n_w);
  EXPECT_GE(cpu.host, data + records);
  // A GPU backend keeps the state there, and the host keeps the served copies and the slots.
  const MemoryBytes gpu = JobFootprint(spec, BackendPlacement{true});
  EXPECT_LT(gpu.host, cpu.host);
  EXPECT_GT(gpu.device, 12 * (n_w + n_b));
}

TEST(JobFootprintTest, SaturatesRatherThanWrapsForTheLargestJobsRegistrationAccepts) {
  // One tensor of 2^36 FP32 elements from 4096 ranks: 3 slot sets of 2^50 bytes, exact.
  v1::RegisterRequest one = MakeSpec("huge", 4096, {{"w0", 262144, 262144}});
  EXPECT_GT(JobFootprint(one, {}).host, 3 * (int64_t{1} << 50));
  // 4096 of them pass int64: saturated rather than wrapped to a small number.
  v1::RegisterRequest many = MakeSpec("huge", 4096, {});
  for (int i = 0; i < 4096; ++i) {
    v1::TensorSpec* t = many.add_tensors();
    *t = one.tensors(0);
    t->set_name("w" + std::to_string(i));
  }
  EXPECT_EQ(JobFootprint(many, {}).host, std::numeric_limits<int64_t>::max());
}

class BudgetedRegistryTest : public ::testing::Test {
 protected:
  BudgetedRegistryTest()
      : backend_(1), budget_({512 * kMiB, 0}), registry_(&backend_, {}, {}, &budget_) {}
  CpuBackend backend_;
  MemoryBudget budget_;
  JobRegistry registry_;
};

TEST_F(BudgetedRegistryTest, ATensorPastTheBudgetIsRefusedAtRegisterAndChangesNothing) {
  // The shape that once crashed a daemon: valid, 2^36 elements, 275 GB of weights alone.
  const v1::RegisterRequest huge = MakeSpec("huge", 1, {{"w", 262144, 262144}});
  const int64_t asked = JobFootprint(huge, {}).host;
  EXPECT_GT(asked, int64_t{275} * 1000 * 1000 * 1000);
  EXPECT_TRUE(HasStatus(registry_.Register(ForRank(huge, 0)), absl::StatusCode::kResourceExhausted,
                        absl::StrCat("needs up to ", asked, " bytes of host memory")));
  EXPECT_TRUE(registry_.Jobs().empty());
  EXPECT_EQ(budget_.used().host, 0);
  // The daemon goes on taking jobs that fit.
  EXPECT_TRUE(registry_.Register(MakeSpec("small", 1, {{"w", 8, 8}})).ok());
}

TEST_F(BudgetedRegistryTest, ADeletedJobGivesItsBudgetBackOnceItsLastReferenceGoes) {
  // Two of these fit the budget, a third does not.
  v1::RegisterRequest spec = MakeSpec("a", 1, {{"w", 2048, 2048}});
  const int64_t each = JobFootprint(spec, {}).host;
  ASSERT_LT(2 * each, 512 * kMiB);
  ASSERT_GT(3 * each, 512 * kMiB);
  ASSERT_TRUE(registry_.Register(spec).ok());
  spec.set_job("b");
  ASSERT_TRUE(registry_.Register(spec).ok());
  spec.set_job("c");
  EXPECT_TRUE(
      HasStatus(registry_.Register(spec), absl::StatusCode::kResourceExhausted, "delete a job"));
  EXPECT_EQ(budget_.used().host, 2 * each);

  absl::StatusOr<std::shared_ptr<Job>> deleted = registry_.Delete("a");
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(HasStatus(registry_.Find("a"), absl::StatusCode::kNotFound));
  EXPECT_TRUE(HasStatus((*deleted)->CheckUsable(), absl::StatusCode::kNotFound, "was deleted"));
  EXPECT_EQ(budget_.used().host, 2 * each);  // a running step could still hold it
  deleted->reset();
  EXPECT_EQ(budget_.used().host, each);
  EXPECT_TRUE(registry_.Register(spec).ok());
  EXPECT_TRUE(HasStatus(registry_.Delete("nope"), absl::StatusCode::kNotFound));
}

// A trainer that commits ahead of the steps (never pulling) meets the cap on slot sets: the
// step after two waiting ones cannot collect until one ran, and says so (UNAVAILABLE: retry).
TEST(JobSlotSetsTest, ATrainerAheadOfTwoQueuedStepsIsToldToWaitAndGoesOnOnceOneRan) {
  const v1::RegisterRequest spec = MakeSpec("ahead", 1, {{"w", 16, 16}});
  JobHarness h(spec);
  ASSERT_TRUE(h.RegisterAll().ok());
  ASSERT_TRUE(h.UploadWeights(RandomWeights(spec, 1)).ok());
  std::vector<StepWork> queued;
  for (int64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE(h.PushGradients(0, step, RandomGradients(spec, 10 + step)).ok());
    absl::StatusOr<CommitOutcome> outcome = h.Commit(0, step);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    ASSERT_TRUE(outcome->work.has_value());
    queued.push_back(*outcome->work);
  }
  // Steps 0 and 1 hold two sets, step 2 collects in the third: step 3's places are refused.
  ASSERT_TRUE(h.PushGradients(0, 2, RandomGradients(spec, 12)).ok());
  EXPECT_TRUE(HasStatus(h.job().SlotsForStep(0, 3), absl::StatusCode::kUnavailable,
                        "come free once step 0 has run"));
  EXPECT_EQ(ReasonOf(h.job().SlotsForStep(0, 3).status()), v1::ERROR_REASON_SLOT_SETS_FULL);
  absl::StatusOr<CommitOutcome> third = h.Commit(0, 2);
  ASSERT_TRUE(third.ok());
  queued.push_back(*third->work);
  EXPECT_TRUE(HasStatus(h.PushGradients(0, 3, RandomGradients(spec, 13)),
                        absl::StatusCode::kUnavailable, "gradient slot sets"));
  EXPECT_EQ(h.job().Status().slot_bytes(), 3 * 16 * 16 * 4);
  // Once step 0 ran, its set collects step 3.
  EXPECT_TRUE(RunTakenStep(h.job(), queued[0]).failed.ok());
  EXPECT_TRUE(h.PushGradients(0, 3, RandomGradients(spec, 13)).ok());
  EXPECT_EQ(h.job().Status().slot_bytes(), 3 * 16 * 16 * 4);
  for (size_t i = 1; i < queued.size(); ++i)
    EXPECT_TRUE(RunTakenStep(h.job(), queued[i]).failed.ok());
}

// DESIGN.md §2: a step never overwrites leased bytes. With every one of a tensor's served
// versions held by a reader, the step waits (rather than allocating past the budget) and runs
// as soon as one reader lets go.
TEST(JobServedVersionsTest, AStepWaitsWhileReadersHoldEveryServedVersion) {
  const v1::RegisterRequest spec = MakeSpec("leased", 1, {{"w", 16, 16}});
  JobHarness h(spec);
  ASSERT_TRUE(h.RegisterAll().ok());
  ASSERT_TRUE(h.UploadWeights(RandomWeights(spec, 1)).ok());
  std::vector<std::shared_ptr<const ServedTensor>> readers;
  readers.push_back(h.job().Served(0, 0));
  for (int64_t step = 0; step < kServedVersions - 1; ++step) {
    ASSERT_TRUE(h.RunFullStep(step, RandomGradients(spec, 20 + step)).ok());
    readers.push_back(h.job().Served(0, step + 1));
    ASSERT_NE(readers.back(), nullptr);
  }
  EXPECT_EQ(h.job().Status().served_bytes(), kServedVersions * readers[0]->bytes());
  const int64_t step = kServedVersions - 1;
  ASSERT_TRUE(h.PushGradients(0, step, RandomGradients(spec, 30)).ok());
  absl::StatusOr<CommitOutcome> outcome = h.Commit(0, step);
  ASSERT_TRUE(outcome.ok() && outcome->work.has_value());
  absl::Notification done;
  std::thread stepper([&] {
    EXPECT_TRUE(RunTakenStep(h.job(), *outcome->work).failed.ok());
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "the step overwrote or allocated past every leased version";
  EXPECT_EQ(h.job().Served(0, step + 1), nullptr);
  readers.erase(readers.begin());  // the oldest reader lets go
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  stepper.join();
  EXPECT_NE(h.job().Served(0, step + 1), nullptr);
  EXPECT_EQ(h.job().Status().served_bytes(), kServedVersions * readers[0]->bytes());
  // The readers that stayed read their versions unchanged.
  EXPECT_EQ(readers[0]->version, 1);
}

// The 14 KB registration (1024 tensors of [1, 1], world_size 4096) once raised a daemon's
// resident set by 385 MiB, 12x the formula, before any rank pushed. Now registering costs no
// per-rank records, and once every rank has slots in two sets (the step collected and the next
// one's, asked ahead), the growth stays within the footprint's share for two of its three sets.
TEST(JobBookkeepingTest, AManyRankJobCostsNoMoreThanItsFootprint) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory and redzones count in the resident set";
#endif
  if (ResidentBytes() <= 0) GTEST_SKIP() << "/proc/self/statm is not readable on this system";
  std::vector<testing::TensorDef> tensors;
  for (int i = 0; i < 1024; ++i) tensors.push_back({"t" + std::to_string(i), 1, 1});
  const v1::RegisterRequest spec = MakeSpec("wide", 4096, tensors);
  EXPECT_LT(spec.ByteSizeLong(), 16u << 10);
  const MemoryBytes footprint = JobFootprint(spec, {});
  CpuBackend backend(1);
  MemoryBudget budget({footprint.host, 0});
  JobRegistry registry(&backend, {}, {}, &budget);

  const int64_t before = ResidentBytes();
  for (int r = 0; r < spec.world_size(); ++r) ASSERT_TRUE(registry.Register(ForRank(spec, r)).ok());
  std::shared_ptr<Job> job = registry.Find("wide").value();
  const int64_t registered = ResidentBytes();
  EXPECT_LT(registered - before, 16 * kMiB) << "registration made per-rank records";

  v1::PushChunk weights;
  weights.set_job("wide");
  weights.set_kind(v1::PUSH_KIND_INITIAL_WEIGHTS);
  weights.set_data(std::string(4, '\0'));
  for (const v1::TensorSpec& t : spec.tensors()) {
    weights.set_tensor(t.name());
    ASSERT_TRUE(job->Push(weights).ok());
  }
  for (int r = 0; r < spec.world_size(); ++r) {
    ASSERT_TRUE(job->SlotsForStep(r, 0).ok());
    ASSERT_TRUE(job->SlotsForStep(r, 1).ok());
  }
  const int64_t growth = ResidentBytes() - before;
  // The footprint less one slot set (records and bytes) and less what no push made (served
  // versions beyond two, the import staging).
  int64_t two_sets = footprint.host;
  two_sets -= int64_t{spec.tensors_size()} * spec.world_size() * (SlotRecordBytes(4) + 4);
  std::printf(
      "resident growth %.1f MiB after slots for every rank in two sets; footprint %.1f MiB "
      "(%.1f MiB for two slot sets)\n",
      static_cast<double>(growth) / kMiB, static_cast<double>(footprint.host) / kMiB,
      static_cast<double>(two_sets) / kMiB);
  EXPECT_LE(static_cast<double>(growth), 1.05 * static_cast<double>(two_sets) + 16.0 * kMiB);
  EXPECT_EQ(budget.used().host, footprint.host);
}

}  // namespace
}  // namespace paramd
