// The step rules on the CPU (kernels/step_rules.h): a scalar path and AVX2 / AVX-512 paths for
// whole 128-element chunks, chosen at run time like the fused step's. The vector paths add the same
// pairs of the same FP64 values in the same order as the scalar tree, so every path gives the same
// bits; partial chunks always take the scalar path.

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

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "kernels/step_rules.h"

#define PARAMD_AVX2 __attribute__((target("avx2,fma")))
#define PARAMD_AVX512 __attribute__((target("avx512f,avx2,fma")))

namespace paramd::kernels {
namespace {

constexpr int kChunk = 128;

float ScaledGrad(const GradSlots& g, int64_t i) {
  float g0;
  if (g.slot_type == SlotType::kFp32) {
    g0 = static_cast<const float*>(g.slots[0])[i];
    for (int r = 1; r < g.num_slots; ++r) g0 = g0 + static_cast<const float*>(g.slots[r])[i];
  } else {
    g0 = FloatFromBf16(static_cast<const uint16_t*>(g.slots[0])[i]);
    for (int r = 1; r < g.num_slots; ++r) {
      g0 = g0 + FloatFromBf16(static_cast<const uint16_t*>(g.slots[r])[i]);
    }
  }
  return g0 * g.grad_scale;
}

bool SquareIsFinite(float gs) {
  const float square = gs * gs;
  return (std::bit_cast<uint32_t>(square) & 0x7F800000u) != 0x7F800000u;
}

// The tree over s[0, 2^k) in place, from stride `from` down to 1.
double TreeTail(double* s, int from) {
  for (int stride = from; stride >= 1; stride /= 2) {
    for (int i = 0; i < stride; ++i) s[i] += s[i + stride];
  }
  return s[0];
}

double ChunkSumScalar(const GradSlots& g, int64_t c, int count, bool* finite) {
  alignas(64) double s[kChunk];
  for (int j = 0; j < count; ++j) {
    const float gs = ScaledGrad(g, c + j);
    if (!SquareIsFinite(gs)) *finite = false;
    s[j] = static_cast<double>(gs) * static_cast<double>(gs);
  }
  std::fill(s + count, s + kChunk, 0.0);
  return TreeTail(s, kChunk / 2);
}

bool RangeFiniteScalar(const GradSlots& g, int64_t begin, int64_t end) {
  bool finite = true;
  for (int64_t i = begin; i < end; ++i) finite &= SquareIsFinite(ScaledGrad(g, i));
  return finite;
}

// ---- AVX2 ----

PARAMD_AVX2 inline __m256 LoadBf16x8(const void* slot, int64_t i) {
  const __m128i h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(slot) + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

PARAMD_AVX2 inline __m256 ScaledGrad8(const GradSlots& g, int64_t i) {
  __m256 g0;
  if (g.slot_type == SlotType::kFp32) {
    g0 = _mm256_loadu_ps(static_cast<const float*>(g.slots[0]) + i);
    for (int r = 1; r < g.num_slots; ++r) {
      g0 = _mm256_add_ps(g0, _mm256_loadu_ps(static_cast<const float*>(g.slots[r]) + i));
    }
  } else {
    g0 = LoadBf16x8(g.slots[0], i);
    for (int r = 1; r < g.num_slots; ++r) g0 = _mm256_add_ps(g0, LoadBf16x8(g.slots[r], i));
  }
  return _mm256_mul_ps(g0, _mm256_set1_ps(g.grad_scale));
}

// All-ones lanes where gs * gs is infinite or NaN.
PARAMD_AVX2 inline __m256i NonFinite8(__m256 gs) {
  const __m256i exp = _mm256_set1_epi32(0x7F800000);
  const __m256i sq = _mm256_castps_si256(_mm256_mul_ps(gs, gs));
  return _mm256_cmpeq_epi32(_mm256_and_si256(sq, exp), exp);
}

PARAMD_AVX2 double ChunkSumAvx2(const GradSlots& g, int64_t c, bool* finite) {
  alignas(64) double s[kChunk];
  __m256i bad = _mm256_setzero_si256();
  for (int j = 0; j < kChunk; j += 8) {
    const __m256 gs = ScaledGrad8(g, c + j);
    bad = _mm256_or_si256(bad, NonFinite8(gs));
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(gs));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(gs, 1));
    _mm256_store_pd(s + j, _mm256_mul_pd(lo, lo));
    _mm256_store_pd(s + j + 4, _mm256_mul_pd(hi, hi));
  }
  if (!_mm256_testz_si256(bad, bad)) *finite = false;
  for (int stride = kChunk / 2; stride >= 4; stride /= 2) {
    for (int i = 0; i < stride; i += 4) {
      _mm256_store_pd(s + i, _mm256_add_pd(_mm256_load_pd(s + i), _mm256_load_pd(s + i + stride)));
    }
  }
  return TreeTail(s, 2);
}

PARAMD_AVX2 bool RangeFiniteAvx2(const GradSlots& g, int64_t begin, int64_t end) {
  __m256i bad = _mm256_setzero_si256();
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) bad = _mm256_or_si256(bad, NonFinite8(ScaledGrad8(g, i)));
  return _mm256_testz_si256(bad, bad) && RangeFiniteScalar(g, i, end);
}

