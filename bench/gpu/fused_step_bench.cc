// GPU fused-step benchmark (DESIGN.md §10): FusedStepCuda on an H200-class GPU against the
// device's own copy ceiling measured in the same run (cudaMemcpyAsync device-to-device of 4 GiB,
// read + write counted), for the issue's policy (fp32 master, bf16 gradient from one rank, fp8
// exp_avg, fp16 exp_avg_sq, serving mxfp8 rowwise + columnwise) on 1e9 parameters laid out three
// ways: one tensor, ~300 LLM-shaped tensors, 10,000 small tensors. Also the fp32 policy (fp32
// gradient and states, no served copy: what torch.optim.AdamW(fused=True) does) for the peers, and
// the same state policy serving BF16 rowwise + fp8_tensor rowwise ("serve") or + fp8_delayed
// rowwise ("delayed"): the whole-step benchmark's served sets (bench/gpu/whole_step_bench.cc),
// whose kernel-alone figures it gives.
//
// Bytes moved = the policy's compulsory bytes: every input read once, every output written once,
// scales included. Prints a table, and one JSON object per line with --json FILE (scripts/gpu.sh
// joins it with bench/gpu/peer_torch_adam.py's numbers).
//
//   paramd_gpu_step_bench [--sets one,llm,small] [--policies issue,fp32] [--reps 20] [--sweep]
//                         [--json FILE]      (policies: issue, issue32, fp32, serve, delayed)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu/shape_sets.h"
#include "kernels/cuda_step.h"
#include "kernels/formats.h"
#include "kernels/recipes.h"

namespace paramd::kernels {
namespace {

#define BENCH_CUDA(call)                                                                       \
  do {                                                                                         \
    const cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, \
                   __LINE__);                                                                  \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

void Check(const KStatus& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, st.message().c_str());
    std::exit(1);
  }
}

using bench::Shape;
using bench::ShapeSet;

