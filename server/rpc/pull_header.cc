#include "server/rpc/pull_header.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/quoted.h"
#include "common/status_macros.h"

namespace paramd {

absl::StatusOr<PullAsk> CheckPull(Daemon& daemon, const v1::PullRequest& request) {
  PullAsk ask;
  PARAMD_ASSIGN_OR_RETURN(ask.job, daemon.registry().Find(request.job()));
  PARAMD_RETURN_IF_ERROR(ask.job->CheckUsable());
  if (!v1::PullDelivery_IsValid(request.delivery())) {
    return absl::InvalidArgumentError(
        absl::StrCat("delivery ", request.delivery(),
                     " is not a PullDelivery (PULL_DELIVERY_STREAM or "
                     "PULL_DELIVERY_PLACE)"));
  }
  ask.place = request.delivery() == v1::PULL_DELIVERY_PLACE;
  ask.batch = ask.place && request.batch_headers();
  if (!request.tensors().empty()) {
    if (!request.tensor().empty()) {
      return absl::InvalidArgumentError("a pull names `tensor` or `tensors`, not both");
    }
    if (!ask.place) {
      return absl::InvalidArgumentError(
          "a pull of several tensors (`tensors`) needs delivery PULL_DELIVERY_PLACE; pull "
          "streamed bytes one tensor at a time");
    }
  }
  std::vector<std::string> names(request.tensors().begin(), request.tensors().end());
  if (names.empty()) names.push_back(request.tensor());
  for (const std::string& name : names) {
    PARAMD_ASSIGN_OR_RETURN(int tensor, ask.job->TensorIndex(name));
    if (std::find(ask.tensors.begin(), ask.tensors.end(), tensor) != ask.tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quoted(name), " is named twice in one pull"));
    }
    ask.tensors.push_back(tensor);
  }
  PARAMD_RETURN_IF_ERROR(ask.job->CheckServes(request.format()));
  ask.format = FormatKeyOf(request.format());
  ask.min_version = request.min_version();
  const v1::DaemonConfig& config = daemon.config();
  if (request.lease_ms() < 0 || request.lease_ms() > config.max_lease_ms()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease_ms = ", request.lease_ms(), " is outside [0, ", config.max_lease_ms(),
                     "] (0 = the daemon's default, ", config.lease_ms(), ")"));
  }
  ask.lease_ms = request.lease_ms() > 0 ? request.lease_ms() : config.lease_ms();
  ask.transport = request.transport();
  daemon.leases().Release(
      std::vector<uint64_t>(request.release().begin(), request.release().end()));
  return ask;
}

absl::StatusOr<PulledTensor> MakePullHeader(Daemon& daemon, const PullAsk& ask, int tensor,
                                            v1::PullHeader* header) {
  Job& job = *ask.job;
  PulledTensor out;
  out.served = job.Served(tensor, ask.min_version);
  if (out.served == nullptr) {
    // Woken without its version: the job failed or was deleted, the daemon drains (no step
    // will publish it), or the version was published, then replaced by an imported state of an
    // earlier version before its turn.
    PARAMD_RETURN_IF_ERROR(job.CheckUsable());
    PARAMD_RETURN_IF_ERROR(daemon.CheckServing());
    return absl::AbortedError(
        absl::StrCat("tensor ", Quoted(job.Spec(tensor).name()), " of job ", Quoted(job.name()),
                     " went back below version ", ask.min_version,
                     ": an imported state replaced it; pull the version the import serves"));
  }
  const ServedTensor& served = *out.served;
  const ServedFormat* format = served.Find(ask.format);
  out.bytes = &format->bytes;
  // Streamed or host-placed bytes are read from host memory: a cuda:N step left them on the GPU.
  // A host reader waits for the step, so its outcome is known after this.
  if (!ask.place || format->device.empty()) PARAMD_RETURN_IF_ERROR(daemon.ReadyHostBytes(served));
  const Place* place = ask.place ? out.bytes->place() : nullptr;
  // A cuda:N backend serves place pulls from its exported GPU memory.
  Place device_place;
  const bool on_device = ask.place && !format->device.empty();
  if (on_device) {
    device_place = {format->device.place().region, format->device.place().offset};
    place = &device_place;
  }
  header->set_version(served.version);
  const v1::TensorSpec& spec = job.Spec(tensor);
  header->set_tensor(spec.name());
  header->set_rows(spec.rows());
  header->set_cols(spec.cols());
  header->mutable_format()->set_recipe(ask.format.recipe);
  header->mutable_format()->set_direction(ask.format.direction);
  header->set_data_bytes(format->layout.data_bytes);
  const bool pending = served.outcome_pending();  // then skipped is final where it is not
  header->set_skipped(!pending && served.skipped);
  header->set_outcome_pending(pending);
  if (format->layout.scale_count > 0) {
    header->set_scale_bytes(format->layout.scale_bytes);
    header->set_scale_type(format->layout.scale_dtype == kernels::DType::kE8m0
                               ? v1::SCALE_TYPE_E8M0
                               : v1::SCALE_TYPE_FP32_INV);
    header->add_scale_shape(format->layout.scale_rows);
    header->add_scale_shape(format->layout.scale_cols);
  }
  if (place == nullptr) return out;
  // The bytes stay where they are; the lease keeps them alive and unchanged.
  v1::Place* p = header->mutable_place();
  p->set_segment(place->region);
  p->set_offset(place->offset);
  p->set_bytes(out.bytes->size());
  header->set_place_on_device(on_device);
  header->set_instance(daemon.instance());
  const auto expires = LeaseTable::Clock::now() + std::chrono::milliseconds(ask.lease_ms);
  PARAMD_ASSIGN_OR_RETURN(out.lease, daemon.leases().Take(job.name(), out.served, expires));
  header->set_lease(*out.lease);
  header->set_lease_expires_unix_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(expires.time_since_epoch()).count());
  daemon.metrics().Pulled(
      daemon.transports().LabelFor(ask.transport, on_device ? Memory::kDevice : Memory::kHost),
      out.bytes->size());
  return out;
}

}  // namespace paramd
