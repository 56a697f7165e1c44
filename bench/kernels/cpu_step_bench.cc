// paramd_cpu_step_bench: the CPU fused step of every state policy (one fp32 gradient slot) against
// this machine's own memory ceiling, measured in the same run (DESIGN.md §10).
//
// Per policy: the step in elements/s and in bytes/s of the policy's compulsory bytes (each stream
// read once, each written once, chunk scales included), and as a ratio to the ceiling = the fastest
// of (a) multithreaded memcpy, counted read + write, and (b) a vectorized loop with the policy's
// own access pattern and no arithmetic (every stream read and written as the step does, with a
// streaming store for the write-only served output, with and without the step's prefetch).
// The step is the daemon's (kernels/cpu_step.h: 128-row panels over the threads); policies that
// serve FP8 quantize it with kernels/recipes.h panel by panel, while the panel is in cache. A
// table, or with --json one JSON line per policy for scripts. --grain sets the blocks of the
// ceiling loops and of the fill. --out-of-place steps a second copy of the state: read from one
// (FusedStepArgs' *_in), written to the other, the same bytes per element.
//
//   paramd_cpu_step_bench [--threads N] [--n ELEMENTS] [--reps R] [--grain G]
//                         [--path auto|scalar|avx2|avx512] [--policy NAME[,NAME...]|all] [--json]
//                         [--out-of-place] [--list]

// GCC 12 reports its own _mm512_undefined_*() placeholders as (maybe-)uninitialized (a known false
// positive of the AVX-512 intrinsic headers), so those warnings are off for them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu_step.h"
#include "kernels/fused_step.h"
#include "kernels/recipes.h"

namespace paramd::kernels {
namespace {

// What a benchmarked policy keeps and serves.
enum class Serve { kBf16, kFp16, kFp8Block };

struct BenchPolicy {
  const char* name;
  StatePolicy policy;
  Serve serve;
  const char* what;
};

StatePolicy AllNearest(StatePolicy p) {
  p.exp_avg_rounding = p.exp_avg_sq_rounding = Rounding::kNearest;
  return p;
}

const std::vector<BenchPolicy>& Policies() {
  static const std::vector<BenchPolicy> policies = {
      {"fp32", MakeStatePolicy(MasterType::kFp32, MomentType::kFp32, MomentType::kFp32),
       Serve::kBf16, "fp32 master+moments, serve bf16"},
      {"bf16rem", MakeStatePolicy(MasterType::kBf16Remainder, MomentType::kFp32, MomentType::kFp32),
       Serve::kBf16, "bf16+remainder master, fp32 moments, serve bf16"},
      {"fp16master", MakeStatePolicy(MasterType::kFp16, MomentType::kFp32, MomentType::kFp32),
       Serve::kFp16, "fp16 master, fp32 moments, serve fp16"},
      {"fp16moments", MakeStatePolicy(MasterType::kFp32, MomentType::kFp16, MomentType::kFp16),
       Serve::kBf16, "fp32 master, block fp16 moments, serve bf16"},
      {"bf16moments", MakeStatePolicy(MasterType::kFp32, MomentType::kBf16, MomentType::kBf16),
       Serve::kBf16, "fp32 master, bf16 moments, serve bf16"},
      {"fp8m_fp16v", MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp16),
       Serve::kFp8Block, "fp32 master, fp8 m, fp16 v, serve fp8_block"},
      {"fp8", MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp8),
       Serve::kFp8Block, "fp32 master, fp8 m+v (v stochastic), serve fp8_block"},
      {"fp8_nearest",
       AllNearest(MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp8)),
       Serve::kFp8Block, "as fp8, all nearest (no Philox)"},
      {"fp8_servebf16", MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp8),
       Serve::kBf16, "as fp8, serve bf16 in the pass (no recipe)"},
      {"fp8n_servebf16",
       AllNearest(MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp8)),
       Serve::kBf16, "as fp8_servebf16, all nearest (no Philox)"},
  };
  return policies;
}