// Fills a device buffer from a repeated block of host random bytes made by `gen`.
template <typename T, typename Gen>
void Fill(void* d, int64_t count, Gen gen) {
  constexpr int64_t kBlock = 1 << 22;
  std::vector<T> block(static_cast<size_t>(std::min(count, kBlock)));
  for (T& x : block) x = gen();
  for (int64_t at = 0; at < count; at += kBlock) {
    const int64_t n = std::min(kBlock, count - at);
    BENCH_CUDA(
        cudaMemcpy(static_cast<T*>(d) + at, block.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
}

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
};

template <typename Fn>
Timing TimeIt(Fn fn, int warmup, int reps, cudaStream_t stream) {
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn();
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    BENCH_CUDA(cudaEventRecord(a, stream));
    fn();
    BENCH_CUDA(cudaEventRecord(b, stream));
    BENCH_CUDA(cudaEventSynchronize(b));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

// The device copy ceiling: cudaMemcpyAsync of 4 GiB, bytes read + written per second.
double CopyCeilingGBs(cudaStream_t stream, int reps) {
  const size_t bytes = size_t{4} << 30;
  void *src = nullptr, *dst = nullptr;
  BENCH_CUDA(cudaMalloc(&src, bytes));
  BENCH_CUDA(cudaMalloc(&dst, bytes));
  BENCH_CUDA(cudaMemset(src, 0x3C, bytes));
  const Timing t = TimeIt(
      [&] { BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)); }, 2,
      reps, stream);
  BENCH_CUDA(cudaFree(src));
  BENCH_CUDA(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) / (t.median_ms * 1e-3) / 1e9;
}

// kIssueFp32Grad: the issue's states and outputs with an fp32 gradient (fp32 parameters).
enum class Policy { kIssue, kIssueFp32Grad, kFp32, kServe, kServeDelayed };

// All device buffers of one shape set under one policy, and its plan.
class Job {
 public:
  Job(const std::vector<Shape>& shapes, Policy policy, cudaStream_t stream) : stream_(stream) {
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const bool issue = policy != Policy::kFp32;  // the same states
    const bool bf16_grad = issue && policy != Policy::kIssueFp32Grad;
    const StatePolicy sp =
        issue ? MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp16)
              : StatePolicy{};
    for (size_t j = 0; j < shapes.size(); ++j) {
      const int64_t n = shapes[j].rows * shapes[j].cols;
      numel_ += n;
      CudaStepTensor t;
      t.rows = shapes[j].rows;
      t.cols = shapes[j].cols;
      t.policy = sp;
      t.tensor_index = static_cast<uint32_t>(j);
      t.slot_type = bf16_grad ? SlotType::kBf16 : SlotType::kFp32;
      const int64_t chunks = NumChunks(n);
      void* master = Alloc(n * 4);
      void* grad = Alloc(n * (bf16_grad ? 2 : 4));
      void* m = Alloc(n * (issue ? 1 : 4));
      void* v = Alloc(n * (issue ? 2 : 4));
      Fill<float>(master, n, [&] { return normal(rng) * 0.02f; });
      if (issue) {
        if (bf16_grad) {
          Fill<uint16_t>(grad, n, [&] { return Bf16FromFloat(normal(rng) * 1e-3f); });
        } else {
          Fill<float>(grad, n, [&] { return normal(rng) * 1e-3f; });
        }
        Fill<uint8_t>(m, n, [&] { return static_cast<uint8_t>(rng() % 0x7F) | (rng() & 0x80); });
        Fill<uint16_t>(v, n, [&] { return static_cast<uint16_t>(rng() % 0x7BFF); });
        float* ms = static_cast<float*>(Alloc(chunks * 4));
        float* vs = static_cast<float*>(Alloc(chunks * 4));
        Fill<float>(ms, chunks, [] { return Pow2(-12); });
        Fill<float>(vs, chunks, [] { return Pow2(-24); });
        t.d_exp_avg_scale_inv = ms;
        t.d_exp_avg_sq_scale_inv = vs;
        const std::vector<std::pair<Recipe, Direction>> served =
            policy == Policy::kServe || policy == Policy::kServeDelayed
                ? std::vector<std::pair<Recipe, Direction>>{{Recipe::kBf16, Direction::kRowwise},
                                                            {policy == Policy::kServe
                                                                 ? Recipe::kFp8Tensor
                                                                 : Recipe::kFp8Delayed,
                                                             Direction::kRowwise}}
                : std::vector<std::pair<Recipe, Direction>>{
                      {Recipe::kMxfp8, Direction::kRowwise},
                      {Recipe::kMxfp8, Direction::kColumnwise}};
        for (const auto& [recipe, dir] : served) {
          const ServeBufferLayout l = ServeLayout(recipe, dir, t.rows, t.cols);
          void* scales = l.scale_bytes > 0 ? Alloc(l.scale_bytes) : nullptr;
          t.outputs.push_back({recipe, dir, Alloc(l.data_bytes), scales});
          bytes_ += l.data_bytes + l.scale_bytes;
        }
        if (policy == Policy::kServe || policy == Policy::kServeDelayed) {
          // The fp8 scales and the amax are device scalars per tensor.
          float* scalars = static_cast<float*>(Alloc(3 * sizeof(float)));
          Fill<float>(scalars, 3, [] { return 1.0f; });
          t.d_fp8_tensor_scale = scalars;
          t.d_fp8_delayed_scale = scalars + 1;
          t.d_master_amax = scalars + 2;
        }
        // Read and written: master 4 + 4, gradient 2, exp_avg 1 + 1, exp_avg_sq 2 + 2, and both
        // moments' chunk scales, read and written.
        bytes_ += n * (8 + 2 + 2 + 4) + chunks * 4 * 4;
      } else {
        Fill<float>(grad, n, [&] { return normal(rng) * 1e-3f; });
        Fill<float>(m, n, [&] { return normal(rng) * 1e-4f; });
        Fill<float>(v, n, [&] { return normal(rng) * normal(rng) * 1e-8f + 1e-8f; });
        bytes_ += n * (8 + 4 + 8 + 8);
      }
      t.d_slots = {grad};
      t.d_master = master;
      t.d_exp_avg = m;
      t.d_exp_avg_sq = v;
      tensors_.push_back(std::move(t));
    }
    Check(CudaStepPlan::Create(tensors_, &plan_), "plan");
    workspace_ = Alloc(static_cast<int64_t>(plan_.workspace_bytes()));
    Check(plan_.Bind(workspace_, plan_.workspace_bytes(), stream_), "bind");
    AdamwHyper hyper;
    hyper.weight_decay = 0.01;
    scalars_.adamw = MakeAdamwScalars(hyper, 10);
    scalars_.grad_scale = 0.5f;
    scalars_.seed = 7;
    scalars_.k = 10;
  }
  ~Job() {
    for (void* p : allocations_) cudaFree(p);
  }

  Timing Time(const CudaStepTuning& tuning, int reps) {
    return TimeIt([&] { Check(FusedStepCuda(plan_, scalars_, stream_, tuning), "step"); }, 3, reps,
                  stream_);
  }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return bytes_; }
  const CudaStepPlan& plan() const { return plan_; }

 private:
  // Sub-allocates from 2 GiB arenas (256-byte aligned): 10,000 tensors would otherwise cost
  // 100,000 cudaMalloc calls.
  void* Alloc(int64_t bytes) {
    const size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + 255) / 256 * 256;
    if (arena_left_ < size) {
      const size_t chunk = std::max(size, size_t{2} << 30);
      void* p = nullptr;
      BENCH_CUDA(cudaMalloc(&p, chunk));
      allocations_.push_back(p);
      arena_ = static_cast<unsigned char*>(p);
      arena_left_ = chunk;
    }
    void* out = arena_;
    arena_ += size;
    arena_left_ -= size;
    return out;
  }
  unsigned char* arena_ = nullptr;
  size_t arena_left_ = 0;

  cudaStream_t stream_;
  std::vector<CudaStepTensor> tensors_;
  std::vector<void*> allocations_;
  CudaStepPlan plan_;
  void* workspace_ = nullptr;
  CudaStepScalars scalars_;
  int64_t numel_ = 0, bytes_ = 0;
};

