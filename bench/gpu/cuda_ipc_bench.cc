// cuda_ipc push and pull against the copy a process makes between its own buffers on the same two
// GPUs, measured in the same run (DESIGN.md §10: >= 0.9 of the device copy on one GPU, of the peer
// copy across two). A daemon on --daemon_device runs in another process; this process works on
// --device. One push = the copy on the trainer's stream + a stream sync + the in-place marks (the
// step's slot places were asked ahead by the previous push); one pull = the place pull (lease) +
// the copy into this process's buffer + a stream sync + Release. The ratio counts the call's whole
// time, RPCs included. Correctness rides along: a small tensor pushed and pulled through cuda_ipc
// must end bit-identical to a job pushed and pulled inline with the same gradients.
// With --step_mparams=N, also a whole training step of N million parameters by transport, as a GPU
// trainer sees it (BF16 gradients in its GPU memory, BF16 weights wanted there; fp32 master, FP8
// exp_avg, FP16 exp_avg_sq): cuda_ipc pushes from and pulls into GPU memory; inline copies the
// gradients down to page-locked host memory, pushes, pulls, and copies the weights up.
//   paramd_cuda_ipc_bench --address=HOST:PORT [--device=0] [--daemon_device=0] [--mib=4096]
//                         [--step_mparams=1000] [--step_iters=3]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/client.h"

namespace paramd {
namespace {

// Flags, parsed by hand: this file is built beside the kernels' benchmarks, before absl's CMake
// targets exist.
struct Flags {
  std::string address = "127.0.0.1:50051";  // the daemon (on a cuda:N backend)
  int device = 0;                           // this process's GPU
  int daemon_device = 0;                    // the daemon's GPU, as this process numbers it
  int64_t mib = 4096;                       // MiB of the tensor moved per push and per pull
  int iters = 8;                            // timed pushes (each a step) and pulls
  std::string job = "ipc_bench";            // job name prefix
  int64_t step_mparams = 0;                 // whole-step figure's parameters, millions (0: none)
  int step_iters = 3;                       // timed whole steps per transport
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
    } else if (key == "--daemon_device") {
      flags.daemon_device = std::stoi(value);
    } else if (key == "--mib") {
      flags.mib = std::stoll(value);
    } else if (key == "--iters") {
      flags.iters = std::stoi(value);
    } else if (key == "--job") {
      flags.job = value;
    } else if (key == "--step_mparams") {
      flags.step_mparams = std::stoll(value);
    } else if (key == "--step_iters") {
      flags.step_iters = std::stoi(value);
    } else {
      std::fprintf(stderr, "cuda_ipc_bench: unknown flag %s\n", arg.c_str());
      return false;
    }
  }
  return true;
}

using Clock = std::chrono::steady_clock;

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "cuda_ipc_bench: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}
void CheckCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "cuda_ipc_bench: %s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

v1::RegisterRequest Job(const std::string& name, int64_t big_cols, int64_t small_cols) {
  v1::RegisterRequest r;
  r.set_job(name);
  r.set_world_size(1);
  auto add = [&r](const char* tensor, int64_t cols) {
    v1::TensorSpec* t = r.add_tensors();
    t->set_name(tensor);
    t->set_rows(1);
    t->set_cols(cols);
    t->set_grad_type(v1::ELEMENT_TYPE_FP32);
  };
  if (big_cols > 0) add("big", big_cols);
  add("small", small_cols);
  r.mutable_hyperparams()->set_lr(1e-3);
  r.mutable_hyperparams()->set_beta1(0.9);
  r.mutable_hyperparams()->set_beta2(0.999);
  r.mutable_hyperparams()->set_eps(1e-8);
  return r;
}

std::unique_ptr<Client> Connect(const std::string& transport) {
  ClientOptions options;
  options.address = flags.address;
  options.transport = transport;
  options.max_message_bytes = 128 << 20;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  Check(client.status(), "connect");
  return *std::move(client);
}

PullTarget Target(const std::string& job, const char* tensor, int64_t version) {
  PullTarget target{job, tensor, {}, version};
  target.format.set_recipe(v1::RECIPE_FP32);
  return target;
}

std::span<const std::byte> DeviceSpan(const void* d_ptr, size_t bytes) {
  return {static_cast<const std::byte*>(d_ptr), bytes};
}