struct Options {
  int threads = std::max(1u, std::thread::hardware_concurrency());
  int64_t n = int64_t{64} << 20;
  int reps = 7;
  int64_t grain = kDefaultGrain;
  CpuPath path = CpuPath::kAuto;
  std::vector<const BenchPolicy*> policies;
  bool json_only = false;
  bool out_of_place = false;
  // Destinations 16 bytes past a cache line, where a plain std::vector's large allocation starts.
  bool misaligned = false;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "%s\nusage: paramd_cpu_step_bench [--threads N] [--n ELEMENTS] [--reps R] "
               "[--grain G] [--path auto|scalar|avx2|avx512] [--policy NAME[,NAME...]|all] "
               "[--json] [--out-of-place] [--misaligned] [--list]\n",
               why);
  std::exit(2);
}

std::vector<const BenchPolicy*> ParsePolicies(const std::string& list) {
  std::vector<const BenchPolicy*> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, comma - start);
    bool found = false;
    for (const BenchPolicy& p : Policies()) {
      if (name == "all" || name == p.name) {
        out.push_back(&p);
        found = true;
      }
    }
    if (!found) Usage(("unknown policy " + name + " (--list shows them)").c_str());
    start = comma + 1;
  }
  return out;
}

Options ParseFlags(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value for " + flag).c_str());
      return argv[++i];
    };
    if (flag == "--threads") {
      o.threads = std::stoi(value());
    } else if (flag == "--n") {
      o.n = std::stoll(value());
    } else if (flag == "--reps") {
      o.reps = std::stoi(value());
    } else if (flag == "--grain") {
      o.grain = std::stoll(value());
    } else if (flag == "--path") {
      const std::string p = value();
      if (p == "auto")
        o.path = CpuPath::kAuto;
      else if (p == "scalar")
        o.path = CpuPath::kScalar;
      else if (p == "avx2")
        o.path = CpuPath::kAvx2;
      else if (p == "avx512")
        o.path = CpuPath::kAvx512;
      else
        Usage(("unknown path " + p).c_str());
    } else if (flag == "--policy") {
      o.policies = ParsePolicies(value());
    } else if (flag == "--json") {
      o.json_only = true;
    } else if (flag == "--out-of-place") {
      o.out_of_place = true;
    } else if (flag == "--misaligned") {
      o.misaligned = true;
    } else if (flag == "--list") {
      for (const BenchPolicy& p : Policies()) std::printf("%-14s %s\n", p.name, p.what);
      std::exit(0);
    } else {
      Usage(("unknown flag " + flag).c_str());
    }
  }
  if (o.threads < 1 || o.n < 1 || o.reps < 1 || o.grain < 1) Usage("values must be positive");
  // Chunk-scaled moments and 128-row panels: whole chunks per block, whole panels per tensor.
  o.grain = (o.grain + kChunkElements - 1) / kChunkElements * kChunkElements;
  o.n = (o.n + (int64_t{128} << 12) - 1) / (int64_t{128} << 12) * (int64_t{128} << 12);
  if (o.policies.empty()) o.policies = ParsePolicies("all");
  return o;
}

