// paramd_sharded_step_bench: one fixed job (--params FP32 parameters in --tensors tensors, fp32
// policy, clipping on, one rank) on 1, 2 and 3 daemons (--daemons), the daemons in this process on
// 127.0.0.1, the trainer a sharded paramd::Client. Per daemon count it reports:
//   - step: the trainer's commit to the last tensor pulled (bf16, version step + 1), median;
//   - daemon step: each daemon's step (paramd_step_duration_seconds: from the step taken on the
//     last commit to its last tensor published), mean over the daemons;
//   - peer: each daemon's Peer exchange in those steps (paramd_peer_round_duration_seconds: the
//     "check" round, offered once its gradients are checked, answered once every daemon's offer is
//     in), and its share of that daemon's step: the largest over the daemons (target at 3 daemons:
//     below 5 %), which includes waiting for a daemon that is slower to reach the round (a larger
//     part, or fewer cycles on a shared machine), and the smallest, the daemon that reached the
//     round last: the exchange's own cost.
// The daemons share this machine's cores (step_threads each: --step_threads, or cores / daemons),
// so the step does not get faster with more daemons here; across nodes each has its own.
// Last line: `RESULT key=value ...`.
#include <prometheus/metric_family.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/flags_help.h"
#include "server/rpc/server.h"

ABSL_FLAG(int64_t, params, 200000000, "FP32 parameters of the job");
ABSL_FLAG(int, tensors, 16, "Tensors of the job (equal, cols 4096)");
ABSL_FLAG(std::string, daemons, "1,2,3", "Daemon counts to run, comma-separated");
ABSL_FLAG(int, steps, 6, "Timed steps per daemon count (after one untimed)");
ABSL_FLAG(int, step_threads, 0, "Step threads per daemon (0: this machine's cores / daemons)");
ABSL_FLAG(std::string, transport, "auto", "Trainer transport to each daemon");

namespace paramd {
namespace {

using Clock = std::chrono::steady_clock;

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "sharded_step_bench: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

// Sum and count of every series of a histogram family of `server`'s metrics.
std::pair<double, double> Histogram(Server& server, const std::string& name) {
  double sum = 0;
  double count = 0;
  for (const prometheus::MetricFamily& family : server.daemon().metrics().registry().Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      sum += m.histogram.sample_sum;
      count += static_cast<double>(m.histogram.sample_count);
    }
  }
  return {sum, count};
}

struct Row {
  int daemons = 0;
  double step_ms = 0;         // trainer: commit to the last tensor pulled
  double daemon_step_ms = 0;  // mean over daemons
  double peer_ms = 0;         // mean over daemons
  double peer_share = 0;      // largest over daemons
  double peer_share_min = 1;  // smallest over daemons: the round's own cost, without waiting for
                              // a slower daemon
};

Row Run(int n, int64_t params, int tensors, int steps, int threads, const std::string& transport) {
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) {
    v1::DaemonConfig config;
    config.set_listen("127.0.0.1:0");
    config.set_metrics_listen("");
    config.set_log_level("warning");
    config.set_step_threads(threads);
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
    Check(server.status(), "start a daemon");
    names.push_back((*server)->daemon().advertised_address());
    servers.push_back(*std::move(server));
  }
  std::sort(names.begin(), names.end());
  ClientOptions options;
  options.address = names[0];
  if (n > 1) options.daemons = names;
  options.transport = transport;
  options.rpc_timeout = std::chrono::minutes(10);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  Check(client.status(), "connect");