// ---- AVX-512 ----

PARAMD_AVX512 inline __m512 LoadBf16x16(const void* slot, int64_t i) {
  const __m256i h =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(slot) + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

PARAMD_AVX512 inline __m512 ScaledGrad16(const GradSlots& g, int64_t i) {
  __m512 g0;
  if (g.slot_type == SlotType::kFp32) {
    g0 = _mm512_loadu_ps(static_cast<const float*>(g.slots[0]) + i);
    for (int r = 1; r < g.num_slots; ++r) {
      g0 = _mm512_add_ps(g0, _mm512_loadu_ps(static_cast<const float*>(g.slots[r]) + i));
    }
  } else {
    g0 = LoadBf16x16(g.slots[0], i);
    for (int r = 1; r < g.num_slots; ++r) g0 = _mm512_add_ps(g0, LoadBf16x16(g.slots[r], i));
  }
  return _mm512_mul_ps(g0, _mm512_set1_ps(g.grad_scale));
}

PARAMD_AVX512 inline __mmask16 NonFinite16(__m512 gs) {
  const __m512i exp = _mm512_set1_epi32(0x7F800000);
  const __m512i sq = _mm512_castps_si512(_mm512_mul_ps(gs, gs));
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(sq, exp), exp);
}

PARAMD_AVX512 double ChunkSumAvx512(const GradSlots& g, int64_t c, bool* finite) {
  // s[8j .. 8j + 7] in a[j]: strides 64, 32, 16 and 8 are whole registers.
  __m512d a[kChunk / 8];
  __mmask16 bad = 0;
  for (int j = 0; j < kChunk / 16; ++j) {
    const __m512 gs = ScaledGrad16(g, c + 16 * j);
    bad |= NonFinite16(gs);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(gs));
    const __m512d hi =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(gs), 1)));
    a[2 * j] = _mm512_mul_pd(lo, lo);
    a[2 * j + 1] = _mm512_mul_pd(hi, hi);
  }
  if (bad != 0) *finite = false;
  for (int vectors = kChunk / 16; vectors >= 1; vectors /= 2) {
    for (int j = 0; j < vectors; ++j) a[j] = _mm512_add_pd(a[j], a[j + vectors]);
  }
  alignas(64) double s[8];
  _mm512_store_pd(s, a[0]);
  return TreeTail(s, 4);
}

PARAMD_AVX512 bool RangeFiniteAvx512(const GradSlots& g, int64_t begin, int64_t end) {
  __mmask16 bad = 0;
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) bad |= NonFinite16(ScaledGrad16(g, i));
  return bad == 0 && RangeFiniteScalar(g, i, end);
}

// ---- dispatch ----

KStatus Invalid(const std::string& what) {
  return KStatus(Code::kInvalidArgument, "step rules: " + what);
}

KStatus Prepare(const GradSlots& g, int64_t begin, int64_t end, const bool* all_finite,
                CpuPath* path) {
  if (begin < 0 || end < begin) {
    return Invalid("bad element range [" + std::to_string(begin) + ", " + std::to_string(end) +
                   ")");
  }
  if (g.num_slots < 1 || g.slots == nullptr) return Invalid("needs at least one gradient slot");
  for (int r = 0; r < g.num_slots; ++r) {
    if (g.slots[r] == nullptr) return Invalid("slot " + std::to_string(r) + " is null");
  }
  if (g.slot_type != SlotType::kFp32 && g.slot_type != SlotType::kBf16) {
    return Invalid("unknown slot type");
  }
  if (all_finite == nullptr) return Invalid("all_finite is required");
  if (*path == CpuPath::kAuto) *path = BestCpuPath();
  if (!CpuPathSupported(*path)) {
    return KStatus(Code::kUnimplemented, std::string("step rules: this CPU cannot run the ") +
                                             CpuPathName(*path) + " path");
  }
  return KStatus::Ok();
}

}  // namespace

