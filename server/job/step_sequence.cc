#include "server/job/step_sequence.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace paramd {

StepSequence::StepSequence(std::string job, int world_size)
    : job_(std::move(job)),
      world_size_(world_size),
      last_commit_(static_cast<size_t>(world_size), -1) {}

absl::StatusOr<StepSequence::CommitKind> StepSequence::CheckCommitStep(int32_t rank,
                                                                       int64_t step) const {
  if (step < next_step_) {
    // Only the step taken last can be retried: a rank commits step t + 1 after its commit of t
    // returned, so an older step is not a retry.
    if (step >= 0 && last_commit_[static_cast<size_t>(rank)] == step) return CommitKind::kRetry;
    return absl::FailedPreconditionError(absl::StrCat("step ", step, " of job \"", job_,
                                                      "\" is stale: the job collects step ",
                                                      next_step_, " now"));
  }
  if (step > next_step_) {
    return absl::FailedPreconditionError(absl::StrCat("step ", step, " of job \"", job_,
                                                      "\" is ahead of the step it collects (",
                                                      next_step_, ")"));
  }
  return CommitKind::kNew;
}

absl::StatusOr<CommitOutcome> StepSequence::Commit(int32_t rank, const RankCommit& mine) {
  for (const auto& [other, theirs] : commits_) {
    if (theirs.lr != mine.lr || theirs.grad_scale != mine.grad_scale) {
      auto lr_text = [](const std::optional<double>& lr) {
        return lr ? absl::StrCat(*lr) : std::string("none");
      };
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " commits step ", next_step_, " with lr ", lr_text(mine.lr),
                       " and grad_scale ", mine.grad_scale, " but rank ", other, " committed lr ",
                       lr_text(theirs.lr), " and grad_scale ", theirs.grad_scale,
                       "; every rank must send the same values for a step"));
    }
  }
  commits_[rank] = mine;
  CommitOutcome outcome;
  outcome.committed_ranks = static_cast<int>(commits_.size());
  if (outcome.committed_ranks < world_size_) return outcome;

  // The last rank: the step is taken, the next one opens.
  outcome.step_started = true;
  outcome.work = StepWork{next_step_, mine.lr, mine.grad_scale, /*weight_decay=*/std::nullopt};
  for (int64_t& last : last_commit_) last = next_step_;
  commits_.clear();
  ++next_step_;
  return outcome;
}

std::vector<StepWork> StepSequence::ClaimRunnable(const StepWork& work) {
  // A step that already ran: its tick came back from an export.
  if (work.step < steps_run_) return {};
  held_.emplace(work.step, work);
  // Steps run in step order: the held ones from the next step on, as far as they are taken and
  // no export holds them. Every step gets a tick of its own; a tick that finds earlier steps
  // missing leaves its step to theirs.
  std::vector<StepWork> run;
  const int64_t hold_from = HoldFrom();
  for (int64_t next = steps_run_;
       !held_.empty() && held_.begin()->first == next && next < hold_from; ++next) {
    run.push_back(held_.begin()->second);
    held_.erase(held_.begin());
  }
  if (!run.empty()) step_running_ = true;
  return run;
}

void StepSequence::StepRan(int64_t step) { steps_run_ = step + 1; }

void StepSequence::EndRunning() { step_running_ = false; }

void StepSequence::DropHeld() { held_.clear(); }

StepSequence::ExportId StepSequence::AddExport() {
  // The export is the state after every step all ranks committed before it.
  const ExportId id = next_export_++;
  waiting_exports_.emplace(next_step_, id);
  return id;
}

std::vector<StepSequence::ExportId> StepSequence::StartCaughtUpExports() {
  std::vector<ExportId> started;
  if (step_running_) return started;
  while (!waiting_exports_.empty() && waiting_exports_.begin()->first <= steps_run_) {
    ++exporters_;
    started.push_back(waiting_exports_.begin()->second);
    waiting_exports_.erase(waiting_exports_.begin());
  }
  return started;
}

std::optional<StepWork> StepSequence::EndExport() {
  --exporters_;
  if (held_.empty() || held_.begin()->first >= HoldFrom()) return std::nullopt;
  // One tick for the newest held step runs every held step it may in order (ClaimRunnable).
  return held_.rbegin()->second;
}

void StepSequence::Restart(int64_t next_step) {
  next_step_ = next_step;
  steps_run_ = next_step;
  // Commits of earlier steps are not retries any more.
  std::fill(last_commit_.begin(), last_commit_.end(), -1);
}

int64_t StepSequence::HoldFrom() const {
  if (exporters_ > 0) return std::numeric_limits<int64_t>::min();
  if (waiting_exports_.empty()) return std::numeric_limits<int64_t>::max();
  return waiting_exports_.begin()->first;
}

}  // namespace paramd
