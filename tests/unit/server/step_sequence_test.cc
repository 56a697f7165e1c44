// StepSequence on its own, with no job or backend: commits taking a step, steps run one at a time
// in step order whatever order their ticks come in, and exports that wait for the steps committed
// before them and hold back the steps committed after.
#include "server/job/step_sequence.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "tests/unit/server/status_assertions.h"

namespace paramd {
namespace {

using testing::HasStatus;
using CommitKind = StepSequence::CommitKind;
using ExportId = StepSequence::ExportId;

constexpr int kRanks = 3;

std::vector<int64_t> Steps(const std::vector<StepWork>& work) {
  std::vector<int64_t> steps;
  for (const StepWork& w : work) steps.push_back(w.step);
  return steps;
}

class StepSequenceTest : public ::testing::Test {
 protected:
  // Every rank commits the step collected; returns the step the last commit handed over.
  StepWork Take() {
    std::optional<StepWork> work;
    for (int32_t rank = 0; rank < kRanks; ++rank) {
      absl::StatusOr<CommitOutcome> outcome = sequence_.Commit(rank, RankCommit{});
      EXPECT_TRUE(outcome.ok()) << outcome.status();
      if (outcome.ok() && outcome->work) work = outcome->work;
    }
    EXPECT_TRUE(work.has_value());
    return work.value_or(StepWork{});
  }

  // What the job does with the steps a tick claimed: runs them one after another, then starts the
  // exports that caught up. Returns the steps that ran.
  std::vector<int64_t> Tick(const StepWork& work) {
    const std::vector<StepWork> run = sequence_.ClaimRunnable(work);
    if (run.empty()) return {};
    EXPECT_TRUE(sequence_.step_running());
    for (const StepWork& w : run) sequence_.StepRan(w.step);
    sequence_.EndRunning();
    for (ExportId id : sequence_.StartCaughtUpExports()) started_.push_back(id);
    return Steps(run);
  }

