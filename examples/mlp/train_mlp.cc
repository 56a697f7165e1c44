// paramd_train_mlp: one trainer rank of the example job. It trains the MLP of mlp_model.h through
// a running daemon: per step it computes its gradient, pushes it, commits (lr and grad_scale
// 1/world_size), and pulls the new FP32 weights. With --check (rank 0), it then replays the whole
// job locally with paramd::reference and exits non-zero unless the daemon's weights (FP32 and
// BF16) are bit-identical.
//
// A trainer that joins a job already under way (a restarted rank) resumes at the step the daemon
// collects, from the weights it serves. With --in_place, pulls read the daemon's shared memory
// under a lease (the shm transport) instead of copying through the transport; --crash_at_step
// kills the process (SIGKILL) after pushing that step's gradients while it holds such a lease,
// for the failure tests.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "client/client.h"
#include "common/flags_help.h"
#include "examples/mlp/mlp_model.h"
#include "examples/mlp/reference_replay.h"
#include "reference/adamw_reference.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "Daemon address host:port");
ABSL_FLAG(std::string, job, "mlp", "Job name");
ABSL_FLAG(int, rank, 0, "This trainer's rank");
ABSL_FLAG(int, world_size, 2, "Number of trainer ranks");
ABSL_FLAG(int64_t, steps, 100, "Training steps");
ABSL_FLAG(double, lr, 1e-2, "Base learning rate (decays linearly to half)");
ABSL_FLAG(double, weight_decay, 0.01, "AdamW weight decay");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the initial weights and the data");
ABSL_FLAG(bool, check, false, "Rank 0: compare the final weights with the local reference");
ABSL_FLAG(std::string, transport, "auto", "Transport name or auto");
ABSL_FLAG(bool, in_place, false, "Read pulled weights in place under a lease (shm transport)");
ABSL_FLAG(int64_t, crash_at_step, -1,
          "Kill this process after pushing this step's gradients, holding a lease (tests)");
ABSL_FLAG(int64_t, lease_ms, 0, "Lease of in-place reads, ms (0: the daemon's default)");