// A 2 MiB-aligned buffer, backed by huge pages where the kernel allows; freed at scope exit.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes) {
    constexpr size_t kAlign = size_t{2} << 20;
    bytes_ = std::max<size_t>((bytes + kAlign - 1) / kAlign * kAlign, kAlign);
    p_ = std::aligned_alloc(kAlign, bytes_);
    if (p_ == nullptr) Usage("out of memory");
    madvise(p_, bytes_, MADV_HUGEPAGE);
  }
  Buffer(Buffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~Buffer() { std::free(p_); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// One stream of the step's access pattern: bytes per element (scales: 4 per 128 elements, given
// as 4 / 128), and whether the step reads it, writes it, or both.
struct Stream {
  char* base;
  double bytes_per_element;
  bool read;
  bool write;
};

// The access pattern without arithmetic, per 128-element chunk: each stream's lines loaded and/or
// stored as the step does (stored values are the loaded ones, or for write-only streams a loaded
// vector, with a streaming store). Scale streams move one float per chunk.
template <bool kPrefetch>
__attribute__((target("avx512f"))) void PatternAvx512(const std::vector<Stream>& streams,
                                                      int64_t begin, int64_t end) {
  for (int64_t c = begin; c < end; c += kChunkElements) {
    __m512 last = _mm512_setzero_ps();
    for (const Stream& s : streams) {
      if (s.bytes_per_element < 1.0) {  // a scale per chunk
        float* p = reinterpret_cast<float*>(s.base) + c / kChunkElements;
        if (s.write) *p = s.read ? *p : 1.0f;
        continue;
      }
      const int64_t bytes = static_cast<int64_t>(s.bytes_per_element) * kChunkElements;
      char* p = s.base + static_cast<int64_t>(s.bytes_per_element) * c;
      if (kPrefetch && s.read && c + 512 < end) {
        for (int64_t b = 0; b < bytes; b += 64) {
          __builtin_prefetch(p + static_cast<int64_t>(s.bytes_per_element) * 512 + b, 0, 3);
        }
      }
      for (int64_t b = 0; b < bytes; b += 64) {
        if (s.read) last = _mm512_load_ps(reinterpret_cast<const float*>(p + b));
        if (s.write && s.read) _mm512_store_ps(reinterpret_cast<float*>(p + b), last);
        if (s.write && !s.read) _mm512_stream_ps(reinterpret_cast<float*>(p + b), last);
      }
    }
  }
  _mm_sfence();
}

template <bool kPrefetch>
__attribute__((target("avx2"))) void PatternAvx2(const std::vector<Stream>& streams, int64_t begin,
                                                 int64_t end) {
  for (int64_t c = begin; c < end; c += kChunkElements) {
    __m256 last = _mm256_setzero_ps();
    for (const Stream& s : streams) {
      if (s.bytes_per_element < 1.0) {
        float* p = reinterpret_cast<float*>(s.base) + c / kChunkElements;
        if (s.write) *p = s.read ? *p : 1.0f;
        continue;
      }
      const int64_t bytes = static_cast<int64_t>(s.bytes_per_element) * kChunkElements;
      char* p = s.base + static_cast<int64_t>(s.bytes_per_element) * c;
      if (kPrefetch && s.read && c + 512 < end) {
        for (int64_t b = 0; b < bytes; b += 64) {
          __builtin_prefetch(p + static_cast<int64_t>(s.bytes_per_element) * 512 + b, 0, 3);
        }
      }
      for (int64_t b = 0; b < bytes; b += 32) {
        if (s.read) last = _mm256_load_ps(reinterpret_cast<const float*>(p + b));
        if (s.write && s.read) _mm256_store_ps(reinterpret_cast<float*>(p + b), last);
        if (s.write && !s.read) _mm256_stream_ps(reinterpret_cast<float*>(p + b), last);
      }
    }
  }
  _mm_sfence();
}

template <typename Fn>
double Seconds(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Best(const std::vector<double>& t) { return *std::min_element(t.begin(), t.end()); }
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int64_t MomentBytes(MomentType t) {
  return t == MomentType::kFp32 ? 4 : t == MomentType::kFp8 ? 1 : 2;
}

// One policy's tensor: state, gradient, served output; its streams for the pattern loop.
struct PolicyBuffers {
  Buffer grad, master, remainder, m, v, m_scale, v_scale, out, out_scale;
  std::vector<Stream> streams;
  double bytes_per_element = 0.0;
  ServeArgs serve;  // fp8 serve formats

  void Add(const Buffer& b, double bytes, bool read, bool write) {
    streams.push_back({b.as<char>(), bytes, read, write});
    bytes_per_element += bytes * ((read ? 1 : 0) + (write ? 1 : 0));
  }
};

PolicyBuffers Allocate(const BenchPolicy& bp, int64_t n, int64_t cols) {
  const StatePolicy& p = bp.policy;
  PolicyBuffers b;
  const size_t un = static_cast<size_t>(n);
  const size_t chunks = static_cast<size_t>(NumChunks(n));
  b.grad = Buffer(un * 4);
  b.Add(b.grad, 4, true, false);
  b.master = Buffer(un * (p.master == MasterType::kFp32 ? 4 : 2));
  b.Add(b.master, p.master == MasterType::kFp32 ? 4 : 2, true, true);
  if (p.master == MasterType::kBf16Remainder) {
    b.remainder = Buffer(un * 2);
    b.Add(b.remainder, 2, true, true);
  }
  b.m = Buffer(un * static_cast<size_t>(MomentBytes(p.exp_avg)));
  b.Add(b.m, static_cast<double>(MomentBytes(p.exp_avg)), true, true);
  b.v = Buffer(un * static_cast<size_t>(MomentBytes(p.exp_avg_sq)));
  b.Add(b.v, static_cast<double>(MomentBytes(p.exp_avg_sq)), true, true);
  if (HasChunkScales(p.exp_avg)) {
    b.m_scale = Buffer(chunks * 4);
    b.Add(b.m_scale, 4.0 / kChunkElements, true, true);
  }
  if (HasChunkScales(p.exp_avg_sq)) {
    b.v_scale = Buffer(chunks * 4);
    b.Add(b.v_scale, 4.0 / kChunkElements, true, true);
  }
  if (bp.serve == Serve::kFp8Block) {
    const ServeBufferLayout layout =
        ServeLayout(Recipe::kFp8Block, Direction::kRowwise, n / cols, cols);
    b.out = Buffer(static_cast<size_t>(layout.data_bytes));
    b.out_scale = Buffer(static_cast<size_t>(layout.scale_bytes));
    b.Add(b.out, 1, false, true);
    b.bytes_per_element += static_cast<double>(layout.scale_bytes) / static_cast<double>(n);
    b.serve.rows = n / cols;
    b.serve.cols = cols;
    b.serve.recipe = Recipe::kFp8Block;
    b.serve.direction = Direction::kRowwise;
    b.serve.data = b.out.as<void>();
    b.serve.scales = b.out_scale.as<void>();
    b.serve.master = b.master.as<const float>();
  } else {
    b.out = Buffer(un * 2);
    b.Add(b.out, 2, false, true);
  }
  return b;
}

// Finite, step-like values, written on the threads that later use the memory (first touch).
void Fill(const BenchPolicy& bp, PolicyBuffers& b, ThreadPool& pool, int64_t n, int64_t grain) {
  const StatePolicy& p = bp.policy;
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    uint32_t x = static_cast<uint32_t>(begin) * 2654435761u + 1;
    for (int64_t i = begin; i < end; ++i) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      const float u = static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f;
      b.grad.as<float>()[i] = 2e-3f * u;
      switch (p.master) {
        case MasterType::kFp32:
          b.master.as<float>()[i] = 0.04f * u;
          break;
        case MasterType::kBf16Remainder: {
          const Bf16Split s = SplitBf16Remainder(0.04f * u);
          b.master.as<uint16_t>()[i] = s.served;
          b.remainder.as<int16_t>()[i] = s.remainder;
          break;
        }
        case MasterType::kFp16:
          b.master.as<uint16_t>()[i] = Fp16FromFloat(0.04f * u);
          break;
      }
      for (auto [type, buf, value] : {std::tuple{p.exp_avg, &b.m, 1e-4f * u},
                                      std::tuple{p.exp_avg_sq, &b.v, 1e-7f * (u + 0.5f)}}) {
        switch (type) {
          case MomentType::kFp32:
            buf->as<float>()[i] = value;
            break;
          case MomentType::kBf16:
            buf->as<uint16_t>()[i] = Bf16FromFloat(value);
            break;
          case MomentType::kFp16:
            buf->as<uint16_t>()[i] = Fp16FromFloat(value * 4096.0f);
            break;
          case MomentType::kFp8:
            buf->as<uint8_t>()[i] = E4m3FromFloat(value * 4096.0f);
            break;
        }
      }
      if (bp.serve == Serve::kFp8Block) {
        b.out.as<uint8_t>()[i] = 0;
      } else {
        b.out.as<uint16_t>()[i] = 0;
      }
      if (i % kChunkElements == 0) {
        const int64_t chunk = i / kChunkElements;
        if (HasChunkScales(p.exp_avg)) b.m_scale.as<float>()[chunk] = 1.0f / 4096.0f;
        if (HasChunkScales(p.exp_avg_sq)) b.v_scale.as<float>()[chunk] = 1.0f / 4096.0f;
      }
    }
  });
}

