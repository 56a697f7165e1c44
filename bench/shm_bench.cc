// paramd_shm_bench: the `shm` transport against the CPU copy ceiling, and a whole step by
// transport, against a running daemon (cpu backend, shared memory on).
//   - ceiling: memcpy of the same bytes between two warm buffers, one thread, same run
//   - shm push: a gradient of --mib MiB written into its slot and marked (Attach + copy + mark)
//   - shm pull: the served FP32 weights copied out under a lease; and leased in place (no copy)
//   - step: push + commit + pull of --elements FP32 parameters (one rank) over each transport
//   - exposed step (--exposed_tensors N > 0, shm): --elements FP32 parameters in N tensors pushed
//     one by one in backward's order, --backward_ms apart, then the time from the last tensor's
//     mark to every tensor's new version leased in place (commit + step + publish), the job
//     registered with early_step as --early_step says (docs/host_tier.md); with --forward_ms, the
//     next forward instead: each tensor leased in order, first to last, then --forward_ms / N of
//     its layer's work, and the figure is the time from the mark to that forward's end less
//     --forward_ms: what the forward waited for weights
// Prints one line per figure and a last `RESULT key=value ...` line for bench/run_shm_bench.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
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

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "Daemon address");
ABSL_FLAG(int, mib, 256, "Size of the transfer tensor, MiB");
ABSL_FLAG(int, iters, 10, "Timed transfers");
ABSL_FLAG(int64_t, elements, int64_t{1} << 26, "Parameters of the whole-step figure");
ABSL_FLAG(int, step_iters, 4, "Timed whole steps per transport");
ABSL_FLAG(std::string, step_policy, "fp32",
          "State policy of the whole-step figure: fp32 (FP32 gradients, states and pulls) or fp8 "
          "(BF16 gradients, FP8 exp_avg, FP16 exp_avg_sq, BF16 served and pulled; 13 bytes per "
          "parameter in the daemon, which lets 1e9 parameters fit a smaller machine)");
ABSL_FLAG(int, call_iters, 300, "Timed steps of the per-call figures");
ABSL_FLAG(bool, transfers, true, "Measure the 256 MiB (--mib) push and pull figures");
ABSL_FLAG(std::string, step_transports, "shm,inline",
          "Transports of the whole-step figure, comma-separated (one per daemon keeps the memory "
          "of one job: bench/run_shm_bench.sh does that)");
ABSL_FLAG(int, call_kib, 4, "Size of the per-call figures' tensor, KiB");
ABSL_FLAG(int, many_tensors, 291, "Tensors of the many-tensor pull figure (0: none)");
ABSL_FLAG(int, many_kib, 256, "Size of each tensor of the many-tensor pull figure, KiB");
ABSL_FLAG(int, many_iters, 10, "Timed steps per way of pulling in the many-tensor figure");
ABSL_FLAG(int, exposed_tensors, 0,
          "Tensors of the exposed-step figure (0: none); the other figures are then skipped");
ABSL_FLAG(int, backward_ms, 0,
          "Exposed-step figure: the simulated backward, ms, spread between the tensors' pushes");
ABSL_FLAG(bool, backward_spin, false,
          "Exposed step: the pushing thread spins through each backward gap instead of sleeping "
          "(a trainer whose thread keeps a core busy while backward runs, as a spinning CUDA wait "
          "does)");
ABSL_FLAG(int, forward_ms, 0,
          "Exposed-step figure: the simulated next forward, ms, spread over the tensors in order "
          "(each leased before its share; 0: every tensor leased at once, no forward)");
ABSL_FLAG(bool, early_step, false,
          "Exposed-step figure: register the job with early_step (RegisterRequest.early_step)");

