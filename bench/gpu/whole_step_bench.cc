// The whole training step as a GPU trainer sees it, against a daemon on a cuda:N backend in another
// process (DESIGN.md §10): BF16 gradients in this process's GPU memory are pushed over cuda_ipc
// (ordered on this process's stream), the step is committed, and the new weights are pulled, BF16
// rowwise and one FP8 format rowwise (fp8_delayed, fp8_tensor), for every tensor. Policy: fp32
// master, fp8 exp_avg, fp16 exp_avg_sq, one rank. Two ways to push, each a job of its own:
//   copied    the gradients are copied into the daemon's slots (ClientOptions::lend_gradients off);
//   lent      the daemon reads them where they lie, after the event the push recorded on this
//             process's stream (lend_gradients: what paramd.torch does by default).
// Two ways to pull, each timed over the same job:
//   in_place  PullInPlaceMany per format; the views are the weights of the next step, and the
//             previous step's views are released once the new ones are in hand;
//   copied    the same views copied into this process's own buffers on its stream, synchronized,
//             then released.
// One step = push + commit + pulls (+ copies) + the trainer's stream synchronized (it waits for the
// step on the device) + release, wall time; the parts are timed too ("copy" holds the copies and
// that wait), and
// the daemon's own step (Status.last_step_seconds) rides along. Prints a table, and one JSON
// object per row with --json FILE (scripts/gpu_whole_step.sh joins it with the kernel alone and
// torch's fused AdamW measured in the same run).
//   paramd_whole_step_bench --address=HOST:PORT [--device=0] [--sets=one,llm] [--steps=10]
//                           [--pulls=in_place,copied] [--grads=copied,lent]
//                           [--fp8=fp8_delayed,fp8_tensor] [--json=FILE]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/gpu/shape_sets.h"
#include "client/client.h"

namespace paramd {
namespace {

struct Flags {
  std::string address = "127.0.0.1:50051";
  int device = 0;
  std::string sets = "one,llm";
  int steps = 10;  // timed steps per pull mode (one more warms up)
  std::string pulls = "in_place,copied";
  std::string grads = "copied,lent";           // how the gradients reach the daemon
  std::string fp8 = "fp8_delayed,fp8_tensor";  // the FP8 format served besides BF16
  std::string json;
};
Flags flags;

bool ParseFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq),
                      value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--address") {
      flags.address = value;
    } else if (key == "--device") {
      flags.device = std::stoi(value);
    } else if (key == "--sets") {
      flags.sets = value;
    } else if (key == "--steps") {
      flags.steps = std::stoi(value);
    } else if (key == "--pulls") {
      flags.pulls = value;
    } else if (key == "--grads") {
      flags.grads = value;
    } else if (key == "--fp8") {
      flags.fp8 = value;
    } else if (key == "--json") {
      flags.json = value;
    } else {
      std::fprintf(stderr, "whole_step_bench: unknown flag %s\n", arg.c_str());
      return false;
    }
  }
  return true;
}

