// The job-wide step rules of DESIGN.md §2, computed from the rank slots before the fused step:
// finiteness (a non-finite gradient skips the step for the whole job) and the FP64 sums of squares
// behind global-norm clipping, in the fixed pairwise order that makes the clip factor bit-identical
// on every backend and daemon count.
//
// Per element, as the fused step forms it: g0 = ((s0 + s1) + s2) ... over the slots in FP32 (BF16
// slots widened first), gs = g0 * grad_scale. An element is finite when gs * gs (FP32) is finite,
// i.e. gs is finite and its square does not overflow (moments then stay finite).
//
// Sums of squares, per block of 128 rows of a [rows, cols] tensor (the unit a split never cuts;
// 1-D tensors are [1, n]): the block's row-major elements in 128-element chunks, each chunk summed
// in FP64 over (double)gs * (double)gs (exact) by the tree s[i] += s[i + 64], then + 32, ..., + 1
// (a partial last chunk zero-padded); the chunk sums by the same tree over chunk index,
// zero-padded to a power of two. Blocks start at multiples of 128 * cols elements, so chunks are
// the tensor's own 128-element chunks (only the tensor's last may be partial). Block sums are then
// added one after another in tensor registration order, then block index (SumInOrder), and
// ClipFactor turns the total into the clip the fused step multiplies by.
#pragma once

#include <cstdint>

#include "kernels/fused_step.h"  // SlotType, CpuPath
#include "kernels/status.h"

namespace paramd::kernels {

// One tensor's gradient as the ranks pushed it. Pointers address the whole tensor.
struct GradSlots {
  const void* const* slots = nullptr;  // num_slots buffers, rank order
  int num_slots = 0;
  SlotType slot_type = SlotType::kFp32;
  float grad_scale = 1.0f;  // rounded once to FP32 on the host
};

inline constexpr int64_t kNormBlockRows = 128;
constexpr int64_t NumNormBlocks(int64_t rows) {
  return (rows + kNormBlockRows - 1) / kNormBlockRows;
}

// Finiteness of elements [begin, end): clears *all_finite when some element is not finite, and
// leaves it untouched otherwise, so one flag per thread gathers any number of calls. For jobs
// without clipping (GradChunkSumsCpu reports finiteness too).
KStatus GradFiniteCpu(const GradSlots& grad, int64_t begin, int64_t end, bool* all_finite,
                      CpuPath path = CpuPath::kAuto);

// Chunk sums of squares of elements [begin, end): begin a multiple of 128, end a multiple of 128
// or the tensor's end. chunk_sums[j] is the tree sum of chunk [begin + 128 j, ...), ceil((end -
// begin) / 128) of them. Clears *all_finite as GradFiniteCpu does. Ranges may run concurrently.
KStatus GradChunkSumsCpu(const GradSlots& grad, int64_t begin, int64_t end, double* chunk_sums,
                         bool* all_finite, CpuPath path = CpuPath::kAuto);

// Block sums of squares of blocks [block_begin, block_end) of a [rows, cols] tensor into
// block_sums[0 .. block_end - block_begin), and finiteness of their elements.
KStatus GradBlockSumsCpu(const GradSlots& grad, int64_t rows, int64_t cols, int64_t block_begin,
                         int64_t block_end, double* block_sums, bool* all_finite,
                         CpuPath path = CpuPath::kAuto);

// Host side. The fixed pairwise tree over n values zero-padded to a power of two: s[i] += s[i + h]
// for h = P/2, P/4, ..., 1 (P the padded size); 0 for n == 0.
double PairwiseSum(const double* values, int64_t n);

// ((0 + v[0]) + v[1]) + ... : how block sums are combined, in registration order then block index.
double SumInOrder(const double* values, int64_t n);

// clip = min(1, max_norm / (sqrt(total) + 1e-6)) in double, rounded once to FP32. max_norm > 0.
float ClipFactor(double total_sum_of_squares, double max_norm);

}  // namespace paramd::kernels