namespace paramd::mlp {
namespace {

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "train_mlp: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

std::span<const std::byte> Bytes(const std::vector<float>& v) {
  return std::as_bytes(std::span<const float>(v));
}

v1::RegisterRequest Registration(const TrainSettings& s, const std::string& job, int rank) {
  v1::RegisterRequest r;
  r.set_job(job);
  r.set_rank(rank);
  r.set_world_size(s.world_size);
  for (const TensorShape& shape : kShapes) {
    v1::TensorSpec* t = r.add_tensors();
    t->set_name(shape.name);
    t->set_rows(shape.rows);
    t->set_cols(shape.cols);
    t->set_grad_type(v1::ELEMENT_TYPE_FP32);
  }
  v1::AdamwHyperparams* h = r.mutable_hyperparams();
  h->set_lr(s.lr);
  h->set_beta1(s.beta1);
  h->set_beta2(s.beta2);
  h->set_eps(s.eps);
  h->set_weight_decay(s.weight_decay);
  // The trainer computes with the FP32 weights and checks the BF16 ones; a job serves only the
  // formats it lists.
  r.add_serve()->set_recipe(v1::RECIPE_FP32);
  r.add_serve()->set_recipe(v1::RECIPE_BF16);
  r.set_seed(s.seed);
  return r;
}

// Pulls every tensor at `min_version` in `recipe`, all in one call (PullMany: over shm, one request
// whose answers come as the step publishes each tensor). In place: each tensor is read where the
// daemon keeps it, copied out, and the leases released together.
absl::Status PullAll(Client& client, const std::string& job, int64_t min_version, v1::Recipe recipe,
                     std::vector<Pulled>* pulled) {
  PullManyTarget target{job, {}, {}, min_version};
  target.format.set_recipe(recipe);
  for (int t = 0; t < kNumTensors; ++t) target.tensors.push_back(kShapes[t].name);
  if (!absl::GetFlag(FLAGS_in_place)) {
    return client.PullMany(target, std::chrono::seconds(120), pulled);
  }
  absl::StatusOr<std::vector<PulledView>> views = client.PullInPlaceMany(
      target, std::chrono::seconds(120), std::chrono::milliseconds(absl::GetFlag(FLAGS_lease_ms)));
  if (!views.ok()) return views.status();
  pulled->resize(views->size());
  for (size_t t = 0; t < views->size(); ++t) {
    (*pulled)[t].header = (*views)[t].header;
    (*pulled)[t].data.assign((*views)[t].data.begin(), (*views)[t].data.end());
  }
  return client.Release(*views);
}

void Unpack(const std::vector<Pulled>& pulled, Params* params) {
  for (int t = 0; t < kNumTensors; ++t) {
    std::memcpy(params->tensor(t)->data(), pulled[t].data.data(), pulled[t].data.size());
  }
}

// Counts values that differ in bits between the daemon's weights and the reference's.
int64_t Compare(const Params& daemon, const std::vector<Pulled>& bf16, const Params& reference) {
  int64_t mismatches = 0;
  for (int t = 0; t < kNumTensors; ++t) {
    const std::vector<float>& a = *daemon.tensor(t);
    const std::vector<float>& b = *reference.tensor(t);
    const auto* served = reinterpret_cast<const uint16_t*>(bf16[t].data.data());
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++mismatches;
      if (served[i] != reference::Bf16FromFloat(b[i])) ++mismatches;
    }
  }
  return mismatches;
}

int Main() {
  TrainSettings s;
  s.seed = absl::GetFlag(FLAGS_seed);
  s.world_size = absl::GetFlag(FLAGS_world_size);
  s.steps = absl::GetFlag(FLAGS_steps);
  s.lr = absl::GetFlag(FLAGS_lr);
  s.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  const std::string job = absl::GetFlag(FLAGS_job);
  const int rank = absl::GetFlag(FLAGS_rank);

  ClientOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  options.transport = absl::GetFlag(FLAGS_transport);
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(options);
  if (!connected.ok()) return Fail("connect", connected.status());
  Client& client = **connected;
  absl::StatusOr<v1::RegisterResponse> registered = client.Register(Registration(s, job, rank));
  if (!registered.ok()) return Fail("register", registered.status());

  // A rank restarted while the job runs resumes where the daemon is.
  const int64_t first_step = registered->next_step();
  Params params = InitialParams(s.seed);
  if (rank == 0 && registered->version() < 0) {
    std::vector<PushItem> items;
    for (int t = 0; t < kNumTensors; ++t)
      items.push_back({kShapes[t].name, Bytes(*params.tensor(t))});
    if (absl::Status st = client.UploadInitialWeights(job, items); !st.ok()) {
      return Fail("upload initial weights", st);
    }
  }
  std::vector<Pulled> pulled;
  if (absl::Status st = PullAll(client, job, first_step, v1::RECIPE_FP32, &pulled); !st.ok()) {
    return Fail("pull the starting weights", st);
  }
  Unpack(pulled, &params);
  if (first_step > 0) {
    std::printf("rank %d resumes at step %lld\n", rank, static_cast<long long>(first_step));
  }

  Params grad;
  for (int64_t step = first_step; step < s.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const float loss = LossAndGradient(params, MakeBatch(s.seed, step, rank), &grad);
    std::vector<PushItem> items;
    for (int t = 0; t < kNumTensors; ++t)
      items.push_back({kShapes[t].name, Bytes(*grad.tensor(t))});
    if (absl::Status st = client.PushGradients(job, rank, step, items); !st.ok()) {
      return Fail("push", st);
    }
    if (step == absl::GetFlag(FLAGS_crash_at_step)) {
      // Dies holding mapped segments and a lease on the current weights, before committing.
      PullTarget target{job, kShapes[0].name, {}, step};
      target.format.set_recipe(v1::RECIPE_FP32);
      absl::StatusOr<PulledView> held =
          client.PullInPlace(target, std::chrono::seconds(60),
                             std::chrono::milliseconds(absl::GetFlag(FLAGS_lease_ms)));
      if (!held.ok()) return Fail("lease before the crash", held.status());
      std::printf("rank %d: killing itself at step %lld holding lease %llu\n", rank,
                  static_cast<long long>(step), static_cast<unsigned long long>(held->lease));
      std::fflush(stdout);
      raise(SIGKILL);
    }
    absl::StatusOr<v1::CommitResponse> committed =
        client.Commit(job, rank, step, LearningRate(s.lr, step, s.steps), 1.0 / s.world_size);
    if (!committed.ok()) return Fail("commit", committed.status());
    if (absl::Status st = PullAll(client, job, step + 1, v1::RECIPE_FP32, &pulled); !st.ok()) {
      return Fail("pull", st);
    }
    Unpack(pulled, &params);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (rank == 0)
      std::printf("step %4lld  loss %.6f  step_ms %.3f\n", static_cast<long long>(step), loss, ms);
  }
  if (rank != 0 || !absl::GetFlag(FLAGS_check)) return 0;

  std::vector<Pulled> bf16;
  if (absl::Status st = PullAll(client, job, s.steps, v1::RECIPE_BF16, &bf16); !st.ok()) {
    return Fail("pull bf16", st);
  }
  const Params reference = ReplayReference(s);
  const int64_t mismatches = Compare(params, bf16, reference);
  int64_t values = 0;
  for (int t = 0; t < kNumTensors; ++t)
    values += 2 * static_cast<int64_t>(params.tensor(t)->size());
  if (mismatches != 0) {
    std::printf(
        "check FAILED: %lld of %lld served values (fp32 and bf16) differ from the local "
        "reference\n",
        static_cast<long long>(mismatches), static_cast<long long>(values));
    return 1;
  }
  std::printf(
      "check passed: all %lld served values (fp32 and bf16) after %lld steps are "
      "bit-identical to the local reference\n",
      static_cast<long long>(values), static_cast<long long>(s.steps));
  return 0;
}

}  // namespace
}  // namespace paramd::mlp

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("paramd_train_mlp --address=HOST:PORT --rank=R --world_size=N");
  paramd::HandleHelpFlag(argc, argv);
  absl::ParseCommandLine(argc, argv);
  return paramd::mlp::Main();
}