std::vector<std::string> Split(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    if (end > start) out.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "whole_step_bench: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}
void CheckCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "whole_step_bench: %s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

v1::ServeFormat Format(v1::Recipe recipe) {
  v1::ServeFormat f;
  f.set_recipe(recipe);
  f.set_direction(v1::DIRECTION_ROWWISE);
  return f;
}

struct Parts {
  std::vector<double> step, push, commit, pull, copy, release, daemon;
};

// One job of `set`'s shapes, stepped `steps` + 1 times per pull mode, its gradients pushed as
// `grad_mode` ("copied" or "lent").
void RunSet(const std::string& set, const std::string& fp8_name, const std::string& grad_mode,
            cudaStream_t stream, FILE* json) {
  const std::vector<bench::Shape> shapes = bench::ShapeSet(set);
  ClientOptions options;
  options.address = flags.address;
  options.transport = "cuda_ipc";
  options.max_message_bytes = 128 << 20;
  options.rpc_timeout = std::chrono::minutes(5);
  options.cuda_stream = reinterpret_cast<uintptr_t>(stream);
  options.lend_gradients = grad_mode == "lent";
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(options);
  Check(connected.status(), "connect");
  Client& client = **connected;

  const std::string job = "whole_step_" + set + "_" + fp8_name + "_" + grad_mode;
  v1::RegisterRequest request;
  request.set_job(job);
  request.set_world_size(1);
  std::vector<std::string> names;
  int64_t total = 0;
  for (size_t j = 0; j < shapes.size(); ++j) {
    v1::TensorSpec* t = request.add_tensors();
    names.push_back("t" + std::to_string(j));
    t->set_name(names.back());
    t->set_rows(shapes[j].rows);
    t->set_cols(shapes[j].cols);
    t->set_grad_type(v1::ELEMENT_TYPE_BF16);
    total += shapes[j].rows * shapes[j].cols;
  }
  request.mutable_state_policy()->set_exp_avg(v1::MOMENT_TYPE_FP8);
  request.mutable_state_policy()->set_exp_avg_sq(v1::MOMENT_TYPE_FP16);
  const v1::ServeFormat bf16 = Format(v1::RECIPE_BF16);
  const v1::ServeFormat fp8 =
      Format(fp8_name == "fp8_tensor" ? v1::RECIPE_FP8_TENSOR : v1::RECIPE_FP8_DELAYED);
  *request.add_serve() = bf16;
  *request.add_serve() = fp8;
  request.mutable_hyperparams()->set_lr(1e-4);
  request.mutable_hyperparams()->set_beta1(0.9);
  request.mutable_hyperparams()->set_beta2(0.999);
  request.mutable_hyperparams()->set_eps(1e-8);
  request.mutable_hyperparams()->set_weight_decay(0.01);
  Check(client.Register(request).status(), "register");
  if (client.transport_name() != "cuda_ipc") {
    std::fprintf(stderr, "whole_step_bench: got transport %s (%s), not cuda_ipc\n",
                 client.transport_name().c_str(), client.transport_reason().c_str());
    std::exit(1);
  }
  {
    const std::vector<float> initial(static_cast<size_t>(total), 0.01f);
    std::vector<PushItem> items;
    int64_t at = 0;
    for (size_t j = 0; j < shapes.size(); ++j) {
      const int64_t n = shapes[j].rows * shapes[j].cols;
      items.push_back({names[j], std::as_bytes(std::span<const float>(initial.data() + at, n))});
      at += n;
    }
    Check(client.UploadInitialWeights(job, items), "initial weights");
  }

  // The trainer's gradients (one buffer, a span per tensor) and its own copies of the weights.
  std::vector<int64_t> offsets;  // elements
  int64_t next = 0;
  for (const bench::Shape& s : shapes) {
    offsets.push_back(next);
    next += s.rows * s.cols;
  }
  void *d_grad = nullptr, *d_bf16 = nullptr, *d_fp8 = nullptr;
  CheckCuda(cudaMalloc(&d_grad, static_cast<size_t>(total) * 2), "cudaMalloc gradients");
  CheckCuda(cudaMalloc(&d_bf16, static_cast<size_t>(total) * 2), "cudaMalloc bf16 weights");
  CheckCuda(cudaMalloc(&d_fp8, static_cast<size_t>(total) + 16 * shapes.size()),
            "cudaMalloc fp8 weights");
  CheckCuda(cudaMemset(d_grad, 0x3A, static_cast<size_t>(total) * 2), "memset gradients");
  CheckCuda(cudaDeviceSynchronize(), "sync");
  std::vector<PushItem> grads;
  for (size_t j = 0; j < shapes.size(); ++j) {
    const int64_t n = shapes[j].rows * shapes[j].cols;
    grads.push_back({names[j], std::span<const std::byte>(
                                   static_cast<const std::byte*>(d_grad) + offsets[j] * 2,
                                   static_cast<size_t>(n) * 2)});
  }

  int64_t step = 0;
  std::vector<PulledView> held;  // the weights in use: the last step's views (in_place)
  for (const std::string& mode : Split(flags.pulls)) {
    const bool copied = mode == "copied";
    if (!copied && mode != "in_place") {
      std::fprintf(stderr, "whole_step_bench: unknown pull mode %s\n", mode.c_str());
      std::exit(1);
    }
    Parts parts;
    for (int s = 0; s < flags.steps + 1; ++s, ++step) {
      const auto t0 = Clock::now();
      Check(client.PushGradients(job, 0, step, grads), "push");
      const auto t1 = Clock::now();
      Check(client.Commit(job, 0, step).status(), "commit");
      const auto t2 = Clock::now();
      absl::StatusOr<std::vector<PulledView>> b =
          client.PullInPlaceMany({job, names, bf16, step + 1}, std::chrono::minutes(5));
      Check(b.status(), "pull bf16");
      absl::StatusOr<std::vector<PulledView>> f =
          client.PullInPlaceMany({job, names, fp8, step + 1}, std::chrono::minutes(5));
      Check(f.status(), "pull fp8_tensor");
      const auto t3 = Clock::now();
      std::vector<PulledView> fresh = *std::move(b);
      fresh.insert(fresh.end(), f->begin(), f->end());
      if (copied) {
        size_t fp8_at = 0;
        for (size_t j = 0; j < shapes.size(); ++j) {
          const PulledView& vb = fresh[j];
          const PulledView& vf = fresh[shapes.size() + j];
          CheckCuda(cudaMemcpyAsync(static_cast<std::byte*>(d_bf16) + offsets[j] * 2,
                                    vb.data.data(), vb.data.size(), cudaMemcpyDefault, stream),
                    "copy bf16");
          CheckCuda(cudaMemcpyAsync(static_cast<std::byte*>(d_fp8) + fp8_at, vf.data.data(),
                                    vf.data.size(), cudaMemcpyDefault, stream),
                    "copy fp8");
          fp8_at += vf.data.size();
        }
        CheckCuda(cudaStreamSynchronize(stream), "copy sync");
      } else {
        // The views are read on this stream, which waits for the step on the device: the step
        // is done once the stream is (with lent gradients nothing else waits for the device).
        CheckCuda(cudaStreamSynchronize(stream), "step sync");
      }
      const auto t4 = Clock::now();
      // Copied: these views go now. In place: the last step's go, these are kept.
      if (copied) {
        Check(client.Release(fresh), "release");
      } else {
        if (!held.empty()) Check(client.Release(held), "release");
        held = std::move(fresh);
      }
      const auto t5 = Clock::now();
      if (s == 0) continue;  // the first step of each mode maps the slots and the versions
      parts.step.push_back(Ms(t0, t5));
      parts.push.push_back(Ms(t0, t1));
      parts.commit.push_back(Ms(t1, t2));
      parts.pull.push_back(Ms(t2, t3));
      parts.copy.push_back(Ms(t3, t4));
      parts.release.push_back(Ms(t4, t5));
      absl::StatusOr<v1::StatusResponse> status = client.Status(job);
      Check(status.status(), "status");
      if (status->jobs_size() > 0)
        parts.daemon.push_back(status->jobs(0).last_step_seconds() * 1e3);
    }
    std::printf("| %s | %zu | %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
                set.c_str(), shapes.size(), fp8_name.c_str(), grad_mode.c_str(), mode.c_str(),
                Median(parts.step), Median(parts.push), Median(parts.commit), Median(parts.pull),
                Median(parts.copy), Median(parts.release), Median(parts.daemon));
    std::fflush(stdout);
    if (json != nullptr) {
      std::fprintf(json,
                   "{\"kind\": \"whole\", \"set\": \"%s\", \"tensors\": %zu, \"numel\": %lld, "
                   "\"fp8\": \"%s\", \"grads\": \"%s\", \"pull\": \"%s\", \"ms\": %.4f, "
                   "\"push_ms\": %.4f, "
                   "\"commit_ms\": %.4f, "
                   "\"pull_ms\": %.4f, \"copy_ms\": %.4f, \"release_ms\": %.4f, "
                   "\"daemon_step_ms\": %.4f}\n",
                   set.c_str(), shapes.size(), static_cast<long long>(total), fp8_name.c_str(),
                   grad_mode.c_str(), mode.c_str(), Median(parts.step), Median(parts.push),
                   Median(parts.commit), Median(parts.pull), Median(parts.copy),
                   Median(parts.release), Median(parts.daemon));
      std::fflush(json);
    }
  }
  if (!held.empty()) Check(client.Release(held), "release");
  Check(client.DeleteJob(job).status(), "delete job");
  cudaFree(d_grad);
  cudaFree(d_bf16);
  cudaFree(d_fp8);
}

int Main() {
  CheckCuda(cudaSetDevice(flags.device), "cudaSetDevice");
  cudaStream_t stream;
  CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  FILE* json = flags.json.empty() ? nullptr : std::fopen(flags.json.c_str(), "w");
  std::printf("whole step over cuda_ipc, trainer on GPU %d (median of %d steps, ms)\n",
              flags.device, flags.steps);
  std::printf(
      "| set | tensors | fp8 | grads | pull | step | push | commit | pull | copy | release | "
      "daemon's step |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
      "|\n");
  for (const std::string& fp8 : Split(flags.fp8)) {
    if (fp8 != "fp8_tensor" && fp8 != "fp8_delayed") {
      std::fprintf(stderr, "whole_step_bench: --fp8 takes fp8_tensor, fp8_delayed\n");
      return 2;
    }
    for (const std::string& set : Split(flags.sets)) {
      for (const std::string& grads : Split(flags.grads)) {
        if (grads != "copied" && grads != "lent") {
          std::fprintf(stderr, "whole_step_bench: --grads takes copied, lent\n");
          return 2;
        }
        RunSet(set, fp8, grads, stream, json);
      }
    }
  }
  if (json != nullptr) std::fclose(json);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace paramd

int main(int argc, char** argv) {
  if (!paramd::ParseFlags(argc, argv)) return 2;
  return paramd::Main();
}