struct Row {
  std::string set, policy, tuning;
  int64_t numel, tensors;
  double ms, gbs, ratio, gelems;
};

}  // namespace
}  // namespace paramd::kernels

int main(int argc, char** argv) {
  using namespace paramd::kernels;
  std::string sets = "one,llm,small", policies = "issue,fp32", json;
  int reps = 20;
  bool sweep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sets" && i + 1 < argc) {
      sets = argv[++i];
    } else if (a == "--policies" && i + 1 < argc) {
      policies = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--sweep") {
      sweep = true;
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--sets one,llm,small] [--policies issue,issue32,fp32,serve,delayed] "
                   "[--reps N] "
                   "[--sweep] [--json F]\n",
                   argv[0]);
      return 2;
    }
  }
  std::string why;
  if (!CudaDeviceAvailable(&why)) {
    std::printf("no CUDA device: %s; nothing measured\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  const double ceiling = CopyCeilingGBs(stream, reps);
  std::printf(
      "device: %s, %d SMs; copy ceiling (cudaMemcpyAsync D2D 4 GiB, read+write): %.0f GB/s\n",
      prop.name, prop.multiProcessorCount, ceiling);

  FILE* json_file = json.empty() ? nullptr : std::fopen(json.c_str(), "w");
  if (json_file != nullptr) {
    std::fprintf(json_file, "{\"kind\": \"ceiling\", \"gbs\": %.1f, \"device\": \"%s\"}\n", ceiling,
                 prop.name);
    std::fflush(json_file);
  }
  std::vector<Row> rows;
  CudaStepTuning best{};
  auto record = [&](const std::string& set, const char* policy, Job& job,
                    const CudaStepTuning& tuning, const Timing& t) {
    Row r;
    r.set = set;
    r.policy = policy;
    r.tuning = std::to_string(tuning.blocks_per_sm) + "x" + std::to_string(tuning.stages) + "r" +
               std::to_string(tuning.rows_per_warp) + (tuning.generic ? "g" : "");
    r.numel = job.numel();
    r.tensors = job.plan().num_tensors();
    r.ms = t.median_ms;
    r.gbs = static_cast<double>(job.bytes()) / (t.median_ms * 1e-3) / 1e9;
    r.ratio = r.gbs / ceiling;
    r.gelems = static_cast<double>(job.numel()) / (t.median_ms * 1e-3) / 1e9;
    rows.push_back(r);
    if (json_file != nullptr) {
      std::fprintf(json_file,
                   "{\"kind\": \"paramd\", \"set\": \"%s\", \"policy\": \"%s\", \"tuning\": "
                   "\"%s\", \"tensors\": %ld, \"numel\": %ld, \"ms\": %.4f, \"gbs\": %.1f, "
                   "\"ratio\": %.4f, \"gelems\": %.2f}\n",
                   r.set.c_str(), r.policy.c_str(), r.tuning.c_str(), static_cast<long>(r.tensors),
                   static_cast<long>(r.numel), r.ms, r.gbs, r.ratio, r.gelems);
      std::fflush(json_file);
    }
    std::printf(
        "  %-5s %-5s tuning %-5s %4ld tensors %.3e elems: %8.3f ms  %6.0f GB/s  %.3f of copy  "
        "%6.1f Gelem/s (%.2f B/elem)\n",
        r.set.c_str(), r.policy.c_str(), r.tuning.c_str(), static_cast<long>(r.tensors),
        static_cast<double>(r.numel), r.ms, r.gbs, r.ratio, r.gelems,
        static_cast<double>(job.bytes()) / job.numel());
    std::fflush(stdout);
  };

  size_t start = 0;
  while (start <= sets.size()) {
    size_t end = sets.find(',', start);
    if (end == std::string::npos) end = sets.size();
    const std::string set = sets.substr(start, end - start);
    start = end + 1;
    if (set.empty()) continue;
    const auto wanted = [&policies](const char* name) {
      return ("," + policies + ",").find(std::string(",") + name + ",") != std::string::npos;
    };
    if (wanted("issue")) {
      Job job(ShapeSet(set), Policy::kIssue, stream);
      if (sweep) {  // on the first set; the others use its best
        double best_ms = 1e30;
        for (int rows : {1, 2, 4}) {
          for (int bps : {0, 1, 2, 3}) {
            for (int stages : {0, 2, 4}) {
              const CudaStepTuning tuning{bps, stages, rows};
              const Timing t = job.Time(tuning, std::max(5, reps / 4));
              record(set, "issue", job, tuning, t);
              if (t.median_ms < best_ms) best_ms = t.median_ms, best = tuning;
            }
          }
        }
        sweep = false;
      }
      record(set, "issue", job, {}, job.Time({}, reps));
      if (best.rows_per_warp != 0) record(set, "issue", job, best, job.Time(best, reps));
      if (set == "one") {  // the kernel that reads the policy per tensor, for comparison
        CudaStepTuning generic = best;
        generic.generic = true;
        record(set, "generic", job, generic, job.Time(generic, reps));
      }
    }
    if (wanted("issue32")) {  // fp32 gradients: the kernel compiled for them, at each rows/warp
      Job job(ShapeSet(set), Policy::kIssueFp32Grad, stream);
      for (int rows : {2, 4}) {
        record(set, "issue32", job, CudaStepTuning{0, 0, rows}, job.Time({0, 0, rows}, reps));
      }
      CudaStepTuning generic;
      generic.generic = true;
      record(set, "issue32g", job, generic, job.Time(generic, reps));
    }
    if (wanted("serve")) {
      Job job(ShapeSet(set), Policy::kServe, stream);
      record(set, "serve", job, {}, job.Time({}, reps));
    }
    if (wanted("delayed")) {
      Job job(ShapeSet(set), Policy::kServeDelayed, stream);
      record(set, "delayed", job, {}, job.Time({}, reps));
    }
    if (set == "one" && wanted("fp32")) {
      Job job(ShapeSet(set), Policy::kFp32, stream);
      record(set, "fp32", job, {}, job.Time({}, reps));
    }
  }

  std::printf("\n%-6s %-6s %-6s %8s %9s %8s %9s\n", "set", "policy", "tuning", "ms", "GB/s",
              "of copy", "Gelem/s");
  for (const Row& r : rows) {
    std::printf("%-6s %-6s %-6s %8.3f %9.0f %8.3f %9.1f\n", r.set.c_str(), r.policy.c_str(),
                r.tuning.c_str(), r.ms, r.gbs, r.ratio, r.gelems);
  }
  if (json_file != nullptr) std::fclose(json_file);
  BENCH_CUDA(cudaStreamDestroy(stream));
  return 0;
}
