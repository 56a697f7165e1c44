// paramd_inline_bench: `inline` transport throughput and latency against a running daemon.
//   - push: 64 MiB FP32 gradients of one tensor over one stream, GB/s
//   - pull: the 64 MiB FP32 weights of a published version over one stream, GB/s
//   - round trip: push + commit + pull of a 4 KiB tensor (a whole step), p50 / p99 in us
// Prints one line per figure and a last line `RESULT push_gbps=.. pull_gbps=.. rtt_p50_us=..
// rtt_p99_us=..` for bench/run_inline_bench.sh, which measures iperf3 in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "client/client.h"
#include "common/flags_help.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "Daemon address");
ABSL_FLAG(int, mib, 64, "Size of the large tensor, MiB");
ABSL_FLAG(int, iters, 8, "Timed pushes and pulls of the large tensor");
ABSL_FLAG(int, small_iters, 2000, "Timed small round trips");

namespace paramd {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

v1::RegisterRequest Job(const std::string& name, int64_t cols) {
  v1::RegisterRequest r;
  r.set_job(name);
  r.set_world_size(1);
  v1::TensorSpec* t = r.add_tensors();
  t->set_name("t");
  t->set_rows(1);
  t->set_cols(cols);
  t->set_grad_type(v1::ELEMENT_TYPE_FP32);
  r.mutable_hyperparams()->set_lr(1e-3);
  r.mutable_hyperparams()->set_beta1(0.9);
  r.mutable_hyperparams()->set_beta2(0.999);
  r.mutable_hyperparams()->set_eps(1e-8);
  return r;
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "inline_bench: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

int Main() {
  ClientOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  options.transport = "inline";
  options.max_message_bytes = 128 << 20;
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(options);
  Check(connected.status(), "connect");
  Client& client = **connected;

  // Large tensor: push and pull throughput.
  const int64_t elements = int64_t{absl::GetFlag(FLAGS_mib)} << 18;
  Check(client.Register(Job("bench_large", elements)).status(), "register");
  std::vector<float> data(static_cast<size_t>(elements), 0.25f);
  const std::vector<PushItem> items = {{"t", std::as_bytes(std::span<const float>(data))}};
  Check(client.UploadInitialWeights("bench_large", items), "upload");
  const double bytes = static_cast<double>(elements) * 4;
  std::vector<double> push_s, pull_s;
  Pulled pulled;
  for (int i = 0; i < absl::GetFlag(FLAGS_iters); ++i) {
    data[static_cast<size_t>(i)] = 0.5f;  // a new payload each step
    auto start = Clock::now();
    Check(client.PushGradients("bench_large", 0, i, items), "push");
    push_s.push_back(Seconds(start));
    Check(client.Commit("bench_large", 0, i).status(), "commit");
    PullTarget target{"bench_large", "t", {}, i + 1};
    target.format.set_recipe(v1::RECIPE_FP32);
    Check(client.Pull(target, std::chrono::seconds(60), &pulled), "pull (wait)");
    start = Clock::now();
    Check(client.Pull(target, std::chrono::seconds(60), &pulled), "pull");
    pull_s.push_back(Seconds(start));
  }
  std::sort(push_s.begin(), push_s.end());
  std::sort(pull_s.begin(), pull_s.end());
  const double push_gbps = bytes / push_s[push_s.size() / 2] / 1e9;
  const double pull_gbps = bytes / pull_s[pull_s.size() / 2] / 1e9;
  std::printf("push %d MiB, one stream: %.2f GB/s (median of %zu)\n", absl::GetFlag(FLAGS_mib),
              push_gbps, push_s.size());
  std::printf("pull %d MiB, one stream: %.2f GB/s (median of %zu)\n", absl::GetFlag(FLAGS_mib),
              pull_gbps, pull_s.size());

  // Small tensor: the latency of a whole step.
  Check(client.Register(Job("bench_small", 1024)).status(), "register small");
  std::vector<float> small(1024, 0.25f);
  const std::vector<PushItem> small_items = {{"t", std::as_bytes(std::span<const float>(small))}};
  Check(client.UploadInitialWeights("bench_small", small_items), "upload small");
  std::vector<double> rtt;
  const int warmup = 50;
  for (int i = 0; i < absl::GetFlag(FLAGS_small_iters) + warmup; ++i) {
    small[0] = static_cast<float>(i);
    const auto start = Clock::now();
    Check(client.PushGradients("bench_small", 0, i, small_items), "push small");
    Check(client.Commit("bench_small", 0, i).status(), "commit small");
    PullTarget target{"bench_small", "t", {}, i + 1};
    target.format.set_recipe(v1::RECIPE_FP32);
    Check(client.Pull(target, std::chrono::seconds(10), &pulled), "pull small");
    if (i >= warmup) rtt.push_back(Seconds(start) * 1e6);
  }
  std::sort(rtt.begin(), rtt.end());
  const double p50 = rtt[rtt.size() / 2];
  const double p99 = rtt[rtt.size() * 99 / 100];
  std::printf("round trip push+commit+pull of 4 KiB: p50 %.0f us, p99 %.0f us (%zu steps)\n", p50,
              p99, rtt.size());
  std::printf(
      "RESULT push_gbps=%.3f pull_gbps=%.3f rtt_p50_us=%.1f rtt_p99_us=%.1f push_best_gbps=%.3f "
      "pull_best_gbps=%.3f\n",
      push_gbps, pull_gbps, p50, p99, bytes / push_s.front() / 1e9, bytes / pull_s.front() / 1e9);
  return 0;
}

}  // namespace
}  // namespace paramd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "paramd_inline_bench --address=HOST:PORT (bench/run_inline_bench.sh)");
  paramd::HandleHelpFlag(argc, argv);
  absl::ParseCommandLine(argc, argv);
  return paramd::Main();
}
