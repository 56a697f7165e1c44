// paramd_cpu_step_bench: the CPU fused step (fp32 policy, one fp32 gradient slot, serving bf16)
// against this machine's own memory ceiling, measured in the same run (DESIGN.md §10).
//
// Ceiling = the fastest of (a) multithreaded memcpy, counted read + write, and (b) a vectorized
// loop with the step's own access pattern and no arithmetic: read grad 4 B, read + write p, m, v 24
// B, write bf16 2 B = 30 B per element; once plainly, once with a streaming (non-temporal) store
// for the write-only bf16 output, and once also with the step's software prefetch of its inputs
// (what the step itself does). The step is reported in elements/s and in bytes/s at the same 30 B
// per element, and as a ratio to the ceiling. The last line is JSON for scripts.
//
//   paramd_cpu_step_bench [--threads N] [--n ELEMENTS] [--reps R] [--grain G]
//                         [--path auto|scalar|avx2|avx512] [--json]

// GCC 12 reports its own _mm512_undefined_*() placeholders as maybe-uninitialized (a known false
// positive of the AVX-512 intrinsic headers), so that warning is off for them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
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
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/fused_step.h"

namespace paramd::kernels {
namespace {

constexpr double kStepBytesPerElement = 30.0;

struct Options {
  int threads = std::max(1u, std::thread::hardware_concurrency());
  int64_t n = int64_t{64} << 20;
  int reps = 7;
  int64_t grain = kDefaultGrain;
  CpuPath path = CpuPath::kAuto;
  bool json_only = false;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "%s\nusage: paramd_cpu_step_bench [--threads N] [--n ELEMENTS] [--reps R] "
               "[--grain G] [--path auto|scalar|avx2|avx512] [--json]\n",
               why);
  std::exit(2);
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
    } else if (flag == "--json") {
      o.json_only = true;
    } else {
      Usage(("unknown flag " + flag).c_str());
    }
  }
  if (o.threads < 1 || o.n < 1 || o.reps < 1 || o.grain < 1) Usage("values must be positive");
  return o;
}

// A 2 MiB-aligned buffer, backed by huge pages where the kernel allows (same for every loop here).
template <typename T>
T* AllocateLarge(int64_t count) {
  constexpr size_t kAlign = size_t{2} << 20;
  const size_t bytes = (static_cast<size_t>(count) * sizeof(T) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, bytes);
  if (p == nullptr) Usage("out of memory");
  madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<T*>(p);
}

// The step's access pattern without its arithmetic: every stream is read and written exactly as
// the fused step does (the values rotate between p, m and v so no store is redundant). Whole
// vectors only: the few elements past the last multiple of 16 (or 8) are not moved.
// Pattern loop variants: a plain loop, a streaming store of the bf16 output, and streaming plus the
// step's prefetch distance.
enum class Pattern { kPlain, kStream, kStreamPrefetch };
constexpr int64_t kPrefetchAhead = 512;  // as kernels/cpu/fused_step_paths.h

inline void Prefetch(const float* g, const float* p, const float* m, const float* v, int64_t i) {
  __builtin_prefetch(g + i, 0, 3);
  __builtin_prefetch(p + i, 0, 3);
  __builtin_prefetch(m + i, 0, 3);
  __builtin_prefetch(v + i, 0, 3);
}

// Streaming needs out + begin 32-byte aligned (buffers are 2 MiB aligned, blocks multiples of 16).
template <Pattern kPattern>
__attribute__((target("avx512f"))) void PatternAvx512(const float* g, float* p, float* m, float* v,
                                                      uint16_t* out, int64_t begin, int64_t end) {
  constexpr bool kStream = kPattern != Pattern::kPlain;
  for (int64_t i = begin; i + 16 <= end; i += 16) {
    if (kPattern == Pattern::kStreamPrefetch && i + kPrefetchAhead < end) {
      Prefetch(g, p, m, v, i + kPrefetchAhead);
    }
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 pv = _mm512_loadu_ps(p + i);
    const __m512 mv = _mm512_loadu_ps(m + i);
    const __m512 vv = _mm512_loadu_ps(v + i);
    _mm512_storeu_ps(p + i, mv);
    _mm512_storeu_ps(m + i, vv);
    _mm512_storeu_ps(v + i, pv);
    const __m256i codes = _mm512_cvtepi32_epi16(_mm512_castps_si512(gv));
    if constexpr (kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), codes);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), codes);
    }
  }
  if constexpr (kStream) _mm_sfence();
}

