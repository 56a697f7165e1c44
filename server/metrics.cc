#include "server/metrics.h"

#include <grpcpp/support/status.h>

#include <chrono>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace paramd {
namespace {

// Step durations from 100 us to about 100 s.
prometheus::Histogram::BucketBoundaries StepBuckets() {
  prometheus::Histogram::BucketBoundaries bounds;
  for (double b = 1e-4; b < 200; b *= 2.5) bounds.push_back(b);
  return bounds;
}

const char* CodeName(int code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
}

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      step_seconds_(prometheus::BuildHistogram()
                        .Name("paramd_step_duration_seconds")
                        .Help("Time from a step's start to the publication of its versions")
                        .Register(*registry_)),
      steps_(prometheus::BuildCounter()
                 .Name("paramd_steps_total")
                 .Help("Steps run, by job and outcome (applied, skipped, or failed)")
                 .Register(*registry_)),
      stepped_elements_(prometheus::BuildCounter()
                            .Name("paramd_stepped_elements_total")
                            .Help("Parameters updated by steps, by job")
                            .Register(*registry_)),
      pushed_bytes_(prometheus::BuildCounter()
                        .Name("paramd_pushed_bytes_total")
                        .Help("Gradient and initial-weight bytes received, by transport")
                        .Register(*registry_)),
      pulled_bytes_(prometheus::BuildCounter()
                        .Name("paramd_pulled_bytes_total")
                        .Help("Served weight bytes sent, by transport")
                        .Register(*registry_)),
      rpc_errors_(prometheus::BuildCounter()
                      .Name("paramd_rpc_errors_total")
                      .Help("RPCs that ended with an error, by method and gRPC status code")
                      .Register(*registry_)),
      trainers_(prometheus::BuildGauge()
                    .Name("paramd_trainers_attached")
                    .Help("Registered trainer ranks over all jobs")
                    .Register(*registry_)
                    .Add({})),
      jobs_(prometheus::BuildGauge()
                .Name("paramd_jobs")
                .Help("Jobs held by the daemon")
                .Register(*registry_)
                .Add({})),
      state_bytes_(prometheus::BuildGauge()
                       .Name("paramd_state_bytes")
                       .Help("Bytes held, by kind (state, served, slots)")
                       .Register(*registry_)),
      trainers_by_transport_(prometheus::BuildGauge()
                                 .Name("paramd_trainers_by_transport")
                                 .Help("Attached trainer ranks, by the transport they chose")
                                 .Register(*registry_)),
      leases_held_(prometheus::BuildGauge()
                       .Name("paramd_leases_held")
                       .Help("Leases on served bytes read in place, held now")
                       .Register(*registry_)
                       .Add({})),
      leases_expired_(prometheus::BuildGauge()
                          .Name("paramd_leases_expired")
                          .Help("Leases that ended by expiry rather than release (a dead or "
                                "slow trainer), since start")
                          .Register(*registry_)
                          .Add({})),
      failed_jobs_(prometheus::BuildGauge()
                       .Name("paramd_jobs_failed")
                       .Help("Jobs whose step failed on the backend (they run no more steps "
                             "until deleted)")
                       .Register(*registry_)
                       .Add({})),
      budget_bytes_(prometheus::BuildGauge()
                        .Name("paramd_memory_budget_bytes")
                        .Help("The memory budget, by where (host, device) and kind (limit, "
                              "reserved by jobs)")
                        .Register(*registry_)),
      open_streams_(prometheus::BuildGauge()
                        .Name("paramd_streams_open")
                        .Help("Push, Pull, ExportState and ImportState streams open (at the "
                              "last step or registration)")
                        .Register(*registry_)
                        .Add({})),
      waiting_pulls_(prometheus::BuildGauge()
                         .Name("paramd_pulls_waiting")
                         .Help("Pulls waiting for a version (at the last step or registration)")
                         .Register(*registry_)
                         .Add({})),
      job_version_(prometheus::BuildGauge()
                       .Name("paramd_job_version")
                       .Help("The version each job serves, its next step (after a restart: the "
                             "version its checkpoint restored)")
                       .Register(*registry_)),
      checkpoints_(prometheus::BuildCounter()
                       .Name("paramd_checkpoints_total")
                       .Help("Checkpoints written and restored, by job, operation (write, "
                             "restore) and outcome (ok, failed)")
                       .Register(*registry_)),
      checkpoint_version_(prometheus::BuildGauge()
                              .Name("paramd_checkpoint_version")
                              .Help("The version of a job's last checkpoint written or restored, "
                                    "by operation")
                              .Register(*registry_)),
      checkpoint_time_(prometheus::BuildGauge()
                           .Name("paramd_checkpoint_timestamp_seconds")
                           .Help("When a job's last checkpoint was written or restored (Unix "
                                 "time), by operation")
                           .Register(*registry_)),
      peer_round_seconds_(prometheus::BuildHistogram()
                              .Name("paramd_peer_round_duration_seconds")
                              .Help("Time this daemon waited in a round of a sharded job's "
                                    "agreement, from its offer to the last daemon's")
                              .Register(*registry_)),
      peer_rounds_(prometheus::BuildCounter()
                       .Name("paramd_peer_rounds_total")
                       .Help("Rounds of sharded jobs' agreement, by job and outcome (ok, failed)")
                       .Register(*registry_)),
      early_steps_(
          prometheus::BuildCounter()
              .Name("paramd_early_steps_total")
              .Help("Tensor-steps stepped as their gradients landed (early_step), by job "
                    "and outcome (adopted by the step, discarded, or late: not begun when the step "
                    "was taken)")
              .Register(*registry_)) {}

Metrics::~Metrics() = default;

namespace {

// The metrics of a daemon's several backends as one page: each backend's series get the label
// backend="NAME", and families of one name are one family (the text format allows one TYPE line
// per name).
class BackendsCollectable final : public prometheus::Collectable {
 public:
  explicit BackendsCollectable(
      std::vector<std::pair<std::string, std::shared_ptr<prometheus::Registry>>> backends)
      : backends_(std::move(backends)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families;
    std::map<std::string, size_t> index;
    for (const auto& [backend, registry] : backends_) {
      for (prometheus::MetricFamily& family : registry->Collect()) {
        for (prometheus::ClientMetric& metric : family.metric) {
          metric.label.push_back({"backend", backend});
        }
        const auto [it, added] = index.emplace(family.name, families.size());
        if (added) {
          families.push_back(std::move(family));
        } else {
          std::vector<prometheus::ClientMetric>& into = families[it->second].metric;
          into.insert(into.end(), std::make_move_iterator(family.metric.begin()),
                      std::make_move_iterator(family.metric.end()));
        }
      }
    }
    return families;
  }