struct Result {
  double memcpy_gbs, pattern_gbs[2], ceiling_gbs, step_gelems, step_median_gelems, bytes;
  bool ok;
};

Result Measure(const Options& o, const BenchPolicy& bp, ThreadPool& pool, const Buffer& src,
               const Buffer& dst) {
  const int64_t n = o.n;
  constexpr int64_t kCols = 4096;  // fp8_block panels: 128 rows x 4096
  const CpuPath path = o.path == CpuPath::kAuto ? BestCpuPath() : o.path;
  PolicyBuffers b = Allocate(bp, n, kCols);
  Fill(bp, b, pool, n, o.grain);

  const void* slot = b.grad.as<void>();
  FusedStepArgs args;
  args.slots = &slot;
  args.num_slots = 1;
  args.slot_type = SlotType::kFp32;
  AdamwHyper hyper;
  hyper.weight_decay = 0.01;
  args.scalars = MakeAdamwScalars(hyper, 10);
  args.policy = bp.policy;
  args.rng = {1234, 10, 0};
  args.numel = n;
  args.master = b.master.as<void>();
  args.master_remainder = b.remainder.as<int16_t>();
  args.exp_avg = b.m.as<void>();
  args.exp_avg_scale_inv = b.m_scale.as<float>();
  args.exp_avg_sq = b.v.as<void>();
  args.exp_avg_sq_scale_inv = b.v_scale.as<float>();
  // Out of place: the state read from a second copy, the same bytes per element.
  PolicyBuffers source;
  if (o.out_of_place) {
    source = Allocate(bp, n, kCols);
    Fill(bp, source, pool, n, o.grain);
    args.master_in = source.master.as<void>();
    args.master_remainder_in = source.remainder.as<int16_t>();
    args.exp_avg_in = source.m.as<void>();
    args.exp_avg_scale_inv_in = source.m_scale.as<float>();
    args.exp_avg_sq_in = source.v.as<void>();
    args.exp_avg_sq_scale_inv_in = source.v_scale.as<float>();
  }
  if (bp.serve == Serve::kBf16) args.out_bf16 = b.out.as<uint16_t>();
  if (bp.serve == Serve::kFp16) args.out_fp16 = b.out.as<uint16_t>();

  // The step as the daemon's cpu backend runs it, through the same entry point: panels of 128 rows
  // over the pool, fp8_block cut from each panel while it is in cache.
  CpuTensorStepArgs tensor;
  tensor.rows = n / kCols;
  if (o.misaligned) {
    // The master and FP32 moments written 16 bytes into their buffers (one panel fewer): every
    // vector access spans two cache lines, and out of place the FP32 moments cannot be streamed.
    tensor.rows -= 128;
    args.numel = tensor.rows * kCols;
    args.master = static_cast<char*>(args.master) + 16;
    b.serve.rows = tensor.rows;  // fp8_block is cut from the FP32 master where it now lies
    b.serve.master = static_cast<const float*>(args.master);
    if (bp.policy.exp_avg == MomentType::kFp32) {
      args.exp_avg = static_cast<char*>(args.exp_avg) + 16;
    }
    if (bp.policy.exp_avg_sq == MomentType::kFp32) {
      args.exp_avg_sq = static_cast<char*>(args.exp_avg_sq) + 16;
    }
  }
  tensor.step = args;
  tensor.cols = kCols;
  if (bp.serve == Serve::kFp8Block) tensor.cut = std::span<const ServeArgs>(&b.serve, 1);
  tensor.path = path;
  bool ok = true;
  auto step = [&] {
    CpuTensorStepResult result;
    if (!CpuTensorStep(tensor, pool, &result).ok()) ok = false;
  };
  const bool avx512 = CpuPathSupported(CpuPath::kAvx512);
  auto pattern = [&]<bool kPrefetch>() {
    pool.ParallelFor(n, o.grain, [&](int64_t begin, int64_t end) {
      if (avx512) {
        PatternAvx512<kPrefetch>(b.streams, begin, end);
      } else {
        PatternAvx2<kPrefetch>(b.streams, begin, end);
      }
    });
  };
  const int64_t copy_bytes = static_cast<int64_t>(src.bytes());
  const int64_t copy_block = (copy_bytes + o.threads - 1) / o.threads;

  std::vector<double> t_memcpy, t_pattern[2], t_step;
  // Interleaved repetitions: every loop sees the same machine state; the best of each is kept.
  for (int rep = 0; rep < o.reps + 1; ++rep) {
    const double tc = Seconds([&] {
      pool.ParallelFor(copy_bytes, copy_block, [&](int64_t lo, int64_t hi) {
        std::memcpy(dst.as<char>() + lo, src.as<char>() + lo, static_cast<size_t>(hi - lo));
      });
    });
    const double tp0 = Seconds([&] { pattern.operator()<false>(); });
    const double tp1 = Seconds([&] { pattern.operator()<true>(); });
    const double ts = Seconds(step);
    if (rep == 0) continue;  // warm-up: page faults, huge-page promotion, frequency
    t_memcpy.push_back(tc);
    t_pattern[0].push_back(tp0);
    t_pattern[1].push_back(tp1);
    t_step.push_back(ts);
  }
  Result r;
  r.ok = ok;
  r.bytes = b.bytes_per_element;
  r.memcpy_gbs = 2.0 * static_cast<double>(copy_bytes) / Best(t_memcpy) / 1e9;
  for (int k = 0; k < 2; ++k) r.pattern_gbs[k] = r.bytes * n / Best(t_pattern[k]) / 1e9;
  r.ceiling_gbs = std::max({r.memcpy_gbs, r.pattern_gbs[0], r.pattern_gbs[1]});
  const double stepped = static_cast<double>(tensor.rows * kCols);  // less one panel, misaligned
  r.step_gelems = stepped / Best(t_step) / 1e9;
  r.step_median_gelems = stepped / Median(t_step) / 1e9;
  return r;
}

