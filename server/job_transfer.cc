// Job's side of state export and import (server/state_transfer.h): holding steps back while an
// export reads the state, and swapping in an imported state.
#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/job.h"
#include "server/state_transfer.h"

namespace paramd {

void Job::BeginExport(ExportStart start) {
  std::vector<std::function<void()>> started;
  {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) {
      started.push_back([start = std::move(start), refused = failed_] { start(refused); });
    } else if (initialized_tensors_ != static_cast<int64_t>(tensors_.size())) {
      const absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
          "job \"", name_, "\" has initial weights for ", initialized_tensors_, " of ",
          tensors_.size(), " tensors; its state exists once rank 0 uploaded all of them"));
      started.push_back([start = std::move(start), refused] { start(refused); });
    } else {
      // The export is the state after every step all ranks committed before it: those queued run
      // first. Steps committed from now on wait (RunOrHoldStep) until it ends.
      waiting_exports_.emplace(next_step_, std::move(start));
      started = StartCaughtUpExportsLocked();
    }
  }
  for (auto& s : started) s();
}

std::vector<std::function<void()>> Job::StartCaughtUpExportsLocked() {
  std::vector<std::function<void()>> started;
  if (step_running_) return started;
  while (!waiting_exports_.empty() && waiting_exports_.begin()->first <= steps_run_) {
    ++exporters_;
    started.push_back([start = std::move(waiting_exports_.begin()->second),
                       snapshot = SnapshotLocked()] { start(snapshot); });
    waiting_exports_.erase(waiting_exports_.begin());
  }
  return started;
}

Job::ExportSnapshot Job::SnapshotLocked() const {
  ExportSnapshot snapshot;
  v1::StateHeader& h = snapshot.header;
  h.set_job(name_);
  h.set_next_step(steps_run_);
  h.set_applied_steps(applied_steps_);
  h.set_skipped_steps(skipped_steps_);
  h.set_seed(spec_.seed());
  *h.mutable_hyperparams() = hyper_;
  *h.mutable_state_policy() = spec_.state_policy();
  for (const Tensor& t : tensors_) {
    snapshot.tensors.push_back({t.spec.name(), t.info, t.state.get()});
  }
  snapshot.formats = formats_;
  snapshot.backend = backend_;
  return snapshot;
}

std::optional<StepWork> Job::EndExport() {
  absl::MutexLock lock(&mu_);
  --exporters_;
  if (held_.empty() || held_.begin()->first >= HoldFromLocked()) return std::nullopt;
  // One tick for the newest held step runs every held step it may in order (RunOrHoldStep).
  return held_.rbegin()->second;
}

int64_t Job::HoldFromLocked() const {
  if (exporters_ > 0) return std::numeric_limits<int64_t>::min();
  if (waiting_exports_.empty()) return std::numeric_limits<int64_t>::max();
  return waiting_exports_.begin()->first;
}

absl::StatusOr<v1::ImportStateResponse> Job::Import(StagedState staged) {
  const v1::StateHeader& header = staged.header;
  PARAMD_CHECK(staged.tensors.size() == tensors_.size());
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    const std::string refused = absl::StrCat("job \"", name_, "\" refuses an import: ");
    // A step whose last tensor is published has run (a trainer may have pulled it all): only its
    // slots' return is left, which the import waits for.
    const auto settled = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return steps_run_ < next_step_ || !step_running_;
    };
    mu_.Await(absl::Condition(&settled));
    PARAMD_RETURN_IF_ERROR(failed_);
    if (steps_run_ < next_step_ || slots_.any_taken()) {
      return absl::FailedPreconditionError(absl::StrCat(
          refused, "step ", steps_run_,
          " is running or queued; import between steps, once every rank pulled its weights"));
    }
    if (exporters_ > 0 || !waiting_exports_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(refused, "an export of its state is streaming; retry when it ends"));
    }
    if (!commits_.empty()) {
      std::vector<int32_t> ranks;
      for (const auto& entry : commits_) ranks.push_back(entry.first);
      return absl::FailedPreconditionError(
          absl::StrCat(refused, "rank(s) ", absl::StrJoin(ranks, ", "), " committed step ",
                       next_step_, "; import before any rank pushes or commits a step"));
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      if (t.state == nullptr && t.upload != nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(refused, "the initial weights of tensor \"", t.spec.name(),
                         "\" are being uploaded; import instead of uploading, or after"));
      }
      const SlotSet& collecting = slots_.collecting();
      for (size_t r = 0; collecting.made() && r < collecting[i].size(); ++r) {
        if (collecting[i][r].received() > 0) {
          return absl::FailedPreconditionError(absl::StrCat(
              refused, "rank ", r, " pushed gradients of tensor \"", t.spec.name(), "\" for step ",
              next_step_, "; import before any rank pushes or commits a step"));
        }
      }
    }
    // Every tensor's new state and served bytes first: a failure here changes nothing.
    std::vector<std::unique_ptr<TensorState>> states;
    std::vector<std::shared_ptr<ServedTensor>> served;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      Tensor& t = tensors_[i];
      PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<ServedTensor> fresh,
                              FreshServed(static_cast<int>(i)));
      if (fresh == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(refused, "readers hold leases on every served version of tensor \"",
                         t.spec.name(), "\"; import once one is released (or its lease expired)"));
      }
      served.push_back(std::move(fresh));
      absl::StatusOr<std::unique_ptr<TensorState>> state =
          backend_->ImportState(t.info, std::move(staged.tensors[i]), served.back().get());
      if (!state.ok()) {
        return Reworded(state.status(), absl::StrCat(refused, "tensor \"", t.spec.name(),
                                                     "\": ", state.status().message()));
      }
      states.push_back(*std::move(state));
    }
    // The swap.
    for (size_t i = 0; i < tensors_.size(); ++i) {
      Tensor& t = tensors_[i];
      t.state = std::move(states[i]);
      t.upload.reset();  // the state no longer comes from the uploaded weights
      served[i]->version = header.next_step();
      served_.Publish(static_cast<int>(i), std::move(served[i]), &wake);
    }
    initialized_tensors_ = static_cast<int64_t>(tensors_.size());
    next_step_ = header.next_step();
    steps_run_ = header.next_step();
    applied_steps_ = header.applied_steps();
    skipped_steps_ = header.skipped_steps();
    hyper_.set_lr(header.hyperparams().lr());
    hyper_.set_weight_decay(header.hyperparams().weight_decay());
    // Commits of earlier steps are not retries any more.
    std::fill(last_commit_.begin(), last_commit_.end(), -1);
  }
  for (auto& w : wake) w();
  v1::ImportStateResponse response;
  response.set_next_step(header.next_step());
  response.set_fields(staged.fields);
  response.set_bytes(staged.bytes);
  return response;
}

}  // namespace paramd