  StepSequence sequence_{"job", kRanks};
  std::vector<ExportId> started_;  // exports started by a tick, in order
};

TEST_F(StepSequenceTest, TheLastRanksCommitHandsTheStepOverAndOpensTheNext) {
  EXPECT_EQ(sequence_.next_step(), 0);
  RankCommit values;
  values.lr = 2e-3;
  values.grad_scale = 0.5;
  for (int32_t rank : {2, 0}) {
    absl::StatusOr<CommitOutcome> outcome = sequence_.Commit(rank, values);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_FALSE(outcome->step_started);
    EXPECT_FALSE(outcome->work.has_value());
  }
  EXPECT_TRUE(sequence_.committed(0));
  EXPECT_FALSE(sequence_.committed(1));
  EXPECT_EQ(sequence_.commits().size(), 2u);
  EXPECT_EQ(sequence_.next_step(), 0);

  absl::StatusOr<CommitOutcome> last = sequence_.Commit(1, values);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->committed_ranks, kRanks);
  EXPECT_TRUE(last->step_started);
  ASSERT_TRUE(last->work.has_value());
  EXPECT_EQ(last->work->step, 0);
  EXPECT_EQ(last->work->lr, 2e-3);
  EXPECT_EQ(last->work->grad_scale, 0.5);
  EXPECT_EQ(sequence_.next_step(), 1);
  EXPECT_TRUE(sequence_.commits().empty());
  EXPECT_EQ(sequence_.steps_run(), 0);  // taken, not run
}

TEST_F(StepSequenceTest, OnlyTheStepCollectedOrTheRanksLastCommitIsAccepted) {
  EXPECT_EQ(sequence_.CheckCommitStep(0, 0).value(), CommitKind::kNew);
  EXPECT_TRUE(HasStatus(sequence_.CheckCommitStep(0, 1), absl::StatusCode::kFailedPrecondition,
                        "is ahead of the step it collects (0)"));
  Take();
  Take();
  EXPECT_EQ(sequence_.CheckCommitStep(1, 2).value(), CommitKind::kNew);
  EXPECT_EQ(sequence_.CheckCommitStep(1, 1).value(), CommitKind::kRetry);
  EXPECT_TRUE(HasStatus(sequence_.CheckCommitStep(1, 0), absl::StatusCode::kFailedPrecondition,
                        "step 0 of job \"job\" is stale: the job collects step 2 now"));
  EXPECT_TRUE(HasStatus(sequence_.CheckCommitStep(1, -1), absl::StatusCode::kFailedPrecondition,
                        "is stale"));
}

TEST_F(StepSequenceTest, ACommitWithOtherValuesThanAnotherRanksIsRefusedAndNotRecorded) {
  RankCommit first;
  first.lr = 1e-3;
  ASSERT_TRUE(sequence_.Commit(0, first).ok());
  RankCommit other = first;
  other.grad_scale = 0.25;
  EXPECT_TRUE(HasStatus(sequence_.Commit(1, other), absl::StatusCode::kInvalidArgument,
                        "but rank 0 committed lr 0.001 and grad_scale 1"));
  RankCommit no_lr;
  EXPECT_TRUE(
      HasStatus(sequence_.Commit(2, no_lr), absl::StatusCode::kInvalidArgument, "with lr none"));
  EXPECT_EQ(sequence_.commits().size(), 1u);
  EXPECT_FALSE(sequence_.committed(1));
}

TEST_F(StepSequenceTest, AStepWaitsForTheTickOfTheStepBeforeItThenBothRunInOrder) {
  const StepWork step0 = Take();
  const StepWork step1 = Take();
  // Step 1's tick comes first: it holds step 1 and runs nothing.
  EXPECT_TRUE(sequence_.ClaimRunnable(step1).empty());
  EXPECT_FALSE(sequence_.step_running());
  EXPECT_EQ(Tick(step0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(sequence_.steps_run(), 2);
  EXPECT_FALSE(sequence_.step_running());
  // Late ticks of steps that ran run nothing.
  EXPECT_TRUE(sequence_.ClaimRunnable(step0).empty());
  EXPECT_TRUE(sequence_.ClaimRunnable(step1).empty());
}

TEST_F(StepSequenceTest, AStepRunsAtItsTickWhileTheNextOneIsCollected) {
  const StepWork step0 = Take();
  ASSERT_TRUE(sequence_.Commit(0, RankCommit{}).ok());  // step 1 collected meanwhile
  EXPECT_EQ(Tick(step0), (std::vector<int64_t>{0}));
  EXPECT_EQ(sequence_.steps_run(), 1);
  EXPECT_EQ(sequence_.next_step(), 1);
  EXPECT_TRUE(sequence_.committed(0));
}

TEST_F(StepSequenceTest, AnExportWithNoStepQueuedStartsAtOnceAndHoldsEveryLaterStep) {
  const ExportId id = sequence_.AddExport();
  EXPECT_TRUE(sequence_.exporting());
  EXPECT_EQ(sequence_.StartCaughtUpExports(), (std::vector<ExportId>{id}));
  const StepWork step0 = Take();
  const StepWork step1 = Take();
  EXPECT_TRUE(Tick(step0).empty());
  EXPECT_TRUE(Tick(step1).empty());
  EXPECT_EQ(sequence_.steps_run(), 0);

  // Its end hands the newest held step back; that one tick runs both.
  const std::optional<StepWork> resumed = sequence_.EndExport();
  EXPECT_FALSE(sequence_.exporting());
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->step, 1);
  EXPECT_EQ(Tick(*resumed), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(Tick(*resumed).empty());
}

TEST_F(StepSequenceTest, AnExportEndingWithNoStepHeldHandsNothingBack) {
  sequence_.AddExport();
  ASSERT_EQ(sequence_.StartCaughtUpExports().size(), 1u);
  const StepWork step0 = Take();  // taken, its tick not come yet
  EXPECT_FALSE(sequence_.EndExport().has_value());
  EXPECT_EQ(Tick(step0), (std::vector<int64_t>{0}));
}

TEST_F(StepSequenceTest, AnExportWaitsForTheStepsCommittedBeforeItWithoutHoldingThem) {
  const StepWork step0 = Take();
  const ExportId id = sequence_.AddExport();
  EXPECT_TRUE(sequence_.StartCaughtUpExports().empty()) << "started before step 0 ran";
  // Step 1, committed while the export waits, is held; step 0's tick runs step 0 alone, and the
  // export starts at its end.
  const StepWork step1 = Take();
  EXPECT_TRUE(Tick(step1).empty());
  EXPECT_TRUE(started_.empty());
  EXPECT_EQ(Tick(step0), (std::vector<int64_t>{0}));
  EXPECT_EQ(started_, (std::vector<ExportId>{id}));
  EXPECT_EQ(sequence_.steps_run(), 1);

  const std::optional<StepWork> resumed = sequence_.EndExport();
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->step, 1);
  EXPECT_EQ(Tick(*resumed), (std::vector<int64_t>{1}));
}

TEST_F(StepSequenceTest, AnExportBegunWhileAStepRunsStartsOnlyOnceTheStepEnded) {
  const StepWork step0 = Take();
  const std::vector<StepWork> run = sequence_.ClaimRunnable(step0);
  ASSERT_EQ(Steps(run), (std::vector<int64_t>{0}));
  const ExportId id = sequence_.AddExport();
  EXPECT_TRUE(sequence_.StartCaughtUpExports().empty());
  sequence_.StepRan(0);  // its last tensor is published: it counts as run, but still runs
  EXPECT_TRUE(sequence_.StartCaughtUpExports().empty());
  sequence_.EndRunning();
  EXPECT_EQ(sequence_.StartCaughtUpExports(), (std::vector<ExportId>{id}));
  EXPECT_TRUE(sequence_.StartCaughtUpExports().empty());  // started once
}

// Export A streams; step 0 is committed (held); export B begins and waits for step 0; step 1 is
// committed (held). A's end hands back the newest held step, whose tick runs step 0 alone (step 1
// is B's to hold), which starts B; B's end hands step 1 back, and its tick runs it.
TEST_F(StepSequenceTest, OverlappingExportsLoseNoHeldStep) {
  const ExportId a = sequence_.AddExport();
  ASSERT_EQ(sequence_.StartCaughtUpExports(), (std::vector<ExportId>{a}));
  const StepWork step0 = Take();
  EXPECT_TRUE(Tick(step0).empty());
  const ExportId b = sequence_.AddExport();
  EXPECT_TRUE(sequence_.StartCaughtUpExports().empty());
  const StepWork step1 = Take();
  EXPECT_TRUE(Tick(step1).empty());

  std::optional<StepWork> resumed = sequence_.EndExport();
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->step, 1);
  EXPECT_EQ(Tick(*resumed), (std::vector<int64_t>{0}));
  EXPECT_EQ(started_, (std::vector<ExportId>{b}));

  resumed = sequence_.EndExport();
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->step, 1);
  EXPECT_EQ(Tick(*resumed), (std::vector<int64_t>{1}));
  EXPECT_FALSE(sequence_.exporting());
  EXPECT_TRUE(Tick(step0).empty());
  EXPECT_TRUE(Tick(step1).empty());
}