KStatus GradFiniteCpu(const GradSlots& grad, int64_t begin, int64_t end, bool* all_finite,
                      CpuPath path) {
  if (KStatus st = Prepare(grad, begin, end, all_finite, &path); !st.ok()) return st;
  bool finite;
  switch (path) {
    case CpuPath::kAvx512:
      finite = RangeFiniteAvx512(grad, begin, end);
      break;
    case CpuPath::kAvx2:
      finite = RangeFiniteAvx2(grad, begin, end);
      break;
    default:
      finite = RangeFiniteScalar(grad, begin, end);
      break;
  }
  if (!finite) *all_finite = false;
  return KStatus::Ok();
}

KStatus GradChunkSumsCpu(const GradSlots& grad, int64_t begin, int64_t end, double* chunk_sums,
                         bool* all_finite, CpuPath path) {
  if (KStatus st = Prepare(grad, begin, end, all_finite, &path); !st.ok()) return st;
  if (begin % kChunk != 0) return Invalid("chunk sums must start at a multiple of 128");
  if (chunk_sums == nullptr && end > begin) return Invalid("chunk_sums is required");
  bool finite = true;
  for (int64_t c = begin, j = 0; c < end; c += kChunk, ++j) {
    const int count = static_cast<int>(std::min<int64_t>(kChunk, end - c));
    if (count < kChunk || path == CpuPath::kScalar) {
      chunk_sums[j] = ChunkSumScalar(grad, c, count, &finite);
    } else if (path == CpuPath::kAvx512) {
      chunk_sums[j] = ChunkSumAvx512(grad, c, &finite);
    } else {
      chunk_sums[j] = ChunkSumAvx2(grad, c, &finite);
    }
  }
  if (!finite) *all_finite = false;
  return KStatus::Ok();
}

KStatus GradBlockSumsCpu(const GradSlots& grad, int64_t rows, int64_t cols, int64_t block_begin,
                         int64_t block_end, double* block_sums, bool* all_finite, CpuPath path) {
  if (rows < 0 || cols < 0 || block_begin < 0 || block_end < block_begin ||
      block_end > NumNormBlocks(rows)) {
    return Invalid("bad blocks [" + std::to_string(block_begin) + ", " + std::to_string(block_end) +
                   ") of a [" + std::to_string(rows) + ", " + std::to_string(cols) + "] tensor");
  }
  if (block_sums == nullptr && block_end > block_begin) return Invalid("block_sums is required");
  std::vector<double> chunk_sums;
  for (int64_t b = block_begin; b < block_end; ++b) {
    const int64_t begin = b * kNormBlockRows * cols;
    const int64_t end = std::min(rows, (b + 1) * kNormBlockRows) * cols;
    chunk_sums.resize(static_cast<size_t>((end - begin + kChunk - 1) / kChunk));
    if (KStatus st = GradChunkSumsCpu(grad, begin, end, chunk_sums.data(), all_finite, path);
        !st.ok()) {
      return st;
    }
    block_sums[b - block_begin] =
        PairwiseSum(chunk_sums.data(), static_cast<int64_t>(chunk_sums.size()));
  }
  return KStatus::Ok();
}

double PairwiseSum(const double* values, int64_t n) {
  if (n <= 0) return 0.0;
  int64_t padded = 1;
  while (padded < n) padded *= 2;
  std::vector<double> s(static_cast<size_t>(padded), 0.0);
  std::copy(values, values + n, s.begin());
  for (int64_t stride = padded / 2; stride >= 1; stride /= 2) {
    for (int64_t i = 0; i < stride; ++i) s[i] += s[i + stride];
  }
  return s[0];
}

double SumInOrder(const double* values, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += values[i];
  return total;
}

float ClipFactor(double total_sum_of_squares, double max_norm) {
  const double clip = max_norm / (std::sqrt(total_sum_of_squares) + 1e-6);
  return static_cast<float>(std::min(1.0, clip));
}

}  // namespace paramd::kernels
