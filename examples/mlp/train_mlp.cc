// paramd_train_mlp: one trainer rank of the example job. It trains the MLP of mlp_model.h through
// a running daemon: per step it computes its gradient, pushes it, commits (lr and grad_scale
// 1/world_size), and pulls the new FP32 weights. With --check (rank 0), it then replays the whole
// job locally with paramd::reference and exits non-zero unless the daemon's weights (FP32 and
// BF16) are bit-identical.
//
// A trainer that joins a job already under way (a restarted rank) resumes at the step the daemon
// collects, from the weights it serves. A daemon that restarts under a running trainer (killed,
// and started again at the same address from its checkpoint_dir) is followed: the calls wait up
// to --reconnect_timeout_s for it, then the trainer registers again, loads the version the daemon
// restored and goes back to the step it collects. Every batch and learning rate is a function of
// the step, so the run ends bit-identical to one without the restart. With --in_place, pulls read
// the daemon's shared memory under a lease (the shm transport) instead of copying through the
// transport; --crash_at_step kills the process (SIGKILL) after pushing that step's gradients while
// it holds such a lease, for the failure tests.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/error_reason.h"
#include "common/flags_help.h"
#include "common/status_macros.h"
#include "examples/mlp/mlp_model.h"
#include "examples/mlp/reference_replay.h"
#include "reference/adamw_reference.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "Daemon address host:port");
ABSL_FLAG(std::string, job, "mlp", "Job name");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token, for a daemon with a token file (default: "
          "$PARAMD_TOKEN_FILE)");
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
ABSL_FLAG(std::string, daemons, "",
          "The job's daemons, comma-separated host:port as each advertises itself (a job over "
          "several daemons; empty: this one alone), or dns:NAME:PORT for every address NAME "
          "resolves to. Register waits for every one to answer");
ABSL_FLAG(int, daemons_count, 0,
          "How many daemons a --daemons list with a dns: name must resolve to (0: the first "
          "answer)");
ABSL_FLAG(int64_t, lease_ms, 0, "Lease of in-place reads, ms (0: the daemon's default)");
ABSL_FLAG(double, reconnect_timeout_s, 0,
          "How long each call waits for a daemon that went away, s (0: a few attempts); one that "
          "comes back from its checkpoints is followed to the step it restored");

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

// Says which call of the step failed, keeping the status's code and reason.
absl::Status During(const char* what, const absl::Status& status) {
  if (status.ok()) return status;
  return Reworded(status, absl::StrCat(what, ": ", status.message()));
}

// One rank of the job against the daemon: joins it, runs steps, and follows the daemon back to
// its checkpoint when it restarts.
class Trainer {
 public:
  Trainer(Client& client, const TrainSettings& settings, std::string job, int rank)
      : client_(client), s_(settings), job_(std::move(job)), rank_(rank) {}