 private:
  const std::vector<std::pair<std::string, std::shared_ptr<prometheus::Registry>>> backends_;
};

}  // namespace

absl::StatusOr<std::string> Metrics::Serve(
    const std::string& address, const std::vector<std::pair<std::string, Metrics*>>& backends,
    const std::string& basic_auth) {
  try {
    // civetweb reports bind failures by throwing; this is the one place they are caught.
    exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  if (backends.empty()) {
    exposer_->RegisterCollectable(registry_);
  } else {
    std::vector<std::pair<std::string, std::shared_ptr<prometheus::Registry>>> registries;
    for (const auto& [backend, metrics] : backends)
      registries.emplace_back(backend, metrics->registry_);
    backends_ = std::make_shared<BackendsCollectable>(std::move(registries));
    exposer_->RegisterCollectable(backends_);
  }
  if (!basic_auth.empty()) {
    exposer_->RegisterAuth(
        [basic_auth](const std::string& user, const std::string& password) {
          const std::string given = user + ":" + password;
          unsigned char differ = given.size() == basic_auth.size() ? 0 : 1;
          for (size_t i = 0; i < given.size() && i < basic_auth.size(); ++i) {
            differ |= static_cast<unsigned char>(given[i] ^ basic_auth[i]);
          }
          return differ == 0;
        },
        "paramd");
  }
  const std::vector<int> ports = exposer_->GetListeningPorts();
  const std::string host = address.substr(0, address.rfind(':'));
  return absl::StrCat(host, ":", ports.empty() ? 0 : ports.front());
}

void Metrics::StepDone(const std::string& job, double seconds, int64_t elements, bool skipped) {
  step_seconds_.Add({{"training_job", job}}, StepBuckets()).Observe(seconds);
  steps_.Add({{"training_job", job}, {"outcome", skipped ? "skipped" : "applied"}}).Increment();
  if (!skipped) {
    stepped_elements_.Add({{"training_job", job}}).Increment(static_cast<double>(elements));
  }
}

void Metrics::EarlySteps(const std::string& job, int64_t adopted, int64_t discarded, int64_t late) {
  const std::pair<const char*, int64_t> outcomes[] = {
      {"adopted", adopted}, {"discarded", discarded}, {"late", late}};
  for (const auto& [outcome, count] : outcomes) {
    if (count == 0) continue;
    early_steps_.Add({{"training_job", job}, {"outcome", outcome}})
        .Increment(static_cast<double>(count));
  }
}

void Metrics::PeerRound(const std::string& job, double seconds, bool ok) {
  peer_rounds_.Add({{"training_job", job}, {"outcome", ok ? "ok" : "failed"}}).Increment();
  if (ok) peer_round_seconds_.Add({{"training_job", job}}, StepBuckets()).Observe(seconds);
}

void Metrics::StepFailed(const std::string& job) {
  steps_.Add({{"training_job", job}, {"outcome", "failed"}}).Increment();
}

prometheus::Counter& Metrics::ByTransport(prometheus::Family<prometheus::Counter>& family,
                                          const std::string& transport) {
  absl::MutexLock lock(&by_transport_mu_);
  auto [it, added] = by_transport_.try_emplace({&family, transport}, nullptr);
  if (added) it->second = &family.Add({{"transport", transport}});
  return *it->second;
}

void Metrics::Pushed(const std::string& transport, int64_t bytes) {
  ByTransport(pushed_bytes_, transport).Increment(static_cast<double>(bytes));
}

void Metrics::Pulled(const std::string& transport, int64_t bytes) {
  ByTransport(pulled_bytes_, transport).Increment(static_cast<double>(bytes));
}

void Metrics::RpcError(const std::string& method, int code) {
  rpc_errors_.Add({{"method", method}, {"code", CodeName(code)}}).Increment();
}

void Metrics::SetTrainers(int trainers) { trainers_.Set(trainers); }

void Metrics::SetTrainersByTransport(const std::map<std::string, int>& trainers) {
  for (const auto& [transport, count] : trainers) {
    trainers_by_transport_.Add({{"transport", transport}}).Set(count);
  }
}

void Metrics::SetLeases(int64_t held, int64_t expired) {
  leases_held_.Set(static_cast<double>(held));
  leases_expired_.Set(static_cast<double>(expired));
}

void Metrics::SetTransportBytes(const std::string& transport, int64_t reserved, int64_t used) {
  prometheus::Family<prometheus::Gauge>* family = nullptr;
  {
    absl::MutexLock lock(&transport_bytes_mu_);
    auto it = transport_bytes_.find(transport);
    if (it == transport_bytes_.end()) {
      it = transport_bytes_
               .emplace(transport, &prometheus::BuildGauge()
                                        .Name(absl::StrCat("paramd_", transport, "_bytes"))
                                        .Help(absl::StrCat("Memory the ", transport,
                                                           " transport keeps, by kind (reserved, "
                                                           "used)"))
                                        .Register(*registry_))
               .first;
    }
    family = it->second;
  }
  family->Add({{"kind", "reserved"}}).Set(static_cast<double>(reserved));
  family->Add({{"kind", "used"}}).Set(static_cast<double>(used));
}
void Metrics::SetJobs(int jobs) { jobs_.Set(jobs); }

void Metrics::SetFailedJobs(int jobs) { failed_jobs_.Set(jobs); }

void Metrics::SetMemoryBudget(const std::string& where, int64_t limit, int64_t reserved) {
  budget_bytes_.Add({{"where", where}, {"kind", "limit"}}).Set(static_cast<double>(limit));
  budget_bytes_.Add({{"where", where}, {"kind", "reserved"}}).Set(static_cast<double>(reserved));
}

void Metrics::SetStreams(int64_t open, int64_t waiting_pulls) {
  open_streams_.Set(static_cast<double>(open));
  waiting_pulls_.Set(static_cast<double>(waiting_pulls));
}

void Metrics::SetJobVersions(const std::map<std::string, int64_t>& versions) {
  absl::MutexLock lock(&job_version_mu_);
  for (auto it = job_versions_.begin(); it != job_versions_.end();) {
    if (versions.count(it->first) == 0) {
      job_version_.Remove(it->second);
      it = job_versions_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [job, version] : versions) {
    prometheus::Gauge*& gauge = job_versions_[job];
    if (gauge == nullptr) gauge = &job_version_.Add({{"training_job", job}});
    gauge->Set(static_cast<double>(version));
  }
}

void Metrics::CheckpointDone(const std::string& job, const std::string& operation, bool ok,
                             int64_t version) {
  checkpoints_
      .Add({{"training_job", job}, {"operation", operation}, {"outcome", ok ? "ok" : "failed"}})
      .Increment();
  if (!ok) return;
  checkpoint_version_.Add({{"training_job", job}, {"operation", operation}})
      .Set(static_cast<double>(version));
  checkpoint_time_.Add({{"training_job", job}, {"operation", operation}})
      .Set(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
               .count());
}

void Metrics::SetStateBytes(const std::string& kind, int64_t bytes) {
  state_bytes_.Add({{"kind", kind}}).Set(static_cast<double>(bytes));
}

}  // namespace paramd
