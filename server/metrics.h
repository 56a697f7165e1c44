// Every metric the daemon exports, defined in this one place (prometheus-cpp, prefix `paramd_`,
// units in the names). The exposer serves them at http://<metrics_listen>/metrics.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace paramd {

class Metrics {
 public:
  Metrics();
  ~Metrics();

  // Serves /metrics on `address` ("host:port", port 0 picks one). Returns the bound address.
  // With `backends` (a daemon of several backends: each one's name and Metrics, this one's among
  // them), the page is theirs, each series labeled backend="NAME".
  // With `basic_auth` ("USER:PASSWORD"), a scrape must carry them (HTTP basic authentication),
  // else it is answered 401.
  absl::StatusOr<std::string> Serve(
      const std::string& address,
      const std::vector<std::pair<std::string, Metrics*>>& backends = {},
      const std::string& basic_auth = "");

  void StepDone(const std::string& job, double seconds, int64_t elements, bool skipped);
  // A step of a job with early_step adopted `adopted` tensors' early results, discarded
  // `discarded`, and stepped `late` tensors itself (the JobStatus counters).
  void EarlySteps(const std::string& job, int64_t adopted, int64_t discarded, int64_t late);
  // A step the backend failed (the job failed with it).
  void StepFailed(const std::string& job);
  // A round of a sharded job's agreement ended (the Peer service): how long this daemon waited.
  void PeerRound(const std::string& job, double seconds, bool ok);
  void Pushed(const std::string& transport, int64_t bytes);
  void Pulled(const std::string& transport, int64_t bytes);
  void RpcError(const std::string& method, int code);
  void SetTrainers(int trainers);
  void SetJobs(int jobs);
  void SetStateBytes(const std::string& kind, int64_t bytes);
  // Attached ranks by the transport they use; every transport offered gets a series.
  void SetTrainersByTransport(const std::map<std::string, int>& trainers);
  void SetLeases(int64_t held, int64_t expired);
  // Memory a transport keeps for itself (its daemon end's own bytes): paramd_<transport>_bytes.
  void SetTransportBytes(const std::string& transport, int64_t reserved, int64_t used);
  void SetFailedJobs(int jobs);
  // The memory budget of `where` ("host", "device"): its limit and the bytes jobs reserved.
  void SetMemoryBudget(const std::string& where, int64_t limit, int64_t reserved);
  void SetStreams(int64_t open, int64_t waiting_pulls);
  // The version each job serves (its next step); a job gone loses its series.
  void SetJobVersions(const std::map<std::string, int64_t>& versions);
  // A checkpoint `operation` ("write" or "restore") of `job` ended; on success, the version it
  // holds and when.
  void CheckpointDone(const std::string& job, const std::string& operation, bool ok,
                      int64_t version);

  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> backends_;  // with Serve's `backends`
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& stepped_elements_;
  prometheus::Family<prometheus::Counter>& pushed_bytes_;
  prometheus::Family<prometheus::Counter>& pulled_bytes_;
  prometheus::Family<prometheus::Counter>& rpc_errors_;
  prometheus::Gauge& trainers_;
  prometheus::Gauge& jobs_;
  prometheus::Family<prometheus::Gauge>& state_bytes_;
  prometheus::Family<prometheus::Gauge>& trainers_by_transport_;
  prometheus::Gauge& leases_held_;
  prometheus::Gauge& leases_expired_;
  prometheus::Gauge& failed_jobs_;
  prometheus::Family<prometheus::Gauge>& budget_bytes_;
  prometheus::Gauge& open_streams_;
  prometheus::Gauge& waiting_pulls_;
  prometheus::Family<prometheus::Gauge>& job_version_;
  prometheus::Family<prometheus::Counter>& checkpoints_;
  prometheus::Family<prometheus::Gauge>& checkpoint_version_;
  prometheus::Family<prometheus::Gauge>& checkpoint_time_;
  prometheus::Family<prometheus::Histogram>& peer_round_seconds_;
  prometheus::Family<prometheus::Counter>& peer_rounds_;
  prometheus::Family<prometheus::Counter>& early_steps_;
  absl::Mutex job_version_mu_;
  // The series set, by job.
  std::map<std::string, prometheus::Gauge*> job_versions_ ABSL_GUARDED_BY(job_version_mu_);
  absl::Mutex transport_bytes_mu_;
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> transport_bytes_
      ABSL_GUARDED_BY(transport_bytes_mu_);
  // The pushed and pulled byte counters by transport, looked up once: a step of many tensors
  // counts every tensor's mark and pull header, and a family's Add builds a label set each time.
  prometheus::Counter& ByTransport(prometheus::Family<prometheus::Counter>& family,
                                   const std::string& transport);
  absl::Mutex by_transport_mu_;
  std::map<std::pair<const void*, std::string>, prometheus::Counter*> by_transport_
      ABSL_GUARDED_BY(by_transport_mu_);
};

}  // namespace paramd