// GB/s of `bytes` copied from `src` to `dst` on `stream`, best of `iters`.
double CopyRate(void* dst, const void* src, size_t bytes, int iters, cudaStream_t stream) {
  double best = 1e30;
  for (int i = 0; i < iters + 1; ++i) {
    const auto start = Clock::now();
    CheckCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), "baseline copy");
    CheckCuda(cudaStreamSynchronize(stream), "baseline sync");
    if (i > 0) best = std::min(best, Seconds(start));  // the first warms up
  }
  return static_cast<double>(bytes) / best / 1e9;
}

// Median milliseconds of a whole step (push + commit + pull of every parameter) of `elements`
// parameters over `transport`, with the gradients and the weights in this process's GPU memory.
double StepMs(const std::string& transport, int64_t elements, cudaStream_t stream) {
  std::unique_ptr<Client> client = Connect(transport);
  const std::string job = flags.job + "_step_" + transport + "_" + std::to_string(flags.device);
  v1::RegisterRequest request = Job(job, elements, 0);
  request.mutable_tensors()->DeleteSubrange(1, 1);  // "big" only
  request.mutable_tensors(0)->set_grad_type(v1::ELEMENT_TYPE_BF16);
  request.mutable_state_policy()->set_exp_avg(v1::MOMENT_TYPE_FP8);
  request.mutable_state_policy()->set_exp_avg_sq(v1::MOMENT_TYPE_FP16);
  v1::ServeFormat bf16;
  bf16.set_recipe(v1::RECIPE_BF16);
  *request.add_serve() = bf16;
  Check(client->Register(request).status(), "register step job");
  if (client->transport_name() != transport) {
    std::fprintf(stderr, "cuda_ipc_bench: got transport %s, not %s\n",
                 client->transport_name().c_str(), transport.c_str());
    std::exit(1);
  }
  {
    const std::vector<float> initial(static_cast<size_t>(elements), 0.01f);
    const PushItem items[] = {{"big", std::as_bytes(std::span<const float>(initial))}};
    Check(client->UploadInitialWeights(job, items), "step job's initial weights");
  }
  const size_t bytes = static_cast<size_t>(elements) * 2;
  void *d_grad = nullptr, *d_weights = nullptr, *h_grad = nullptr;
  CheckCuda(cudaMalloc(&d_grad, bytes), "cudaMalloc step grad");
  CheckCuda(cudaMalloc(&d_weights, bytes), "cudaMalloc step weights");
  CheckCuda(cudaMemset(d_grad, 0x3A, bytes), "memset step grad");  // BF16 0x3A3A: about 7e-4
  const bool ipc = transport == "cuda_ipc";
  if (!ipc) CheckCuda(cudaMallocHost(&h_grad, bytes), "cudaMallocHost step grad");
  std::vector<double> ms;
  for (int s = 0; s < flags.step_iters + 1; ++s) {
    PullTarget target{job, "big", bf16, s + 1};
    const auto start = Clock::now();
    if (ipc) {
      const PushItem items[] = {{"big", DeviceSpan(d_grad, bytes)}};
      Check(client->PushGradients(job, 0, s, items), "step push");
      Check(client->Commit(job, 0, s).status(), "step commit");
      absl::StatusOr<PulledView> view = client->PullInPlace(target, std::chrono::minutes(5));
      Check(view.status(), "step pull in place");
      CheckCuda(cudaMemcpyAsync(d_weights, view->data.data(), bytes, cudaMemcpyDefault, stream),
                "step weights copy");
      CheckCuda(cudaStreamSynchronize(stream), "step sync");
      Check(client->Release(*view), "step release");
    } else {
      CheckCuda(cudaMemcpyAsync(h_grad, d_grad, bytes, cudaMemcpyDeviceToHost, stream), "down");
      CheckCuda(cudaStreamSynchronize(stream), "down sync");
      const PushItem items[] = {{"big", DeviceSpan(h_grad, bytes)}};
      Check(client->PushGradients(job, 0, s, items), "step push");
      Check(client->Commit(job, 0, s).status(), "step commit");
      Pulled pulled;
      Check(client->Pull(target, std::chrono::minutes(5), &pulled), "step pull");
      CheckCuda(cudaMemcpy(d_weights, pulled.data.data(), bytes, cudaMemcpyHostToDevice), "up");
    }
    if (s > 0) ms.push_back(Seconds(start) * 1e3);  // the first step allocates and maps
  }
  cudaFree(d_grad);
  cudaFree(d_weights);
  if (h_grad != nullptr) cudaFreeHost(h_grad);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int Main() {
  const int device = flags.device;
  const int daemon_device = flags.daemon_device;
  const int iters = flags.iters;
  const int64_t n = flags.mib * (1 << 20) / 4;
  const size_t bytes = static_cast<size_t>(n) * 4;
  constexpr int64_t kSmall = 1 << 16;
  const std::string job = flags.job + "_" + std::to_string(device);
  const std::string ref = job + "_inline";

  CheckCuda(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream;
  CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  if (device != daemon_device) {
    const cudaError_t e = cudaDeviceEnablePeerAccess(daemon_device, 0);
    if (e != cudaErrorPeerAccessAlreadyEnabled) CheckCuda(e, "cudaDeviceEnablePeerAccess");
  }
  void *d_grad = nullptr, *d_out = nullptr, *d_remote = nullptr;
  CheckCuda(cudaMalloc(&d_grad, bytes), "cudaMalloc grad");
  CheckCuda(cudaMalloc(&d_out, bytes), "cudaMalloc out");
  CheckCuda(cudaMemset(d_grad, 0, bytes), "memset");
  CheckCuda(cudaSetDevice(daemon_device), "cudaSetDevice daemon's");
  CheckCuda(cudaMalloc(&d_remote, bytes), "cudaMalloc on the daemon's GPU");
  CheckCuda(cudaSetDevice(device), "cudaSetDevice");

  std::unique_ptr<Client> ipc = Connect("cuda_ipc");
  std::unique_ptr<Client> inl = Connect("inline");
  Check(ipc->Register(Job(job, n, kSmall)).status(), "register");
  Check(inl->Register(Job(ref, 0, kSmall)).status(), "register reference");
  std::printf("transport %s (%s)\n", ipc->transport_name().c_str(),
              ipc->transport_reason().c_str());
  {
    const std::vector<float> big(static_cast<size_t>(n), 0.01f);
    std::vector<float> small(kSmall);
    for (int64_t i = 0; i < kSmall; ++i) small[i] = 0.001f * static_cast<float>(i % 977);
    const auto start = Clock::now();
    const PushItem items[] = {{"big", std::as_bytes(std::span<const float>(big))},
                              {"small", std::as_bytes(std::span<const float>(small))}};
    Check(ipc->UploadInitialWeights(job, items), "initial weights");
    Check(inl->UploadInitialWeights(ref, std::span<const PushItem>(items + 1, 1)),
          "reference initial weights");
    std::printf("initial weights: %.1f s\n", Seconds(start));
  }

  // Pushes: one step each; only the big tensor's Push call is timed.
  std::vector<float> small_grad(kSmall);
  void* d_small = nullptr;
  CheckCuda(cudaMalloc(&d_small, kSmall * 4), "cudaMalloc small");
  double push_best = 1e30;
  for (int s = 0; s < iters + 1; ++s) {
    for (int64_t i = 0; i < kSmall; ++i) {
      small_grad[i] = 1e-3f * static_cast<float>((i * 7 + s * 13) % 101 - 50);
    }
    CheckCuda(cudaMemcpy(d_small, small_grad.data(), kSmall * 4, cudaMemcpyHostToDevice), "up");
    const PushItem big[] = {{"big", DeviceSpan(d_grad, bytes)}};
    const PushItem small_dev[] = {{"small", DeviceSpan(d_small, kSmall * 4)}};
    const PushItem small_host[] = {{"small", std::as_bytes(std::span<const float>(small_grad))}};
    const auto start = Clock::now();
    Check(ipc->PushGradients(job, 0, s, big), "push");
    if (s > 0) push_best = std::min(push_best, Seconds(start));  // the first maps the slots
    Check(ipc->PushGradients(job, 0, s, small_dev), "push small");
    Check(inl->PushGradients(ref, 0, s, small_host), "push reference");
    Check(ipc->Commit(job, 0, s).status(), "commit");
    Check(inl->Commit(ref, 0, s).status(), "commit reference");
    Pulled done;
    Check(ipc->Pull(Target(job, "small", s + 1), std::chrono::minutes(5), &done), "wait");
  }
  const int64_t version = iters + 1;

  // Pulls of the newest version, in place then copied on this process's stream.
  double pull_best = 1e30, pull_no_release = 1e30;
  for (int i = 0; i < iters + 1; ++i) {
    const auto start = Clock::now();
    absl::StatusOr<PulledView> view =
        ipc->PullInPlace(Target(job, "big", version), std::chrono::minutes(1));
    Check(view.status(), "pull in place");
    if (view->data.size() != bytes) {
      std::fprintf(stderr, "cuda_ipc_bench: pulled %zu bytes, not %zu\n", view->data.size(), bytes);
      return 1;
    }
    CheckCuda(cudaMemcpyAsync(d_out, view->data.data(), bytes, cudaMemcpyDefault, stream),
              "pull copy");
    CheckCuda(cudaStreamSynchronize(stream), "pull sync");
    const double copied = Seconds(start);
    Check(ipc->Release(*view), "release");
    if (i > 0) {
      pull_best = std::min(pull_best, Seconds(start));
      pull_no_release = std::min(pull_no_release, copied);
    }
  }

  // The copies this process makes itself between the same two GPUs.
  const double push_ceiling = CopyRate(d_remote, d_grad, bytes, iters, stream);
  const double pull_ceiling = CopyRate(d_out, d_remote, bytes, iters, stream);

  // Correctness: the small tensor through cuda_ipc both ways equals the inline reference.
  Pulled a, b;
  Check(ipc->Pull(Target(job, "small", version), std::chrono::minutes(1), &a), "pull small");
  Check(inl->Pull(Target(ref, "small", version), std::chrono::minutes(1), &b), "pull reference");
  absl::StatusOr<PulledView> view =
      ipc->PullInPlace(Target(job, "small", version), std::chrono::minutes(1));
  Check(view.status(), "pull small in place");
  std::vector<std::byte> in_place(view->data.size());
  CheckCuda(cudaMemcpy(in_place.data(), view->data.data(), in_place.size(), cudaMemcpyDefault),
            "copy view");
  Check(ipc->Release(*view), "release small");
  const bool exact = a.data == b.data && in_place == b.data && a.header.version() == version;

  const double push = static_cast<double>(bytes) / push_best / 1e9;
  const double pull = static_cast<double>(bytes) / pull_best / 1e9;
  const double pull_nr = static_cast<double>(bytes) / pull_no_release / 1e9;
  const char* kind = device == daemon_device ? "same GPU, device copy" : "peer GPU, peer copy";
  std::printf("\n%lld MiB per call, trainer on GPU %d, daemon on GPU %d (%s)\n",
              static_cast<long long>(flags.mib), device, daemon_device, kind);
  std::printf("| what | GB/s | copy GB/s (same run) | ratio |\n| --- | --- | --- | --- |\n");
  std::printf("| cuda_ipc push (Attach + copy + sync + mark) | %.0f | %.0f | %.3f |\n", push,
              push_ceiling, push / push_ceiling);
  std::printf("| cuda_ipc pull (place pull + copy + sync + Release) | %.0f | %.0f | %.3f |\n", pull,
              pull_ceiling, pull / pull_ceiling);
  std::printf("| cuda_ipc pull without the Release call | %.0f | %.0f | %.3f |\n", pull_nr,
              pull_ceiling, pull_nr / pull_ceiling);
  std::printf("bit-identical to the inline reference: %s\n", exact ? "yes" : "NO");
  if (flags.step_mparams > 0) {
    const int64_t elements = flags.step_mparams * 1000000;
    const double ipc_ms = StepMs("cuda_ipc", elements, stream);
    const double inline_ms = StepMs("inline", elements, stream);
    std::printf(
        "\nwhole step of %lld M parameters (BF16 gradients and weights in GPU %d's memory)\n",
        static_cast<long long>(flags.step_mparams), device);
    std::printf("| transport | ms per step (median of %d) | |\n| --- | --- | --- |\n",
                flags.step_iters);
    std::printf("| cuda_ipc | %.1f | %.2fx faster than inline |\n", ipc_ms, inline_ms / ipc_ms);
    std::printf("| inline | %.1f | |\n", inline_ms);
  }
  cudaFree(d_small);
  cudaFree(d_grad);
  cudaFree(d_out);
  cudaFree(d_remote);
  return exact ? 0 : 1;
}

}  // namespace
}  // namespace paramd

int main(int argc, char** argv) {
  if (!paramd::ParseFlags(argc, argv)) return 2;
  return paramd::Main();
}
