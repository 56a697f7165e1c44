// The order of a job's steps and state exports: the step the job collects and the ranks that
// committed it, which taken step runs next (one at a time, in step order), and when an export
// starts and which steps it holds back (server/state/state_transfer.h). Plain bookkeeping with no
// lock of its own and nothing of the job's tensors: the Job calls it under the job's lock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace paramd {

// The work of one step, taken from the job when its last rank commits; run by the step executor.
// The job fills in the learning rate and weight decay it has when it takes the step (where the
// commits carry no lr): a SetHyperparams while the step waits to run changes later steps only, and
// the daemons of a sharded job step with the same values whenever each runs its part.
struct StepWork {
  int64_t step = 0;
  std::optional<double> lr;
  double grad_scale = 1.0;
  std::optional<double> weight_decay;
};

// What a commit did.
struct CommitOutcome {
  int committed_ranks = 0;
  bool step_started = false;
  std::optional<StepWork> work;  // set when this commit completed the step
};

// What a rank sent with its commit of a step.
struct RankCommit {
  std::optional<double> lr;
  double grad_scale = 1.0;
};

class StepSequence {
 public:
  // An export, as the sequence knows it: the order it began in.
  using ExportId = uint64_t;
  enum class CommitKind {
    kNew,    // a commit of the step collected
    kRetry,  // the rank's last commit again, of a step taken since: acknowledged without effect
  };

  // `job` names the job in messages.
  StepSequence(std::string job, int world_size);

  // The step collected: pushes and commits are for it.
  int64_t next_step() const { return next_step_; }
  // Steps run so far (the version they published).
  int64_t steps_run() const { return steps_run_; }
  // True from ClaimRunnable handing out steps to EndRunning.
  bool step_running() const { return step_running_; }
  // The ranks that committed the step collected, with what they sent.
  const std::map<int32_t, RankCommit>& commits() const { return commits_; }
  bool committed(int32_t rank) const { return commits_.contains(rank); }

  // What a commit of `step` by `rank` (a rank of the job) is; FAILED_PRECONDITION for a stale step
  // that is not the rank's last commit, or a step after the one collected.
  absl::StatusOr<CommitKind> CheckCommitStep(int32_t rank, int64_t step) const;
  // Records `rank`'s commit of the step collected. The last rank's hands the step's work over and
  // opens the next step. INVALID_ARGUMENT, recording nothing, when `mine` differs from the lr or
  // grad_scale another rank committed for the step.
  absl::StatusOr<CommitOutcome> Commit(int32_t rank, const RankCommit& mine);

  // A taken step's tick on the step executor: holds `work`, then claims every held step that may
  // run now, in step order from steps_run(): none while an export holds them, nor past a step
  // whose tick is still to come (that tick runs them), nor for a step that ran. The caller runs
  // what it got (StepRan as each one counts as run), then calls EndRunning.
  std::vector<StepWork> ClaimRunnable(const StepWork& work);
  // `step` published its last tensor: it counts as run.
  void StepRan(int64_t step);
  // The steps ClaimRunnable handed out ended (ran, or failed the job).
  void EndRunning();
  // The job failed: no held step runs.
  void DropHeld();

  // An export begins. It starts once every step committed before it ran (StartCaughtUpExports),
  // and from then on holds every later step back until its EndExport.
  ExportId AddExport();
  // The waiting exports that start now (their steps ran, none runs), in the order they began;
  // each streams until its EndExport.
  std::vector<ExportId> StartCaughtUpExports();
  // A streaming export ended: the newest held step, when one may run now, for the executor (its
  // tick runs every held step it may, in order).
  std::optional<StepWork> EndExport();
  // True while an export streams or waits to start.
  bool exporting() const { return exporters_ > 0 || !waiting_exports_.empty(); }

  // An import replaced the job's state at `next_step`: the job collects that step, the steps
  // before it count as run, and no commit of an earlier step is a retry.
  void Restart(int64_t next_step);

 private:
  // Steps from this one on wait for an export: every step while one streams, and those committed
  // after the start of one waiting for earlier steps to run.
  int64_t HoldFrom() const;

  const std::string job_;
  const int world_size_;
  int64_t next_step_ = 0;
  std::map<int32_t, RankCommit> commits_;  // of next_step_
  std::vector<int64_t> last_commit_;       // per rank, -1 = none
  // Steps run so far; an import sets it to the imported version.
  int64_t steps_run_ = 0;
  bool step_running_ = false;
  std::map<int64_t, StepWork> held_;  // taken steps whose tick came, not run yet
  int exporters_ = 0;                 // exports streaming
  // Exports waiting to start, each for every step committed before it to run (steps_run_ >=
  // wait_for, none running): wait_for -> the exports, in the order they began.
  std::multimap<int64_t, ExportId> waiting_exports_;
  ExportId next_export_ = 1;
};

}  // namespace paramd
