// The fused optimizer step: rank slots -> gradient -> AdamW -> new master and moments -> served
// formats, in one pass over memory (DESIGN.md §2-§3), for every state policy. One header for every
// backend; `cpu/` implements it here, `cuda/` on the GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/formats.h"
#include "kernels/status.h"

namespace paramd::kernels {

enum class SlotType { kFp32, kBf16 };

// State policy (DESIGN.md §1, §3): the dtypes the daemon keeps for one tensor.
enum class MasterType {
  kFp32,           // float[numel]
  kBf16Remainder,  // uint16_t served-BF16 halves[numel] + int16_t remainders[numel]
  kFp16,           // uint16_t FP16 codes[numel], an unscaled nearest-even cast of each update
};
enum class MomentType {
  kFp32,  // float[numel]
  kBf16,  // uint16_t BF16 codes[numel], unscaled
  kFp16,  // uint16_t FP16 codes[numel] + one scale per 128-element chunk, s = pow2(amax, 32768)
  kFp8,   // uint8_t E4M3 codes[numel] + one scale per 128-element chunk, s = pow2(amax, 448)
};
enum class Rounding { kNearest, kStochastic };

struct StatePolicy {
  MasterType master = MasterType::kFp32;
  MomentType exp_avg = MomentType::kFp32;
  MomentType exp_avg_sq = MomentType::kFp32;
  Rounding exp_avg_rounding = Rounding::kNearest;     // must be kNearest for kFp32
  Rounding exp_avg_sq_rounding = Rounding::kNearest;  // must be kNearest for kFp32

  bool operator==(const StatePolicy&) const = default;
};

// The policy with DESIGN.md §3's default rounding: stochastic for an fp8 exp_avg_sq (nearest
// stalls it: its 0.1 % updates are below FP8's resolution), nearest elsewhere.
constexpr StatePolicy MakeStatePolicy(MasterType master, MomentType exp_avg,
                                      MomentType exp_avg_sq) {
  return {master, exp_avg, exp_avg_sq, Rounding::kNearest,
          exp_avg_sq == MomentType::kFp8 ? Rounding::kStochastic : Rounding::kNearest};
}

// Scaled moments keep one scale per chunk of this many elements of the flattened tensor.
inline constexpr int64_t kChunkElements = 128;
constexpr bool HasChunkScales(MomentType t) {
  return t == MomentType::kFp16 || t == MomentType::kFp8;
}
constexpr int64_t NumChunks(int64_t numel) { return (numel + kChunkElements - 1) / kChunkElements; }

// AdamW hyper-parameters as the job holds them (doubles).
struct AdamwHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Per-step scalars, computed once on the host in double and rounded once to FP32 (DESIGN.md §3).
struct AdamwScalars {
  float beta1;
  float beta2;
  float c1;  // 1 - beta1
  float c2;  // 1 - beta2
  float eps;
  float decay;      // 1 - lr * weight_decay
  float step_size;  // lr / (1 - beta1^k)
  float bc2;        // 1 / sqrt(1 - beta2^k)
};

// `k` is the count of applied steps including this one (>= 1). beta^k is std::pow(beta, k) in
// double; every formula is evaluated in double and rounded once to FP32.
AdamwScalars MakeAdamwScalars(const AdamwHyper& hyper, int64_t k);

// Where the random bits of stochastic rounding come from (kernels/philox.h, README.md "Numerics"):
// Philox 4x32-10 with key = seed, one stream per moment, element i of the tensor taking word i % 4
// of block i / 4, whose counter is (block low 32 bits; block >> 32, plus 2^31 for exp_avg_sq; k;
// tensor_index).
struct RngStream {
  uint64_t seed = 0;          // the job's seed
  uint32_t k = 0;             // count of applied steps, the k of MakeAdamwScalars
  uint32_t tensor_index = 0;  // the tensor's registration index in the job
  // The index in the whole tensor of the buffers' element 0: a row range [r0, r1) of a tensor
  // split over owners (DESIGN.md §7) is stepped as a tensor of r1 - r0 rows with r0 * cols here,
  // so it draws the bits the whole tensor's rows would.
  uint64_t index_offset = 0;
};

// One tensor's step. Pointers address the whole tensor (element 0), whatever range a call runs.
// State buffers are typed by `policy` (see MasterType / MomentType); scale arrays hold
// NumChunks(numel) FP32 values 1 / s (powers of two), read before and rewritten by the step; a new
// tensor starts with zero codes and scales 1.
//
// The state is updated in place, or read from the *_in sources and written to the destinations
// (master, exp_avg, ...): a second copy of the state, stepped while the first stays as it was, in
// the same single pass (no copy first). The sources are all null (in place), or every one the
// policy uses is set (a mix is kInvalidArgument); each has its destination's type and extent, and
// is either the destination's own pointer (in place for that buffer) or a buffer that does not
// overlap it (nor any other output). Sources the policy does not use are ignored, as are such
// destinations. The step never writes a source.
struct FusedStepArgs {
  const void* const* slots = nullptr;  // num_slots gradient buffers, rank order
  int num_slots = 0;
  SlotType slot_type = SlotType::kFp32;
  float grad_scale = 1.0f;  // rounded once to FP32 on the host
  float clip = 1.0f;        // global-norm clip factor (kernels/step_rules.h); 1 = no clipping
  AdamwScalars scalars{};
  StatePolicy policy{};
  RngStream rng{};    // only read when a moment rounds stochastically
  int64_t numel = 0;  // elements of the whole tensor; required with chunk-scaled moments,
                      // otherwise optional (0 = ranges not checked against it)