int Main(int argc, char** argv) {
  const Options o = ParseFlags(argc, argv);
  const CpuPath path = o.path == CpuPath::kAuto ? BestCpuPath() : o.path;
  if (!CpuPathSupported(path)) Usage("this CPU cannot run the requested path");
  ThreadPool pool(o.threads);
  // memcpy moves 8 B per element each way: buffers about as large as the steps' own.
  const Buffer src(static_cast<size_t>(o.n) * 8), dst(static_cast<size_t>(o.n) * 8);
  const int64_t copy_bytes = static_cast<int64_t>(src.bytes());
  pool.ParallelFor(copy_bytes, (copy_bytes + o.threads - 1) / o.threads,
                   [&](int64_t lo, int64_t hi) {
                     std::memset(src.as<char>() + lo, 1, static_cast<size_t>(hi - lo));
                     std::memset(dst.as<char>() + lo, 0, static_cast<size_t>(hi - lo));
                   });

  if (!o.json_only) {
    std::printf(
        "paramd CPU fused step, 1 fp32 gradient slot: n=%lld elements, threads=%d, "
        "path=%s, grain=%lld, best of %d%s\n",
        static_cast<long long>(o.n), o.threads, CpuPathName(path), static_cast<long long>(o.grain),
        o.reps, o.out_of_place ? ", out of place" : "");
    std::printf("%-14s %6s %8s %8s %8s %8s %9s %8s  %s\n", "policy", "B/elem", "Gelem/s", "median",
                "GB/s", "ceil GB/s", "/ceiling", "memcpy", "what");
  }
  int status = 0;
  for (const BenchPolicy* bp : o.policies) {
    const Result r = Measure(o, *bp, pool, src, dst);
    if (!r.ok) {
      std::fprintf(stderr, "%s: the step failed\n", bp->name);
      status = 1;
      continue;
    }
    const double step_gbs = r.bytes * r.step_gelems;
    if (!o.json_only) {
      std::printf("%-14s %6.1f %8.3f %8.3f %8.1f %8.1f %9.2f %8.1f  %s\n", bp->name, r.bytes,
                  r.step_gelems, r.step_median_gelems, step_gbs, r.ceiling_gbs,
                  step_gbs / r.ceiling_gbs, r.memcpy_gbs, bp->what);
    }
    if (!o.json_only) continue;
    std::printf(
        "{\"bench\":\"paramd_cpu_step\",\"policy\":\"%s\",\"n\":%lld,\"threads\":%d,"
        "\"path\":\"%s\",\"bytes_per_element\":%.3f,\"memcpy_gbs\":%.2f,\"pattern_gbs\":%.2f,"
        "\"pattern_prefetch_gbs\":%.2f,\"ceiling_gbs\":%.2f,\"step_gbs\":%.2f,"
        "\"step_elems_per_s\":%.4e,\"step_median_elems_per_s\":%.4e,\"ratio_to_ceiling\":%.3f}\n",
        bp->name, static_cast<long long>(o.n), o.threads, CpuPathName(path), r.bytes, r.memcpy_gbs,
        r.pattern_gbs[0], r.pattern_gbs[1], r.ceiling_gbs, step_gbs, r.step_gelems * 1e9,
        r.step_median_gelems * 1e9, step_gbs / r.ceiling_gbs);
    std::fflush(stdout);
  }
  return status;
}

}  // namespace
}  // namespace paramd::kernels

int main(int argc, char** argv) { return paramd::kernels::Main(argc, argv); }