template <Pattern kPattern>
__attribute__((target("avx2"))) void PatternAvx2(const float* g, float* p, float* m, float* v,
                                                 uint16_t* out, int64_t begin, int64_t end) {
  constexpr bool kStream = kPattern != Pattern::kPlain;
  for (int64_t i = begin; i + 8 <= end; i += 8) {
    if (kPattern == Pattern::kStreamPrefetch && i + kPrefetchAhead < end) {
      Prefetch(g, p, m, v, i + kPrefetchAhead);
    }
    const __m256i gv = _mm256_castps_si256(_mm256_loadu_ps(g + i));
    const __m256 pv = _mm256_loadu_ps(p + i);
    const __m256 mv = _mm256_loadu_ps(m + i);
    const __m256 vv = _mm256_loadu_ps(v + i);
    _mm256_storeu_ps(p + i, mv);
    _mm256_storeu_ps(m + i, vv);
    _mm256_storeu_ps(v + i, pv);
    const __m256i low = _mm256_srli_epi32(_mm256_slli_epi32(gv, 16), 16);
    const __m128i codes =
        _mm_packus_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1));
    if constexpr (kStream) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), codes);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), codes);
    }
  }
  if constexpr (kStream) _mm_sfence();
}

template <typename Fn>
double Seconds(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  const Options o = ParseFlags(argc, argv);
  const int64_t n = o.n;
  const CpuPath path = o.path == CpuPath::kAuto ? BestCpuPath() : o.path;
  if (!CpuPathSupported(path)) Usage("this CPU cannot run the requested path");
  ThreadPool pool(o.threads);

  float* grad = AllocateLarge<float>(n);
  float* p = AllocateLarge<float>(n);
  float* m = AllocateLarge<float>(n);
  float* v = AllocateLarge<float>(n);
  uint16_t* out = AllocateLarge<uint16_t>(n);
  // memcpy moves 8 B per element each way, so its buffers are as large as the step's own.
  const int64_t copy_bytes = n * 8;
  char* src = AllocateLarge<char>(copy_bytes);
  char* dst = AllocateLarge<char>(copy_bytes);

  // First touch on the threads that later use the memory, with finite, step-like values.
  pool.ParallelFor(n, o.grain, [&](int64_t b, int64_t e) {
    uint32_t x = static_cast<uint32_t>(b) * 2654435761u + 1;
    for (int64_t i = b; i < e; ++i) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      const float u = static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f;
      grad[i] = 2e-3f * u;
      p[i] = 0.04f * u;
      m[i] = 1e-4f * u;
      v[i] = 1e-7f * (u + 0.5f);
      out[i] = 0;
    }
  });
  const int64_t copy_block = (copy_bytes + o.threads - 1) / o.threads;
  pool.ParallelFor(copy_bytes, copy_block, [&](int64_t b, int64_t e) {
    std::memset(src + b, 1, e - b);
    std::memset(dst + b, 0, e - b);
  });

  const void* slot = grad;
  FusedStepArgs args;
  args.slots = &slot;
  args.num_slots = 1;
  args.slot_type = SlotType::kFp32;
  args.grad_scale = 1.0f;
  AdamwHyper hyper;
  hyper.weight_decay = 0.01;
  args.scalars = MakeAdamwScalars(hyper, 10);
  args.master = p;
  args.exp_avg = m;
  args.exp_avg_sq = v;
  args.out_bf16 = out;

  const bool avx512 = CpuPathSupported(CpuPath::kAvx512);
  std::vector<double> t_memcpy, t_step;
  std::vector<double> t_pattern[3];
  auto run_pattern = [&]<Pattern kPattern>() {
    pool.ParallelFor(n, o.grain, [&](int64_t b, int64_t e) {
      if (avx512) {
        PatternAvx512<kPattern>(grad, p, m, v, out, b, e);
      } else {
        PatternAvx2<kPattern>(grad, p, m, v, out, b, e);
      }
    });
  };
  bool step_ok = true;
  // Interleaved repetitions: every loop sees the same machine state; the best of each is kept.
  for (int rep = 0; rep < o.reps + 1; ++rep) {
    const double tc = Seconds([&] {
      pool.ParallelFor(copy_bytes, copy_block,
                       [&](int64_t b, int64_t e) { std::memcpy(dst + b, src + b, e - b); });
    });
    // Each pattern loop rotates p <- m <- v <- p; three of them restore every array, so the step
    // always continues from its own previous state (finite moments, no subnormals).
    const double tp0 = Seconds([&] { run_pattern.operator()<Pattern::kPlain>(); });
    const double tp1 = Seconds([&] { run_pattern.operator()<Pattern::kStream>(); });
    const double tp2 = Seconds([&] { run_pattern.operator()<Pattern::kStreamPrefetch>(); });
    const double ts = Seconds([&] {
      pool.ParallelFor(n, o.grain, [&](int64_t b, int64_t e) {
        if (!FusedStepCpu(args, b, e, path).ok()) step_ok = false;
      });
    });
    if (rep == 0) continue;  // warm-up: page faults, huge-page promotion, frequency
    t_memcpy.push_back(tc);
    t_pattern[0].push_back(tp0);
    t_pattern[1].push_back(tp1);
    t_pattern[2].push_back(tp2);
    t_step.push_back(ts);
  }
  if (!step_ok) {
    std::fprintf(stderr, "FusedStepCpu failed\n");
    return 1;
  }

  auto best = [](const std::vector<double>& t) { return *std::min_element(t.begin(), t.end()); };
  const double memcpy_gbs = 2.0 * copy_bytes / best(t_memcpy) / 1e9;
  double pattern_gbs[3];
  for (int k = 0; k < 3; ++k) pattern_gbs[k] = kStepBytesPerElement * n / best(t_pattern[k]) / 1e9;
  const double ceiling_gbs = std::max({memcpy_gbs, pattern_gbs[0], pattern_gbs[1], pattern_gbs[2]});
  const double step_gelems = n / best(t_step) / 1e9;
  const double step_gbs = kStepBytesPerElement * step_gelems;
  const double step_median_gelems = n / Median(t_step) / 1e9;
  const double ratio = step_gbs / ceiling_gbs;

  if (!o.json_only) {
    std::printf("paramd CPU fused step: fp32 policy, 1 fp32 slot, serve bf16 (30 B/element)\n");
    std::printf("n=%lld elements, threads=%d, path=%s, grain=%lld, best of %d\n",
                static_cast<long long>(n), o.threads, CpuPathName(path),
                static_cast<long long>(o.grain), o.reps);
    std::printf("%-40s %8s %10s %9s\n", "loop", "GB/s", "G elem/s", "/ceiling");
    std::printf("%-40s %8.1f %10s %9.2f\n", "memcpy (read+write)", memcpy_gbs, "-",
                memcpy_gbs / ceiling_gbs);
    const char* names[3] = {"step pattern, no arithmetic", "  + streaming bf16 store",
                            "  + streaming store + prefetch"};
    for (int k = 0; k < 3; ++k) {
      std::printf("%-40s %8.1f %10.3f %9.2f\n", names[k], pattern_gbs[k],
                  pattern_gbs[k] / kStepBytesPerElement, pattern_gbs[k] / ceiling_gbs);
    }
    std::printf("%-40s %8.1f %10.3f %9.2f\n", "fused step (best)", step_gbs, step_gelems, ratio);
    std::printf("%-40s %8.1f %10.3f %9.2f\n", "fused step (median)",
                kStepBytesPerElement * step_median_gelems, step_median_gelems,
                kStepBytesPerElement * step_median_gelems / ceiling_gbs);
  }
  std::printf(
      "{\"bench\":\"paramd_cpu_step\",\"n\":%lld,\"threads\":%d,\"path\":\"%s\","
      "\"memcpy_gbs\":%.2f,\"pattern_gbs\":%.2f,\"pattern_stream_gbs\":%.2f,"
      "\"pattern_stream_prefetch_gbs\":%.2f,\"ceiling_gbs\":%.2f,\"step_gbs\":%.2f,"
      "\"step_elems_per_s\":%.4e,\"step_median_elems_per_s\":%.4e,\"ratio_to_ceiling\":%.3f}\n",
      static_cast<long long>(n), o.threads, CpuPathName(path), memcpy_gbs, pattern_gbs[0],
      pattern_gbs[1], pattern_gbs[2], ceiling_gbs, step_gbs, step_gelems * 1e9,
      step_median_gelems * 1e9, ratio);
  return 0;
}

}  // namespace
}  // namespace paramd::kernels

int main(int argc, char** argv) { return paramd::kernels::Main(argc, argv); }
