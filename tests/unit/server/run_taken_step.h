// Runs a step that a last commit handed over the way the daemon's step executor does
// (Job::RunOrHoldStep), on the caller's thread, for tests that take steps in order and stream no
// export meanwhile.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/job/job.h"

namespace paramd::testing {

// The report of `work`'s step. A job that failed runs it no more: its report's `failed` is the
// job's status. A step the job did not run now (held back, or earlier steps still to come) is a
// report failed with INTERNAL.
inline StepReport RunTakenStep(Job& job, const StepWork& work) {
  const std::vector<StepReport> reports = job.RunOrHoldStep(work);
  if (reports.size() == 1 && reports[0].step == work.step) return reports[0];
  StepReport report;
  report.step = work.step;
  report.failed = job.CheckUsable();
  if (report.failed.ok()) {
    report.failed = absl::InternalError(absl::StrCat(
        "step ", work.step, " did not run alone: its tick ran ", reports.size(), " steps"));
  }
  return report;
}

}  // namespace paramd::testing
