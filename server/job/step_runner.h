// One step of a job, run once claimed from its sequence (Job::StepNow): the next versions' buffers,
// the backend's inputs (the taken slots, the scalars, the agreement of a sharded job's daemons),
// the one step call (Backend::Step: check, agreement, decision, then the step or a skipped step's
// re-served bytes, wherever the backend runs them), each tensor's new version published as the
// backend reports it, and the step counted once, in Status, when its last tensor is published or,
// for versions published before their outcome was known, when the step has run.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "server/backend/backend.h"
#include "server/job/job.h"

namespace paramd {

// The scalars of a step with these hyperparameters (lr and weight_decay as the step takes them),
// `k` applied steps including it, and `grad_scale`; clip 1 (a clipped step sets its own).
StepScalars StepScalarsOf(const v1::AdamwHyperparams& hyper, double lr, double weight_decay,
                          int64_t k, double grad_scale, uint64_t seed);
// Whether two steps' scalars are the same, bit for bit (an early step's answers the step).
bool SameScalars(const StepScalars& a, const StepScalars& b);

class StepRunner {
 public:
  StepRunner(Job& job, const StepWork& work);
  StepReport Run();

 private:
  // The backend's inputs for the step, from the job's state and the step's taken slots.
  void PrepareLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu_);
  // Publishes tensors [begin, end) (StepPublisher), counting the step with its last tensor where
  // its outcome is known.
  void Publish(size_t begin, size_t end, const StepOutcome* decided);
  // The step ran (applied or skipped): the job's counters and its sequence.
  void CountLocked(const StepOutcome& outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_.mu_);
  // The hook a sharded job's daemons agree through (null for a job on one daemon).
  CheckAgreement Agreement() const;

  Job& job_;
  const StepWork work_;
  const std::chrono::steady_clock::time_point start_;
  std::vector<TensorStep> steps_;
  std::vector<std::shared_ptr<ServedTensor>> outputs_;
  StepScalars scalars_;
  size_t published_ = 0;
  bool counted_ = false;                // CountLocked ran
  int64_t adopting_ = 0;                // tensors handed an early step's state (TensorStep::adopt)
  int64_t early_mismatched_ = 0;        // early results that did not answer the step
  int64_t early_late_ = 0;              // early steps withdrawn when the step was taken
  std::vector<ServedTensor*> pending_;  // published before the outcome was known
  StepReport report_;
};

}  // namespace paramd
