// Job's side of state export and import (server/state/state_transfer.h): an export's begin and end
// (which steps it waits for and holds back is StepSequence's), the snapshot it reads, and swapping
// in an imported state.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/job/job.h"
#include "server/shard/peer_exchange.h"
#include "server/state/state_transfer.h"

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
      export_starts_.emplace(sequence_.AddExport(), std::move(start));
      started = StartCaughtUpExportsLocked();
    }
  }
  for (auto& s : started) s();
}

std::vector<std::function<void()>> Job::StartCaughtUpExportsLocked() {
  std::vector<std::function<void()>> started;
  for (StepSequence::ExportId id : sequence_.StartCaughtUpExports()) {
    auto it = export_starts_.find(id);
    started.push_back(
        [start = std::move(it->second), snapshot = SnapshotLocked()] { start(snapshot); });
    export_starts_.erase(it);
  }
  return started;
}

Job::ExportSnapshot Job::SnapshotLocked() const {
  ExportSnapshot snapshot;
  v1::StateHeader& h = snapshot.header;
  h.set_job(name_);
  h.set_next_step(sequence_.steps_run());
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
  return sequence_.EndExport();
}

class JobExport final : public ExportedJob {
 public:
  JobExport(std::shared_ptr<Job> job, std::function<void(const StepWork&)> resume)
      : job_(std::move(job)), resume_(std::move(resume)) {}
  void BeginExport(Start start) override { job_->BeginExport(std::move(start)); }
  void EndExport() override {
    std::optional<StepWork> held = job_->EndExport();
    if (held && resume_) resume_(*held);
  }

 private:
  const std::shared_ptr<Job> job_;
  const std::function<void(const StepWork&)> resume_;
};

std::shared_ptr<ExportedJob> ExportOf(std::shared_ptr<Job> job,
                                      std::function<void(const StepWork&)> resume) {
  return std::make_shared<JobExport>(std::move(job), std::move(resume));
}

absl::StatusOr<v1::ImportStateResponse> Job::Import(StagedState staged) {
  const v1::StateHeader& header = staged.header;
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    PARAMD_CHECK(staged.tensors.size() == tensors_.size());
    const std::string refused = absl::StrCat("job \"", name_, "\" refuses an import: ");
    // A step whose last tensor is published has run (a trainer may have pulled it all): only its
    // slots' return is left, which the import waits for.
    const auto settled = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return sequence_.steps_run() < sequence_.next_step() || !sequence_.step_running();
    };
    mu_.Await(absl::Condition(&settled));
    PARAMD_RETURN_IF_ERROR(failed_);
    const int64_t next_step = sequence_.next_step();
    if (sequence_.steps_run() < next_step || slots_.any_taken()) {
      return absl::FailedPreconditionError(absl::StrCat(
          refused, "step ", sequence_.steps_run(),
          " is running or queued; import between steps, once every rank pulled its weights"));
    }
    if (sequence_.exporting()) {
      return absl::FailedPreconditionError(
          absl::StrCat(refused, "an export of its state is streaming; retry when it ends"));
    }
    if (!sequence_.commits().empty()) {
      std::vector<int32_t> ranks;
      for (const auto& entry : sequence_.commits()) ranks.push_back(entry.first);
      return absl::FailedPreconditionError(
          absl::StrCat(refused, "rank(s) ", absl::StrJoin(ranks, ", "), " committed step ",
                       next_step, "; import before any rank pushes or commits a step"));
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
              next_step, "; import before any rank pushes or commits a step"));
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
      if (StepsEarly(t) && t.shadow == nullptr) {
        // A tensor never uploaded: its early steps' second state (EarlyStepAbility::MakeShadow).
        absl::StatusOr<std::unique_ptr<TensorState>> shadow =
            backend_->early_step()->MakeShadow(**state);
        if (!shadow.ok()) {
          return Reworded(shadow.status(),
                          absl::StrCat(refused, "tensor \"", t.spec.name(),
                                       "\": its early_step state: ", shadow.status().message()));
        }
        t.shadow = *std::move(shadow);
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
    sequence_.Restart(header.next_step());
    applied_steps_ = header.applied_steps();
    skipped_steps_ = header.skipped_steps();
    hyper_.set_lr(header.hyperparams().lr());
    hyper_.set_weight_decay(header.hyperparams().weight_decay());
    // Steps from next_step on run again: their agreement rounds start afresh.
    if (sharded()) peers_.exchange->Rewind(name_, header.next_step());
  }
  for (auto& w : wake) w();
  v1::ImportStateResponse response;
  response.set_next_step(header.next_step());
  response.set_fields(staged.fields);
  response.set_bytes(staged.bytes);
  return response;
}

}  // namespace paramd
