// Job::Status: what a job reports of itself (Control.Status, paramctl status, the gauges).
#include "server/job/job.h"

namespace paramd {

v1::JobStatus Job::Status() const {
  absl::MutexLock lock(&mu_);
  v1::JobStatus s;
  s.set_name(name_);
  s.set_world_size(world_size_);
  for (int32_t r : registered_) s.add_registered_ranks(r);
  s.set_next_step(sequence_.next_step());
  s.set_applied_steps(applied_steps_);
  for (const auto& entry : sequence_.commits()) s.add_committed_ranks(entry.first);
  *s.mutable_hyperparams() = hyper_;
  *s.mutable_state_policy() = spec_.state_policy();
  *s.mutable_serve() = spec_.serve();
  *s.mutable_daemons() = spec_.daemons();
  int64_t state_bytes = 0;
  StateBytes by_kind;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    v1::TensorStatus* ts = s.add_tensors();
    ts->set_name(t.spec.name());
    ts->set_rows(t.spec.rows());
    ts->set_cols(t.spec.cols());
    ts->set_grad_type(t.spec.grad_type());
    const auto& served = served_.newest(static_cast<int>(i));
    ts->set_version(served ? served->version : -1);
    const StateBytes bytes = t.state ? t.state->state_bytes() : StateBytes{};
    ts->set_state_bytes(bytes.total());
    state_bytes += bytes.total();
    by_kind.master += bytes.master;
    by_kind.exp_avg += bytes.exp_avg;
    by_kind.exp_avg_sq += bytes.exp_avg_sq;
    by_kind.moment_scales += bytes.moment_scales;
  }
  s.set_state_bytes(state_bytes);
  s.set_slot_bytes(slots_.bytes());
  s.set_served_bytes(served_.bytes());
  s.set_last_step_seconds(last_step_seconds_);
  s.set_skipped_steps(skipped_steps_);
  s.set_max_grad_norm(spec_.max_grad_norm());
  s.set_last_clip(last_clip_);
  v1::StateBytes* kinds = s.mutable_state_bytes_by_kind();
  kinds->set_master(by_kind.master);
  kinds->set_exp_avg(by_kind.exp_avg);
  kinds->set_exp_avg_sq(by_kind.exp_avg_sq);
  kinds->set_moment_scales(by_kind.moment_scales);
  for (const auto& entry : trainer_transports_) *s.add_trainers() = entry.second;
  s.set_shared_memory(buffers_->shared());
  s.set_state(failed_.ok() ? v1::JOB_STATE_ACTIVE : v1::JOB_STATE_FAILED);
  if (!failed_.ok()) {
    s.mutable_failure()->set_code(static_cast<int32_t>(failed_.code()));
    s.mutable_failure()->set_message(std::string(failed_.message()));
  }
  s.set_early_steps_adopted(early_adopted_);
  s.set_early_steps_discarded(early_discarded_);
  s.set_early_steps_late(early_late_);
  s.set_reserved_host_bytes(reservation_.bytes().host);
  s.set_reserved_device_bytes(reservation_.bytes().device);
  return s;
}

}  // namespace paramd