namespace paramd {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "shm_bench: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

v1::RegisterRequest Job(const std::string& name, int64_t cols) {
  v1::RegisterRequest r;
  r.set_job(name);
  r.set_world_size(1);
  // Row-shaped like a layer: rows of 4096 (or one row when smaller).
  const int64_t row = cols % 4096 == 0 ? 4096 : cols;
  v1::TensorSpec* t = r.add_tensors();
  t->set_name("t");
  t->set_rows(cols / row);
  t->set_cols(row);
  t->set_grad_type(v1::ELEMENT_TYPE_FP32);
  v1::AdamwHyperparams* h = r.mutable_hyperparams();
  h->set_lr(1e-3);
  h->set_beta1(0.9);
  h->set_beta2(0.999);
  h->set_eps(1e-8);
  return r;
}

std::unique_ptr<Client> Connect(const std::string& transport) {
  ClientOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  options.transport = transport;
  options.max_message_bytes = 128 << 20;
  options.rpc_timeout = std::chrono::milliseconds(600000);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  Check(client.status(), "connect");
  return *std::move(client);
}

// Seconds of a push + commit + pull step of `elements` parameters over `transport`: the median
// and the best of the timed steps.
struct StepTimes {
  double median, best;
  double upload = 0;  // the exposed step's job: Register and the initial weights' upload
};
StepTimes StepSeconds(const std::string& transport, int64_t elements) {
  std::unique_ptr<Client> client = Connect(transport);
  const std::string job = "step_" + transport;
  const bool fp8 = absl::GetFlag(FLAGS_step_policy) == "fp8";
  v1::RegisterRequest request = Job(job, elements);
  v1::ServeFormat pulled_format;
  pulled_format.set_recipe(fp8 ? v1::RECIPE_BF16 : v1::RECIPE_FP32);
  if (fp8) {
    request.mutable_tensors(0)->set_grad_type(v1::ELEMENT_TYPE_BF16);
    request.mutable_state_policy()->set_exp_avg(v1::MOMENT_TYPE_FP8);
    request.mutable_state_policy()->set_exp_avg_sq(v1::MOMENT_TYPE_FP16);
    *request.add_serve() = pulled_format;
  }
  Check(client->Register(request).status(), "register step job");
  if (client->transport_name() != transport) {
    std::fprintf(stderr, "shm_bench: got transport %s, not %s\n", client->transport_name().c_str(),
                 transport.c_str());
    std::exit(1);
  }
  std::vector<float> weights(static_cast<size_t>(elements), 1e-3f);
  const std::vector<PushItem> initial = {{"t", std::as_bytes(std::span<const float>(weights))}};
  Check(client->UploadInitialWeights(job, initial), "upload");
  if (fp8) std::vector<float>().swap(weights);  // BF16 gradients: the FP32 copy is not needed
  // The gradient: FP32 1e-3, or its BF16 bits (0x3A83).
  std::vector<uint16_t> grad16(fp8 ? static_cast<size_t>(elements) : 0, uint16_t{0x3A83});
  std::vector<float>& grad32 = weights;
  const std::vector<PushItem> items = {{"t", fp8 ? std::as_bytes(std::span<const uint16_t>(grad16))
                                                 : std::as_bytes(std::span<const float>(grad32))}};
  Pulled pulled;
  std::vector<double> seconds;
  for (int i = 0; i < absl::GetFlag(FLAGS_step_iters) + 1; ++i) {
    if (fp8) {
      grad16[0] = static_cast<uint16_t>(0x3A83 + i);
    } else {
      grad32[0] = static_cast<float>(i);
    }
    const auto start = Clock::now();
    Check(client->PushGradients(job, 0, i, items), "step push");
    Check(client->Commit(job, 0, i).status(), "step commit");
    PullTarget target{job, "t", pulled_format, i + 1};
    Check(client->Pull(target, std::chrono::seconds(600), &pulled), "step pull");
    if (i > 0) seconds.push_back(Seconds(start));  // the first step allocates the slots
  }
  return {Median(seconds), *std::min_element(seconds.begin(), seconds.end())};
}

// The exposed step over shm (--exposed_tensors): `elements` FP32 parameters in `tensors` tensors,
// pushed last first --backward_ms apart as backward hands them over, then the seconds from the
// last push's return (its mark) to every tensor's next version leased: median and best.
StepTimes ExposedSeconds(int64_t elements, int tensors) {
  std::unique_ptr<Client> client = Connect("shm");
  const std::string job =
      absl::StrCat("exposed_", absl::GetFlag(FLAGS_early_step) ? "early" : "plain");
  const int64_t each = elements / tensors;
  const int64_t cols = each % 4096 == 0 ? 4096 : each;
  v1::RegisterRequest request = Job(job, each);
  request.clear_tensors();
  PullManyTarget target{job, {}, {}, 0};
  for (int i = 0; i < tensors; ++i) {
    v1::TensorSpec* t = request.add_tensors();
    t->set_name(absl::StrCat("t", i));
    t->set_rows(each / cols);
    t->set_cols(cols);
    t->set_grad_type(v1::ELEMENT_TYPE_FP32);
    target.tensors.push_back(t->name());
  }
  request.set_early_step(absl::GetFlag(FLAGS_early_step));
  std::vector<float> values(static_cast<size_t>(each), 1e-3f);
  const auto bytes = std::as_bytes(std::span<const float>(values));
  std::vector<PushItem> initial;
  for (const std::string& name : target.tensors) initial.push_back({name, bytes});
  const auto upload_start = Clock::now();
  Check(client->Register(request).status(), "register exposed job");
  Check(client->UploadInitialWeights(job, initial), "upload");
  const double upload = Seconds(upload_start);
  const auto gap = std::chrono::microseconds(absl::GetFlag(FLAGS_backward_ms) * 1000 / tensors);
  std::vector<double> seconds;
  for (int i = 0; i < absl::GetFlag(FLAGS_step_iters) + 1; ++i) {
    values[0] = static_cast<float>(i);
    for (int t = tensors - 1; t >= 0; --t) {
      if (absl::GetFlag(FLAGS_backward_spin)) {  // the backward of layer t
        for (const auto until = Clock::now() + gap; Clock::now() < until;) {
        }
      } else {
        std::this_thread::sleep_for(gap);
      }
      const PushItem item{target.tensors[static_cast<size_t>(t)], bytes};
      Check(client->PushGradients(job, 0, i, std::span<const PushItem>(&item, 1)), "exposed push");
    }
    const auto start = Clock::now();
    Check(client->Commit(job, 0, i).status(), "exposed commit");
    target.min_version = i + 1;
    const int forward_ms = absl::GetFlag(FLAGS_forward_ms);
    if (forward_ms > 0) {
      const auto layer = std::chrono::microseconds(int64_t{forward_ms} * 1000 / tensors);
      for (const std::string& name : target.tensors) {
        PullTarget one{job, name, {}, i + 1};
        one.format.set_recipe(v1::RECIPE_FP32);
        absl::StatusOr<PulledView> view =
            client->PullInPlace(one, std::chrono::seconds(600), std::chrono::seconds(60));
        Check(view.status(), "exposed forward pull");
        std::this_thread::sleep_for(layer);  // the layer's forward, on the GPU
        Check(client->Release(*view), "exposed forward release");
      }
      if (i > 0) seconds.push_back(Seconds(start) - forward_ms * 1e-3);
      continue;
    }
    absl::StatusOr<std::vector<PulledView>> views =
        client->PullInPlaceMany(target, std::chrono::seconds(600), std::chrono::seconds(60));
    Check(views.status(), "exposed pull");
    if (i > 0) seconds.push_back(Seconds(start));  // the first step allocates the slots
    Check(client->Release(*views), "exposed release");
  }
  return {Median(seconds), *std::min_element(seconds.begin(), seconds.end()), upload};
}

// Per-call costs over shm with a small tensor (4 KiB by default), where the bytes cost nothing and
// each call is its RPCs: median microseconds of a push, a commit, a pull copying out, a pull in
// place and its release, against a unary round trip that does nothing (a release of no lease).
struct CallCosts {
  double unary_us, push_us, commit_us, pull_us, view_us, release_us;
};

CallCosts MeasureCallCosts() {
  std::unique_ptr<Client> client = Connect("shm");
  const int64_t elements = int64_t{absl::GetFlag(FLAGS_call_kib)} * 256;
  Check(client->Register(Job("calls", elements)).status(), "register calls job");
  std::vector<float> grad(static_cast<size_t>(elements), 1e-3f);
  const std::vector<PushItem> items = {{"t", std::as_bytes(std::span<const float>(grad))}};
  Check(client->UploadInitialWeights("calls", items), "upload");
  std::vector<double> unary, push, commit, pull, view, release;
  Pulled pulled;
  const int iters = absl::GetFlag(FLAGS_call_iters);
  for (int i = 0; i < iters + 1; ++i) {
    const bool timed = i > 0;  // the first step allocates the slots
    auto start = Clock::now();
    Check(client->Release(PulledView{}), "empty release");
    if (timed) unary.push_back(Seconds(start));
    grad[0] = static_cast<float>(i);
    start = Clock::now();
    Check(client->PushGradients("calls", 0, i, items), "push");
    if (timed) push.push_back(Seconds(start));
    start = Clock::now();
    Check(client->Commit("calls", 0, i).status(), "commit");
    if (timed) commit.push_back(Seconds(start));
    PullTarget target{"calls", "t", {}, i + 1};
    target.format.set_recipe(v1::RECIPE_FP32);
    Check(client->Pull(target, std::chrono::seconds(60), &pulled), "pull (wait)");
    start = Clock::now();
    Check(client->Pull(target, std::chrono::seconds(60), &pulled), "pull");
    if (timed) pull.push_back(Seconds(start));
    start = Clock::now();
    absl::StatusOr<PulledView> v =
        client->PullInPlace(target, std::chrono::seconds(60), std::chrono::seconds(60));
    Check(v.status(), "pull in place");
    if (timed) view.push_back(Seconds(start));
    start = Clock::now();
    Check(client->Release(*v), "release");
    if (timed) release.push_back(Seconds(start));
  }
  return {Median(unary) * 1e6, Median(push) * 1e6, Median(commit) * 1e6,
          Median(pull) * 1e6,  Median(view) * 1e6, Median(release) * 1e6};
}

// Pulling every tensor of a many-tensor job after its step, over shm: one Pull per tensor against
// one PullMany, steps alternating between the two ways. Median milliseconds of each pull phase.
struct ManyCosts {
  double one_by_one_ms, many_ms;
};

ManyCosts MeasureManyPulls() {
  std::unique_ptr<Client> client = Connect("shm");
  const int n = absl::GetFlag(FLAGS_many_tensors);
  const int64_t elements = int64_t{absl::GetFlag(FLAGS_many_kib)} * 256;
  v1::RegisterRequest request = Job("many", elements);
  const v1::TensorSpec shape = request.tensors(0);
  request.clear_tensors();
  PullManyTarget target{"many", {}, {}, 0};
  target.format.set_recipe(v1::RECIPE_FP32);
  for (int i = 0; i < n; ++i) {
    v1::TensorSpec* t = request.add_tensors();
    *t = shape;
    t->set_name("t" + std::to_string(i));
    target.tensors.push_back(t->name());
  }
  Check(client->Register(request).status(), "register many job");
  std::vector<float> values(static_cast<size_t>(elements), 1e-3f);
  std::vector<PushItem> items;
  for (const std::string& name : target.tensors) {
    items.push_back({name, std::as_bytes(std::span<const float>(values))});
  }
  Check(client->UploadInitialWeights("many", items), "upload many");
  std::vector<double> one_by_one, many;
  std::vector<Pulled> pulled(static_cast<size_t>(n));
  for (int s = 0; s < 2 * absl::GetFlag(FLAGS_many_iters) + 2; ++s) {
    Check(client->PushGradients("many", 0, s, items), "push many");
    Check(client->Commit("many", 0, s).status(), "commit many");
    target.min_version = s + 1;
    const auto start = Clock::now();
    if (s % 2 == 0) {
      for (int i = 0; i < n; ++i) {
        PullTarget one{"many", target.tensors[static_cast<size_t>(i)], target.format, s + 1};
        Check(client->Pull(one, std::chrono::seconds(60), &pulled[static_cast<size_t>(i)]),
              "pull one");
      }
    } else {
      Check(client->PullMany(target, std::chrono::seconds(60), &pulled), "pull many");
    }
    if (s >= 2) (s % 2 == 0 ? one_by_one : many).push_back(Seconds(start) * 1e3);
  }
  return {Median(one_by_one), Median(many)};
}

// shm push and pull of --mib MiB against one thread's memcpy of the same bytes; prints its
// figures and adds them to `result`.
void MeasureTransfers(std::string* result) {
  const int64_t elements = int64_t{absl::GetFlag(FLAGS_mib)} << 18;
  const size_t bytes = static_cast<size_t>(elements) * 4;
  const int iters = absl::GetFlag(FLAGS_iters);

  // The ceiling: one thread's memcpy between two warm buffers of the same size, timed in the same
  // loop as the transfers (the machine's load changes over a run); its best time counts.
  std::vector<float> src(static_cast<size_t>(elements), 0.25f);
  std::vector<float> dst(static_cast<size_t>(elements), 0.0f);
  std::vector<double> copy_s;
  auto copy = [&](int i) {
    src[static_cast<size_t>(i)] = static_cast<float>(i);
    const auto start = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    copy_s.push_back(Seconds(start));
  };

  std::unique_ptr<Client> client = Connect("shm");
  Check(client->Register(Job("xfer", elements)).status(), "register");
  const std::vector<PushItem> items = {{"t", std::as_bytes(std::span<const float>(src))}};
  Check(client->UploadInitialWeights("xfer", items), "upload");
  std::vector<double> push_s, pull_s, view_s;
  Pulled pulled;
  for (int i = 0; i < iters + 1; ++i) {
    copy(i);
    src[static_cast<size_t>(i)] = 0.5f;
    auto start = Clock::now();
    Check(client->PushGradients("xfer", 0, i, items), "push");
    if (i > 0) push_s.push_back(Seconds(start));  // the first push allocates the slot
    Check(client->Commit("xfer", 0, i).status(), "commit");
    PullTarget target{"xfer", "t", {}, i + 1};
    target.format.set_recipe(v1::RECIPE_FP32);
    Check(client->Pull(target, std::chrono::seconds(60), &pulled), "pull (wait)");
    start = Clock::now();
    Check(client->Pull(target, std::chrono::seconds(60), &pulled), "pull");
    pull_s.push_back(Seconds(start));
    start = Clock::now();
    absl::StatusOr<PulledView> view =
        client->PullInPlace(target, std::chrono::seconds(60), std::chrono::seconds(60));
    Check(view.status(), "pull in place");
    Check(client->Release(*view), "release");
    view_s.push_back(Seconds(start));
  }
  const double copy_gbps = bytes / *std::min_element(copy_s.begin(), copy_s.end()) / 1e9;
  std::printf("memcpy %d MiB, one thread: %.2f GB/s (best of %zu)\n", absl::GetFlag(FLAGS_mib),
              copy_gbps, copy_s.size());
  const double push_gbps = bytes / Median(push_s) / 1e9;
  const double pull_gbps = bytes / Median(pull_s) / 1e9;
  const double view_us = Median(view_s) * 1e6;
  std::printf("shm push %d MiB: %.2f GB/s (median of %zu)\n", absl::GetFlag(FLAGS_mib), push_gbps,
              push_s.size());
  std::printf("shm pull %d MiB (copy out): %.2f GB/s (median of %zu)\n", absl::GetFlag(FLAGS_mib),
              pull_gbps, pull_s.size());
  std::printf("shm pull in place + release: %.0f us (no copy)\n", view_us);
  // The best of the runs too, as the copy's: what tests/perf/perf_smoke.sh holds to its bars.
  const double push_best_gbps = bytes / *std::min_element(push_s.begin(), push_s.end()) / 1e9;
  const double pull_best_gbps = bytes / *std::min_element(pull_s.begin(), pull_s.end()) / 1e9;
  absl::StrAppendFormat(result,
                        " copy_gbps=%.3f push_gbps=%.3f pull_gbps=%.3f view_us=%.1f"
                        " push_best_gbps=%.3f pull_best_gbps=%.3f",
                        copy_gbps, push_gbps, pull_gbps, view_us, push_best_gbps, pull_best_gbps);
}

int Main() {
  if (absl::GetFlag(FLAGS_step_iters) < 1) {
    std::fprintf(stderr, "shm_bench: --step_iters must be at least 1 (the steps timed)\n");
    return 2;
  }
  if (const int tensors = absl::GetFlag(FLAGS_exposed_tensors); tensors > 0) {
    const int64_t elements = absl::GetFlag(FLAGS_elements);
    const StepTimes t = ExposedSeconds(elements, tensors);
    std::printf(
        "exposed step of %lld parameters in %d tensors over shm, backward %d ms, forward %d ms, "
        "early_step %d: %.1f ms (median), %.1f ms (best)\n",
        static_cast<long long>(elements), tensors, absl::GetFlag(FLAGS_backward_ms),
        absl::GetFlag(FLAGS_forward_ms), absl::GetFlag(FLAGS_early_step) ? 1 : 0, t.median * 1e3,
        t.best * 1e3);
    std::printf("RESULT exposed_ms=%.2f exposed_best_ms=%.2f early_step=%d upload_s=%.3f\n",
                t.median * 1e3, t.best * 1e3, absl::GetFlag(FLAGS_early_step) ? 1 : 0, t.upload);
    return 0;
  }
  if (const std::string policy = absl::GetFlag(FLAGS_step_policy);
      policy != "fp32" && policy != "fp8") {
    std::fprintf(stderr, "shm_bench: --step_policy is fp32 or fp8, not %s\n", policy.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_call_iters) > 0) {
    const CallCosts c = MeasureCallCosts();
    std::printf(
        "per call, %d KiB over shm (median us): unary no-op %.0f, push %.0f, commit %.0f, pull "
        "copy %.0f, pull in place %.0f, release %.0f\n",
        absl::GetFlag(FLAGS_call_kib), c.unary_us, c.push_us, c.commit_us, c.pull_us, c.view_us,
        c.release_us);
    std::printf(
        "CALLS unary_us=%.1f push_us=%.1f commit_us=%.1f pull_us=%.1f view_us=%.1f "
        "release_us=%.1f\n",
        c.unary_us, c.push_us, c.commit_us, c.pull_us, c.view_us, c.release_us);
  }

  std::string result;
  if (absl::GetFlag(FLAGS_transfers)) MeasureTransfers(&result);
  if (absl::GetFlag(FLAGS_many_tensors) > 0) {
    const ManyCosts m = MeasureManyPulls();
    std::printf(
        "pulling %d tensors of %d KiB after each step over shm (median ms): one Pull each %.2f, "
        "one PullMany %.2f\n",
        absl::GetFlag(FLAGS_many_tensors), absl::GetFlag(FLAGS_many_kib), m.one_by_one_ms,
        m.many_ms);
    absl::StrAppendFormat(&result, " many_tensors=%d many_kib=%d one_by_one_ms=%.3f many_ms=%.3f",
                          absl::GetFlag(FLAGS_many_tensors), absl::GetFlag(FLAGS_many_kib),
                          m.one_by_one_ms, m.many_ms);
  }
  const int64_t step_elements = absl::GetFlag(FLAGS_elements);
  for (absl::string_view transport :
       absl::StrSplit(absl::GetFlag(FLAGS_step_transports), ',', absl::SkipEmpty())) {
    std::printf("whole steps of %lld parameters over %s...\n",
                static_cast<long long>(step_elements), std::string(transport).c_str());
    const StepTimes step = StepSeconds(std::string(transport), step_elements);
    std::printf("step of %lld parameters over %s: %.1f ms (median), %.1f ms (best)\n",
                static_cast<long long>(step_elements), std::string(transport).c_str(),
                step.median * 1e3, step.best * 1e3);
    absl::StrAppendFormat(&result, " %s_step_ms=%.2f %s_step_best_ms=%.2f", transport,
                          step.median * 1e3, transport, step.best * 1e3);
  }
  std::printf("RESULT%s elements=%lld policy=%s\n", result.c_str(),
              static_cast<long long>(step_elements), absl::GetFlag(FLAGS_step_policy).c_str());
  return 0;
}

}  // namespace
}  // namespace paramd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("paramd_shm_bench --address=HOST:PORT (bench/run_shm_bench.sh)");
  paramd::HandleHelpFlag(argc, argv);
  absl::ParseCommandLine(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a pipe as they are printed
  return paramd::Main();
}