  const int64_t cols = 4096;
  const int64_t rows = std::max<int64_t>(1, params / tensors / cols);
  v1::RegisterRequest spec;
  spec.set_job("bench");
  spec.set_world_size(1);
  spec.set_max_grad_norm(1.0);
  v1::AdamwHyperparams* h = spec.mutable_hyperparams();
  h->set_lr(1e-4);
  h->set_beta1(0.9);
  h->set_beta2(0.999);
  h->set_eps(1e-8);
  h->set_weight_decay(0.01);
  spec.add_serve()->set_recipe(v1::RECIPE_BF16);
  std::vector<std::string> tensor_names;
  for (int i = 0; i < tensors; ++i) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(absl::StrCat("t", i));
    t->set_rows(rows);
    t->set_cols(cols);
    t->set_grad_type(v1::ELEMENT_TYPE_FP32);
    tensor_names.push_back(t->name());
  }
  Check((*client)->Register(spec).status(), "register");
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < values.size(); ++i) values[i] = 1e-3f * static_cast<float>(i % 97);
  const auto bytes = std::as_bytes(std::span<const float>(values));
  std::vector<PushItem> items;
  for (const std::string& name : tensor_names) items.push_back({name, bytes});
  Check((*client)->UploadInitialWeights("bench", items), "upload");

  std::vector<Pulled> pulled;
  v1::ServeFormat bf16;
  bf16.set_recipe(v1::RECIPE_BF16);
  std::vector<double> trainer;
  std::vector<std::pair<double, double>> step_before(n), peer_before(n);
  for (int step = 0; step <= steps; ++step) {
    if (step == 1) {  // the first step is untimed: the daemons' counts start after it
      for (int i = 0; i < n; ++i) {
        step_before[i] = Histogram(*servers[i], "paramd_step_duration_seconds");
        peer_before[i] = Histogram(*servers[i], "paramd_peer_round_duration_seconds");
      }
    }
    Check((*client)->PushGradients("bench", 0, step, items), "push");
    const auto start = Clock::now();
    Check((*client)->Commit("bench", 0, step).status(), "commit");
    Check((*client)->PullMany({"bench", tensor_names, bf16, step + 1}, std::chrono::minutes(10),
                              &pulled),
          "pull");
    if (step > 0) trainer.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  Row row;
  row.daemons = n;
  std::sort(trainer.begin(), trainer.end());
  row.step_ms = 1e3 * trainer[trainer.size() / 2];
  for (int i = 0; i < n; ++i) {
    const auto [step_sum, step_count] = Histogram(*servers[i], "paramd_step_duration_seconds");
    const auto [peer_sum, peer_count] =
        Histogram(*servers[i], "paramd_peer_round_duration_seconds");
    const double daemon_step =
        (step_sum - step_before[i].first) / (step_count - step_before[i].second);
    const double peer =
        peer_count > peer_before[i].second
            ? (peer_sum - peer_before[i].first) / (step_count - step_before[i].second)
            : 0.0;
    row.daemon_step_ms += 1e3 * daemon_step / n;
    row.peer_ms += 1e3 * peer / n;
    row.peer_share = std::max(row.peer_share, peer / daemon_step);
    row.peer_share_min = std::min(row.peer_share_min, peer / daemon_step);
  }
  client->reset();
  for (auto& s : servers) s->Shutdown();
  return row;
}

}  // namespace
}  // namespace paramd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "paramd_sharded_step_bench [--params=N] [--daemons=1,2,3]: one job's step on 1, 2 and 3 "
      "daemons in this process, and the Peer exchange's share of each daemon's step");
  paramd::HandleHelpFlag(argc, argv);
  absl::ParseCommandLine(argc, argv);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<paramd::Row> rows;
  std::printf("%-8s %12s %16s %10s %11s %15s\n", "daemons", "step (ms)", "daemon step (ms)",
              "peer (ms)", "peer share", "least (daemon)");
  for (const absl::string_view count : absl::StrSplit(absl::GetFlag(FLAGS_daemons), ',')) {
    const int n = std::stoi(std::string(count));
    const int threads = absl::GetFlag(FLAGS_step_threads) > 0
                            ? absl::GetFlag(FLAGS_step_threads)
                            : std::max(1, static_cast<int>(cores) / n);
    const paramd::Row row =
        paramd::Run(n, absl::GetFlag(FLAGS_params), absl::GetFlag(FLAGS_tensors),
                    absl::GetFlag(FLAGS_steps), threads, absl::GetFlag(FLAGS_transport));
    std::printf("%-8d %12.1f %16.1f %10.2f %10.2f%% %14.2f%%\n", row.daemons, row.step_ms,
                row.daemon_step_ms, row.peer_ms, 100 * row.peer_share, 100 * row.peer_share_min);
    std::fflush(stdout);
    rows.push_back(row);
  }
  std::string result = "RESULT";
  for (const paramd::Row& r : rows) {
    absl::StrAppendFormat(&result,
                          " step_ms_%d=%.1f daemon_step_ms_%d=%.1f peer_share_%d=%.4f"
                          " peer_share_least_%d=%.4f",
                          r.daemons, r.step_ms, r.daemons, r.daemon_step_ms, r.daemons,
                          r.peer_share, r.daemons, r.peer_share_min);
  }
  std::printf("%s\n", result.c_str());
  return 0;
}
