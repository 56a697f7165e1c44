// paramd_train_classifier: trains the classifier of classifier_model.h through a running daemon
// (one rank) with a chosen state policy and serve recipe, computing every forward and backward
// with the weights as served (MXFP8 rowwise dequantized, or FP32). With --compare it also trains
// the same model on the same seeds with local FP32 AdamW (paramd::reference) and exits non-zero
// unless the daemon-trained model's held-out loss is within --tolerance of the local one.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "client/client.h"
#include "common/flags_help.h"
#include "examples/classifier/classifier_model.h"
#include "kernels/formats.h"
#include "reference/adamw_reference.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "Daemon address host:port");
ABSL_FLAG(std::string, job, "classifier", "Job name");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token, for a daemon with a token file (default: "
          "$PARAMD_TOKEN_FILE)");
ABSL_FLAG(int64_t, steps, 400, "Training steps");
ABSL_FLAG(double, lr, 3e-3, "Learning rate");
ABSL_FLAG(double, weight_decay, 0.01, "AdamW weight decay");
ABSL_FLAG(uint64_t, seed, 7, "Seed of the weights and the data");
ABSL_FLAG(std::string, exp_avg, "fp8", "exp_avg dtype: fp32, bf16, fp16, fp8");
ABSL_FLAG(std::string, exp_avg_sq, "fp16", "exp_avg_sq dtype: fp32, bf16, fp16, fp8");
ABSL_FLAG(std::string, serve, "mxfp8", "Weights the trainer computes with: fp32 or mxfp8");
ABSL_FLAG(bool, compare, true, "Also train with local FP32 AdamW and compare held-out losses");
ABSL_FLAG(double, tolerance, 0.02, "Allowed relative excess of the daemon-trained loss");

namespace paramd::classifier {
namespace {

constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;

v1::MomentType Moment(const std::string& name) {
  if (name == "bf16") return v1::MOMENT_TYPE_BF16;
  if (name == "fp16") return v1::MOMENT_TYPE_FP16;
  if (name == "fp8") return v1::MOMENT_TYPE_FP8;
  return v1::MOMENT_TYPE_FP32;
}

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "train_classifier: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

// Weights as the trainer computes with them, from a pulled version.
void Dequantize(const Pulled& pulled, std::vector<float>* out) {
  const int64_t rows = pulled.header.rows(), cols = pulled.header.cols();
  const auto* data = reinterpret_cast<const uint8_t*>(pulled.data.data());
  if (pulled.header.format().recipe() == v1::RECIPE_FP32) {
    std::memcpy(out->data(), data, static_cast<size_t>(pulled.header.data_bytes()));
    return;
  }
  // MXFP8 rowwise: E4M3 data [rows, cols], E8M0 scales [rows, ceil(cols / 32)] after the data.
  const uint8_t* scales = data + pulled.header.data_bytes();
  const int64_t blocks = (cols + 31) / 32;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      (*out)[r * cols + c] = kernels::FloatFromE4m3(data[r * cols + c]) *
                             kernels::FloatFromE8m0(scales[r * blocks + c / 32]);
    }
  }
}

// Local FP32 AdamW on the same seeds: the model the daemon-trained one is compared with.
Params TrainLocally(uint64_t seed, int64_t steps, double lr, double wd) {
  Params p = InitialParams(seed), m = ZeroParams(), v = ZeroParams(), g;
  for (int64_t step = 0; step < steps; ++step) {
    Loss(p, TrainBatch(seed, step), &g);
    for (int t = 0; t < kNumTensors; ++t) {
      reference::AdamwStepFp32({lr, kBeta1, kBeta2, kEps, wd}, step + 1, g.t[t].data(),
                               p.t[t].data(), m.t[t].data(), v.t[t].data(), p.t[t].size());
    }
  }
  return p;
}

