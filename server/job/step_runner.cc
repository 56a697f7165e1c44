#include "server/job/step_runner.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "kernels/step_rules.h"

namespace paramd {
namespace {

double Seconds(std::chrono::steady_clock::time_point from,
               std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

StepScalars StepScalarsOf(const v1::AdamwHyperparams& hyper, double lr, double weight_decay,
                          int64_t k, double grad_scale, uint64_t seed) {
  const kernels::AdamwHyper adamw{lr, hyper.beta1(), hyper.beta2(), hyper.eps(), weight_decay};
  StepScalars scalars;
  scalars.k = k;
  scalars.adamw = kernels::MakeAdamwScalars(adamw, k);
  scalars.grad_scale = static_cast<float>(grad_scale);
  scalars.seed = seed;
  return scalars;
}

bool SameScalars(const StepScalars& a, const StepScalars& b) {
  static_assert(sizeof(kernels::AdamwScalars) == 8 * sizeof(float), "AdamwScalars is 8 floats");
  return std::memcmp(&a.adamw, &b.adamw, sizeof(a.adamw)) == 0 &&
         std::memcmp(&a.grad_scale, &b.grad_scale, sizeof(float)) == 0 &&
         std::memcmp(&a.clip, &b.clip, sizeof(float)) == 0 && a.seed == b.seed && a.k == b.k;
}

StepRunner::StepRunner(Job& job, const StepWork& work)
    : job_(job), work_(work), start_(std::chrono::steady_clock::now()), report_{work.step,
                                                                                0,
                                                                                0,
                                                                                false,
                                                                                1.0f,
                                                                                absl::OkStatus()} {}

StepReport StepRunner::Run() {
  absl::Status prepared;
  {
    absl::MutexLock lock(&job_.mu_);
    if (!job_.failed_.ok()) {
      job_.DropSlotsLocked(work_.step);
      report_.failed = job_.failed_;
      return report_;
    }
    prepared = job_.FreshServedForStep(work_.step, &outputs_);
  }
  if (!prepared.ok()) return job_.FailStep(work_, prepared);
  const auto versions_ready = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&job_.mu_);
    PrepareLocked();
  }
  // The state and the taken slots belong to this step alone while it runs.
  StepInput input;
  input.tensors = steps_;
  input.scalars = scalars_;
  input.max_grad_norm = job_.spec_.max_grad_norm();
  input.agreement = Agreement();
  input.publish = [this](size_t begin, size_t end, const StepOutcome* decided) {
    Publish(begin, end, decided);
  };
  const absl::StatusOr<StepOutcome> outcome = job_.backend_->Step(input);
  // Readers waiting for an outcome learn it (a failed step's versions are never read again).
  for (ServedTensor* served : pending_) served->ResolveOutcome(outcome.ok() && outcome->skipped);
  if (!outcome.ok()) return job_.FailStep(work_, outcome.status());
  PARAMD_CHECK(published_ == outputs_.size())
      << "job " << job_.name_ << ": the backend reported " << published_ << " of "
      << outputs_.size() << " tensors of step " << work_.step;
  // Where a step's time goes, for whoever tunes a backend (--log_level=debug).
  const auto stepped = std::chrono::steady_clock::now();
  PARAMD_LOG(DEBUG) << "job " << job_.name_ << " step " << work_.step << ": "
                    << Seconds(start_, stepped) * 1e3 << " ms (free versions "
                    << Seconds(start_, versions_ready) * 1e3 << ", check and step "
                    << Seconds(versions_ready, stepped) * 1e3
                    << (pending_.empty() ? " ms, decided on the host: "
                                         : " ms, decided on the device: ")
                    << (outcome->skipped ? "skipped" : "applied") << ", clip " << outcome->clip
                    << ")";
  absl::MutexLock lock(&job_.mu_);
  if (!counted_) CountLocked(*outcome);
  // A backend may publish before its step's device work is done (cuda: the step is queued): the
  // step's seconds run to here.
  report_.seconds = Seconds(start_, stepped);
  job_.last_step_seconds_ = report_.seconds;
  report_.skipped = outcome->skipped;
  report_.clip = outcome->clip;
  for (const Job::Tensor& t : job_.tensors_) report_.elements += t.elements;
  job_.slots_.Return(work_.step);
  job_.QueueDeferredEarlyLocked();
  return report_;
}

void StepRunner::PrepareLocked() {
  // A landed check still reading the step's slots ends first (it is the same pass the step's
  // check would make), so its result is used and the slots stay until the step returns them; so
  // does the early step running (those not begun were withdrawn when the step was taken).
  job_.AwaitLandedChecksLocked(work_.step);
  SlotSet& slots = job_.slots_.Taken(work_.step);
  scalars_ = StepScalarsOf(job_.hyper_, work_.lr.value_or(job_.hyper_.lr()),
                           work_.weight_decay.value_or(job_.hyper_.weight_decay()),
                           job_.applied_steps_ + 1, work_.grad_scale, job_.spec_.seed());
  for (size_t i = 0; i < job_.tensors_.size(); ++i) {
    Job::Tensor& t = job_.tensors_[i];
    TensorStep step;
    step.state = t.state.get();
    step.slot_type = t.spec.grad_type() == v1::ELEMENT_TYPE_BF16 ? kernels::SlotType::kBf16
                                                                 : kernels::SlotType::kFp32;
    // The ranks' gradients in rank order; pre-reduced, the pushing rank's sum alone.
    const size_t first = job_.pre_reduced_ ? static_cast<size_t>(job_.pusher_) : 0;
    const size_t count = job_.pre_reduced_ ? 1 : slots[i].size();
    for (size_t r = first; r < first + count; ++r) step.slots.push_back(slots[i][r].data());
    if (i < slots.device.size()) {
      for (size_t r = first; r < first + count && r < slots.device[i].size(); ++r) {
        const DeviceSlot& device = slots.device[i][r];
        step.device_slots.push_back(device.gradient());
        step.ready_events.push_back(device.lent_this_step ? device.ready : nullptr);
      }
    }
    // Stays alive (published, then retired) while read.
    step.previous = job_.served_.newest(static_cast<int>(i)).get();
    step.whole_amax = job_.agreement_->WholeAmaxOf(i, work_.step, "amax");
    step.out = outputs_[i].get();
    // The check made as the tensor's gradients landed; the backend uses it where it answers the
    // step's scale (TensorCheck::Answers), else checks the slots itself.
    if (i < slots.landed.size() && slots.landed[i].state == LandedCheck::State::kDone) {
      step.landed = &slots.landed[i].check;
    }
    if (i < job_.early_.size() && job_.early_[i].step == work_.step) {
      // The tensor's early step (ended: the landed checks awaited above include it) answers the
      // step where it ran with the step's scalars and its slots were not marked again since; the
      // backend adopts it where the step is applied. Its served buffers are outputs_[i] either way.
      Job::EarlyStep& early = job_.early_[i];
      const bool unchanged = i < slots.landed.size() &&
                             slots.landed[i].state != LandedCheck::State::kStale &&
                             slots.landed[i].state != LandedCheck::State::kNone;
      if (early.state == Job::EarlyStep::State::kDone && unchanged &&
          job_.spec_.max_grad_norm() == 0 && SameScalars(early.scalars, scalars_)) {
        step.adopt = t.shadow.get();
        ++adopting_;
      } else if (early.state == Job::EarlyStep::State::kDone) {
        ++early_mismatched_;
      } else if (early.state == Job::EarlyStep::State::kLate) {
        ++early_late_;
      }
      early = Job::EarlyStep{};
    }
    steps_.push_back(std::move(step));
  }
}

CheckAgreement StepRunner::Agreement() const {
  if (job_.agreement_->alone()) return nullptr;
  return [this](const GradientCheck& local) -> absl::StatusOr<JobCheck> {
    JobCheck check;
    const absl::StatusOr<bool> agreed = job_.agreement_->AgreeOnCheck(
        work_.step, local.finite, local.block_sums, &check.block_sums);
    if (!agreed.ok()) {
      // ABORTED, not the round's UNAVAILABLE or DEADLINE_EXCEEDED: no retry of a trainer's call
      // helps; the job is restored and run again.
      return absl::AbortedError(
          absl::StrCat("the job's daemons did not agree on the step: ", agreed.status().ToString(),
                       "; this daemon holds version ", work_.step, " of its part"));
    }
    check.finite = *agreed;
    return check;
  };
}

// Publishes each tensor's new version and wakes its pullers (DESIGN.md §2: the next forward
// starts on the first layers while later ones are still being stepped).
void StepRunner::Publish(size_t begin, size_t end, const StepOutcome* decided) {
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&job_.mu_);
    for (size_t i = begin; i < end; ++i) {
      PARAMD_CHECK(i < outputs_.size() && outputs_[i] != nullptr)
          << "job " << job_.name_ << ": tensor " << i << " of step " << work_.step
          << " reported twice";
      ServedTensor& out = *outputs_[i];
      out.version = work_.step + 1;
      if (decided != nullptr) {
        out.skipped = decided->skipped;
      } else {
        out.SetOutcomePending();
        pending_.push_back(&out);
      }
      job_.served_.Publish(static_cast<int>(i), std::move(outputs_[i]), &wake);
      ++published_;
    }
    // The step counts as run with its last tensor, before that tensor's pullers wake: a trainer
    // that pulled every tensor sees the step in Status and may import or export at once. Versions
    // published before their outcome was known count once the step has run (Run).
    if (decided != nullptr && published_ == outputs_.size()) CountLocked(*decided);
  }
  for (auto& w : wake) w();
}

void StepRunner::CountLocked(const StepOutcome& outcome) {
  counted_ = true;
  if (outcome.skipped) {
    ++job_.skipped_steps_;
  } else {
    ++job_.applied_steps_;
  }
  // A skipped step leaves the state as it was: no early result is taken.
  report_.early_adopted = outcome.skipped ? 0 : adopting_;
  report_.early_discarded = early_mismatched_ + (outcome.skipped ? adopting_ : 0);
  report_.early_late = early_late_;
  job_.early_adopted_ += report_.early_adopted;
  job_.early_discarded_ += report_.early_discarded;
  job_.early_late_ += report_.early_late;
  job_.sequence_.StepRan(work_.step);
  job_.last_step_seconds_ = Seconds(start_, std::chrono::steady_clock::now());
  job_.last_clip_ = outcome.clip;
}

}  // namespace paramd