  // Registers (rank 0 uploads the initial weights of a new job) and loads the version the daemon
  // serves. Returns the step the job collects next. After a restart the job must be there,
  // restored from the daemon's checkpoints.
  absl::StatusOr<int64_t> Join(bool after_restart) {
    absl::StatusOr<v1::RegisterResponse> registered =
        client_.Register(Registration(s_, job_, rank_));
    if (!registered.ok()) return During("register", registered.status());
    if (after_restart && registered->version() < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the daemon restarted without a checkpoint of job \"", job_,
          "\": its state is lost (give the daemon a checkpoint_dir and checkpoint_every_steps)"));
    }
    params_ = InitialParams(s_.seed);
    if (rank_ == 0 && registered->version() < 0) {
      std::vector<PushItem> items;
      for (int t = 0; t < kNumTensors; ++t)
        items.push_back({kShapes[t].name, Bytes(*params_.tensor(t))});
      PARAMD_RETURN_IF_ERROR(
          During("upload initial weights", client_.UploadInitialWeights(job_, items)));
    }
    const int64_t next_step = registered->next_step();
    PARAMD_RETURN_IF_ERROR(During("pull the starting weights",
                                  PullAll(client_, job_, next_step, v1::RECIPE_FP32, &pulled_)));
    Unpack(pulled_, &params_);
    return next_step;
  }

  // Pushes the gradient of `step`, commits it and loads version step + 1. Returns the loss.
  absl::StatusOr<float> Step(int64_t step) {
    const float loss = LossAndGradient(params_, MakeBatch(s_.seed, step, rank_), &grad_);
    std::vector<PushItem> items;
    for (int t = 0; t < kNumTensors; ++t)
      items.push_back({kShapes[t].name, Bytes(*grad_.tensor(t))});
    PARAMD_RETURN_IF_ERROR(During("push", client_.PushGradients(job_, rank_, step, items)));
    if (step == absl::GetFlag(FLAGS_crash_at_step)) return CrashHoldingLease(step);
    absl::StatusOr<v1::CommitResponse> committed =
        client_.Commit(job_, rank_, step, LearningRate(s_.lr, step, s_.steps), 1.0 / s_.world_size);
    if (!committed.ok()) return During("commit", committed.status());
    PARAMD_RETURN_IF_ERROR(
        During("pull", PullAll(client_, job_, step + 1, v1::RECIPE_FP32, &pulled_)));
    Unpack(pulled_, &params_);
    return loss;
  }

  // Whether `status` comes from a daemon that restarted since this rank registered: ABORTED, or
  // a refusal by the new start, which knows nothing of this step (a step it does not collect, a
  // job it does not have, a version it does not reach in time).
  bool DaemonRestarted(const absl::Status& status) const {
    switch (status.code()) {
      case absl::StatusCode::kAborted:
        return true;
      case absl::StatusCode::kFailedPrecondition:
      case absl::StatusCode::kNotFound:
      case absl::StatusCode::kDeadlineExceeded: {
        absl::StatusOr<bool> restarted = client_.DaemonRestarted();
        return restarted.ok() && *restarted;
      }
      default:
        return false;
    }
  }

  // The daemon restarted while this rank was at `step`: joins it again (as often as it restarts
  // meanwhile) and returns the step it collects, the one its checkpoint holds.
  absl::StatusOr<int64_t> FollowRestart(int64_t step) {
    for (;;) {
      ++restarts_;
      absl::StatusOr<int64_t> resumed = Join(/*after_restart=*/true);
      if (resumed.ok()) {
        std::printf(
            "rank %d: the daemon restarted (%d followed); back to step %lld from step %lld\n",
            rank_, restarts_, static_cast<long long>(*resumed), static_cast<long long>(step));
        std::fflush(stdout);
        return resumed;
      }
      if (!DaemonRestarted(resumed.status())) return resumed.status();
    }
  }

  // The BF16 weights of `version`, which rank 0 checks.
  absl::Status PullBf16(int64_t version, std::vector<Pulled>* bf16) {
    return During("pull bf16", PullAll(client_, job_, version, v1::RECIPE_BF16, bf16));
  }

  const Params& params() const { return params_; }

 private:
  // Dies holding mapped segments and a lease on the current weights, before committing; returns
  // only when it cannot take the lease.
  absl::Status CrashHoldingLease(int64_t step) {
    PullTarget target{job_, kShapes[0].name, {}, step};
    target.format.set_recipe(v1::RECIPE_FP32);
    absl::StatusOr<PulledView> held = client_.PullInPlace(
        target, std::chrono::seconds(60), std::chrono::milliseconds(absl::GetFlag(FLAGS_lease_ms)));
    if (!held.ok()) return During("lease before the crash", held.status());
    std::printf("rank %d: killing itself at step %lld holding lease %llu\n", rank_,
                static_cast<long long>(step), static_cast<unsigned long long>(held->lease));
    std::fflush(stdout);
    raise(SIGKILL);
    return absl::InternalError("alive after SIGKILL");
  }

  Client& client_;
  const TrainSettings s_;
  const std::string job_;
  const int rank_;
  Params params_;
  Params grad_;
  std::vector<Pulled> pulled_;
  int restarts_ = 0;
};

int Main() {
  TrainSettings s;
  s.seed = absl::GetFlag(FLAGS_seed);
  s.world_size = absl::GetFlag(FLAGS_world_size);
  s.steps = absl::GetFlag(FLAGS_steps);
  s.lr = absl::GetFlag(FLAGS_lr);
  s.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  const int rank = absl::GetFlag(FLAGS_rank);
  const bool check = rank == 0 && absl::GetFlag(FLAGS_check);

  ClientOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  if (!absl::GetFlag(FLAGS_token_file).empty())
    options.token_file = absl::GetFlag(FLAGS_token_file);
  options.transport = absl::GetFlag(FLAGS_transport);
  if (!absl::GetFlag(FLAGS_daemons).empty()) {
    options.daemons = absl::StrSplit(absl::GetFlag(FLAGS_daemons), ',');
    options.daemons_count = absl::GetFlag(FLAGS_daemons_count);
  }
  options.reconnect_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(absl::GetFlag(FLAGS_reconnect_timeout_s) * 1000));
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(options);
  if (!connected.ok()) return Fail("connect", connected.status());
  Trainer trainer(**connected, s, absl::GetFlag(FLAGS_job), rank);

  // A rank restarted while the job runs resumes where the daemon is.
  absl::StatusOr<int64_t> first_step = trainer.Join(/*after_restart=*/false);
  if (!first_step.ok()) return Fail("join", first_step.status());
  if (*first_step > 0) {
    std::printf("rank %d resumes at step %lld\n", rank, static_cast<long long>(*first_step));
  }

  int64_t step = *first_step;
  std::vector<Pulled> bf16;
  for (;;) {
    absl::Status status;
    while (step < s.steps) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<float> loss = trainer.Step(step);
      if (!loss.ok()) {
        status = loss.status();
        break;
      }
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      if (rank == 0) {
        std::printf("step %4lld  loss %.6f  step_ms %.3f\n", static_cast<long long>(step), *loss,
                    ms);
      }
      ++step;
    }
    if (status.ok() && check) status = trainer.PullBf16(s.steps, &bf16);
    if (status.ok()) break;
    if (!trainer.DaemonRestarted(status)) {
      return Fail(absl::StrCat("step ", step).c_str(), status);
    }
    absl::StatusOr<int64_t> resumed = trainer.FollowRestart(step);
    if (!resumed.ok()) return Fail("follow the restarted daemon", resumed.status());
    step = *resumed;
  }
  if (!check) return 0;

  const Params reference = ReplayReference(s);
  const int64_t mismatches = Compare(trainer.params(), bf16, reference);
  int64_t values = 0;
  for (int t = 0; t < kNumTensors; ++t)
    values += 2 * static_cast<int64_t>(reference.tensor(t)->size());
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