TEST_F(StepSequenceTest, ExportsWaitingForTheSameStepStartTogetherInTheOrderTheyBegan) {
  const StepWork step0 = Take();
  const ExportId first = sequence_.AddExport();
  const ExportId second = sequence_.AddExport();
  EXPECT_TRUE(sequence_.StartCaughtUpExports().empty());
  EXPECT_EQ(Tick(step0), (std::vector<int64_t>{0}));
  EXPECT_EQ(started_, (std::vector<ExportId>{first, second}));
  EXPECT_FALSE(sequence_.EndExport().has_value());
  EXPECT_TRUE(sequence_.exporting());  // the second still streams
  EXPECT_FALSE(sequence_.EndExport().has_value());
  EXPECT_FALSE(sequence_.exporting());
}

TEST_F(StepSequenceTest, DroppedHeldStepsAreNotHandedBack) {
  sequence_.AddExport();
  ASSERT_EQ(sequence_.StartCaughtUpExports().size(), 1u);
  EXPECT_TRUE(Tick(Take()).empty());
  sequence_.DropHeld();  // the job failed
  EXPECT_FALSE(sequence_.EndExport().has_value());
}

TEST_F(StepSequenceTest, ARestartCollectsTheImportedStepAndEndsRetries) {
  Tick(Take());
  EXPECT_EQ(sequence_.CheckCommitStep(0, 0).value(), CommitKind::kRetry);
  sequence_.Restart(5);
  EXPECT_EQ(sequence_.next_step(), 5);
  EXPECT_EQ(sequence_.steps_run(), 5);
  EXPECT_TRUE(HasStatus(sequence_.CheckCommitStep(0, 0), absl::StatusCode::kFailedPrecondition,
                        "is stale: the job collects step 5 now"));
  const StepWork step5 = Take();
  EXPECT_EQ(step5.step, 5);
  EXPECT_EQ(Tick(step5), (std::vector<int64_t>{5}));
  EXPECT_EQ(sequence_.steps_run(), 6);
}

}  // namespace
}  // namespace paramd