int Main() {
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const double lr = absl::GetFlag(FLAGS_lr), wd = absl::GetFlag(FLAGS_weight_decay);
  const std::string job = absl::GetFlag(FLAGS_job);
  const bool mxfp8 = absl::GetFlag(FLAGS_serve) == "mxfp8";

  ClientOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  if (!absl::GetFlag(FLAGS_token_file).empty())
    options.token_file = absl::GetFlag(FLAGS_token_file);
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(options);
  if (!connected.ok()) return Fail("connect", connected.status());
  Client& client = **connected;

  v1::RegisterRequest r;
  r.set_job(job);
  r.set_world_size(1);
  for (const TensorShape& shape : kShapes) {
    v1::TensorSpec* t = r.add_tensors();
    t->set_name(shape.name);
    t->set_rows(shape.rows);
    t->set_cols(shape.cols);
    t->set_grad_type(v1::ELEMENT_TYPE_FP32);
  }
  r.mutable_hyperparams()->set_lr(lr);
  r.mutable_hyperparams()->set_beta1(kBeta1);
  r.mutable_hyperparams()->set_beta2(kBeta2);
  r.mutable_hyperparams()->set_eps(kEps);
  r.mutable_hyperparams()->set_weight_decay(wd);
  r.mutable_state_policy()->set_exp_avg(Moment(absl::GetFlag(FLAGS_exp_avg)));
  r.mutable_state_policy()->set_exp_avg_sq(Moment(absl::GetFlag(FLAGS_exp_avg_sq)));
  v1::ServeFormat format;
  format.set_recipe(mxfp8 ? v1::RECIPE_MXFP8 : v1::RECIPE_FP32);
  format.set_direction(v1::DIRECTION_ROWWISE);
  *r.add_serve() = format;
  // The held-out loss of the FP32 master is reported too, so FP32 is served alongside MXFP8.
  if (mxfp8) r.add_serve()->set_recipe(v1::RECIPE_FP32);
  r.set_seed(seed);
  absl::StatusOr<v1::RegisterResponse> registered = client.Register(r);
  if (!registered.ok()) return Fail("register", registered.status());

  Params p = InitialParams(seed), g;
  std::vector<PushItem> items(kNumTensors);
  for (int t = 0; t < kNumTensors; ++t) {
    items[t] = {kShapes[t].name, std::as_bytes(std::span<const float>(p.t[t]))};
  }
  if (absl::Status s = client.UploadInitialWeights(job, items); !s.ok()) return Fail("upload", s);

  Params served = ZeroParams();
  Pulled pulled;
  auto pull_all = [&](int64_t version, v1::Recipe recipe, Params* out) -> absl::Status {
    for (int t = 0; t < kNumTensors; ++t) {
      PullTarget target{job, kShapes[t].name, format, version};
      target.format.set_recipe(recipe);
      if (absl::Status s = client.Pull(target, std::chrono::seconds(60), &pulled); !s.ok()) {
        return s;
      }
      Dequantize(pulled, &out->t[t]);
    }
    return absl::OkStatus();
  };
  if (absl::Status s = pull_all(0, format.recipe(), &served); !s.ok()) return Fail("pull", s);
  for (int64_t step = 0; step < steps; ++step) {
    const float loss = Loss(served, TrainBatch(seed, step), &g);
    for (int t = 0; t < kNumTensors; ++t) {
      items[t].data = std::as_bytes(std::span<const float>(g.t[t]));
    }
    if (absl::Status s = client.PushGradients(job, 0, step, items); !s.ok()) return Fail("push", s);
    if (absl::Status s = client.Commit(job, 0, step).status(); !s.ok()) return Fail("commit", s);
    if (absl::Status s = pull_all(step + 1, format.recipe(), &served); !s.ok()) {
      return Fail("pull", s);
    }
    if (step % 50 == 0 || step + 1 == steps) {
      std::printf("step %4lld  train loss %.4f\n", static_cast<long long>(step), loss);
    }
  }
  Params master = ZeroParams();
  if (absl::Status s = pull_all(steps, v1::RECIPE_FP32, &master); !s.ok()) return Fail("pull", s);

  const Batch eval = EvalSet(seed, 8192);
  const float served_loss = Loss(served, eval, nullptr);
  const float master_loss = Loss(master, eval, nullptr);
  std::printf(
      "held-out loss through paramd (exp_avg %s, exp_avg_sq %s): %.4f with the served %s "
      "weights, %.4f with the FP32 master\n",
      absl::GetFlag(FLAGS_exp_avg).c_str(), absl::GetFlag(FLAGS_exp_avg_sq).c_str(), served_loss,
      absl::GetFlag(FLAGS_serve).c_str(), master_loss);
  if (!absl::GetFlag(FLAGS_compare)) return 0;
  const float local_loss = Loss(TrainLocally(seed, steps, lr, wd), eval, nullptr);
  const double tolerance = absl::GetFlag(FLAGS_tolerance);
  const double excess = std::max(served_loss, master_loss) / local_loss - 1.0;
  std::printf("held-out loss with local FP32 AdamW: %.4f; paramd's is %+.2f %% (allowed %.1f %%)\n",
              local_loss, 100 * excess, 100 * tolerance);
  return excess <= tolerance ? 0 : 1;
}

}  // namespace
}  // namespace paramd::classifier

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "paramd_train_classifier --address=HOST:PORT [--steps=N] [--serve=mxfp8]");
  paramd::HandleHelpFlag(argc, argv);
  absl::ParseCommandLine(argc, argv);
  return paramd::classifier::Main();
}
