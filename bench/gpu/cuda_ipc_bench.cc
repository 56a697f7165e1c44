// cuda_ipc push and pull against the copy a process makes between its own buffers on the same two
// GPUs, measured in the same run (DESIGN.md §10: >= 0.9 of the device copy on one GPU, of the peer
// copy across two). A daemon on --daemon_device runs in another process; this process works on
// --device. One push = Attach (the step's slot places) + the copy on the trainer's stream + a
// stream sync + the in-place mark; one pull = the place pull (lease) + the copy into this process's
// buffer + a stream sync + Release. The ratio counts the call's whole time, RPCs included.
// Correctness rides along: a small tensor pushed and pulled through cuda_ipc must end bit-identical
// to a job pushed and pulled inline with the same gradients.
//   paramd_cuda_ipc_bench --address=HOST:PORT [--device=0] [--daemon_device=0] [--mib=4096]
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