  // Each updated in place, or read from its *_in source below and written here.
  void* master = nullptr;
  int16_t* master_remainder = nullptr;  // kBf16Remainder only
  void* exp_avg = nullptr;
  float* exp_avg_scale_inv = nullptr;  // kFp16 / kFp8 exp_avg only
  void* exp_avg_sq = nullptr;
  float* exp_avg_sq_scale_inv = nullptr;  // kFp16 / kFp8 exp_avg_sq only

  // Optional sources of the state (see above): null = in place.
  const void* master_in = nullptr;
  const int16_t* master_remainder_in = nullptr;  // kBf16Remainder only
  const void* exp_avg_in = nullptr;
  const float* exp_avg_scale_inv_in = nullptr;  // kFp16 / kFp8 exp_avg only
  const void* exp_avg_sq_in = nullptr;
  const float* exp_avg_sq_scale_inv_in = nullptr;  // kFp16 / kFp8 exp_avg_sq only

  // Optional served copies of the new master, each computed from the stored master value (the
  // FP16 value of an fp16 master, the reconstructed FP32 of bf16+remainder): FP32; BF16 (round to
  // nearest even, saturating; for a bf16+remainder master its stored served half); FP16 (same
  // rules as BF16).
  float* out_fp32 = nullptr;
  uint16_t* out_bf16 = nullptr;
  uint16_t* out_fp16 = nullptr;

  // Out of place only: the caller reads the new stored master from nowhere after this call (no
  // format is cut from it), so the vector paths may write it with non-temporal stores where
  // aligned, as they do FP32 moments, rather than read its lines for ownership first. Ignored in
  // place (the master's lines are in cache: the pass read them).
  bool stream_master = false;
};

// Which code path a CPU kernel takes. kAuto picks the widest the CPU supports.
enum class CpuPath { kAuto, kScalar, kAvx2, kAvx512 };

// Runs the step on elements [begin, end) of the tensor, per element exactly the sequence of
// DESIGN.md §2-§3: g0 = ((s0 + s1) + s2) ... over the slots in FP32 (BF16 slots widened first),
// gs = g0 * grad_scale, g = gs * clip (skipped when clip == 1); moments dequantized as q * (1 / s);
// the AdamW update in FP32; the master stored in its type; each moment re-quantized (a scaled one
// with the scale of its new 128-element chunk, rounded as the policy says); then the served
// copies. Every path gives identical bits, equal to paramd::reference's.
//
// Ranges: with chunk-scaled moments (HasChunkScales), `begin` must be a multiple of 128 and `end`
// a multiple of 128 or numel, so a chunk is never split between calls. Disjoint ranges of one
// tensor may run concurrently on several threads (ThreadPool::ParallelFor in
// kernels/cpu/thread_pool.h with a grain that is a multiple of 128). No alignment is required;
// outputs must not overlap inputs. On ranges of 4096 elements or more the vector paths write the
// served outputs (and, out of place, FP32 moments and with stream_master the master) with
// non-temporal stores where aligned, and fence them before returning.
//
// `master_amax` (optional) receives the amax of the new stored master over [begin, end): NaN if any
// is NaN, else the largest magnitude (0 for an empty range); combine calls with AmaxCombine
// (kernels/formats.h), e.g. for the fp8_tensor scale of the second pass. `chunk_amax_bits`
// (optional; `begin` a multiple of 128) receives the same per 128-element chunk of the range, in
// order, as magnitude bits (the value's bits without the sign: a NaN's exceed 0x7F800000), so a
// block format cut from the new master needs no pass of its own for its amaxes
// (ServeArgs::chunk_amax_bits).
//
// Returns kInvalidArgument for a bad range, missing buffers, a mixed set of sources or a source
// that partly overlaps its destination (nothing is written), kUnimplemented for a path this CPU
// cannot run.
KStatus FusedStepCpu(const FusedStepArgs& args, int64_t begin, int64_t end,
                     CpuPath path = CpuPath::kAuto, float* master_amax = nullptr,
                     uint32_t* chunk_amax_bits = nullptr);

// A whole tensor's step, panel by panel with its served formats, is kernels/cpu_step.h.

// The path kAuto resolves to on this CPU, and whether a path can run here.
CpuPath BestCpuPath();
bool CpuPathSupported(CpuPath path);
const char* CpuPathName(CpuPath path);

}  // namespace paramd::kernels
