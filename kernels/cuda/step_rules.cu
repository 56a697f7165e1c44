// GradCheckCuda: the step rules of kernels/step_rules.h on the GPU, bit-identical to
// GradBlockSumsCpu.
//
// The order. A norm block (128 rows) of N chunks is summed by the tree s[i] += s[i + h] for
// h = P/2, ..., 1 over its chunk sums zero-padded to P = 2^ceil(log2 N). The strides from P/2 down
// to W (W a power of two) only ever add elements of the same residue class mod W, so the block
// splits into W classes, each reduced by itself, and then the tree over the W class values: the
// same additions in the same order. Within a class of L = P / W leaves u_j = s[c + j W] the tree
// u_j += u_{j + L/2}, ... is the contiguous pairwise tree over the leaves in bit-reversed order, so
// a warp reduces its class streaming, chunk after chunk, with a stack of log2(L) partial sums; the
// zero leaves past N add nothing (x + 0 == x) and are skipped. Kernel 1: warp w of sub-block b owns
// class b * 8 + w of W = 8 * sub_blocks, each chunk summed by the warp with the 128-element tree
// (elements e and e + 64 within a lane, then e + 32, then across lanes by shuffles). Kernel 2:
// one thread block per norm block reduces its W class values by the same method and writes the
// block's sum.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_vec.cuh"
#include "kernels/cuda/step_desc.h"
#include "kernels/cuda_step.h"
#include "kernels/step_rules.h"

namespace paramd::kernels::cuda_internal {
namespace {

// Streaming pairwise sum of leaves 0, 1, 2, ... (the caller visits them in bit-reversed order).
struct PairwiseStack {
  double level[32];
  __device__ __forceinline__ void Push(uint32_t k, double v) {
    int l = 0;
    while ((k >> l) & 1u) {
      v = __dadd_rn(level[l], v);
      ++l;
    }
    level[l] = v;
  }
};

__device__ __forceinline__ uint32_t BitReverse(uint32_t k, int bits) {
  return bits == 0 ? 0u : __brev(k) >> (32 - bits);
}

__device__ __forceinline__ int Log2(uint64_t pow2) { return 63 - __clzll(pow2); }

__device__ __forceinline__ uint64_t BitCeil(uint64_t n) {
  return n <= 1 ? 1 : 1ull << (64 - __clzll(n - 1));
}

// g0 of element i: the ranks' slots summed in rank order.
__device__ __forceinline__ float SlotSum(const GradDesc& d, int64_t i) {
  if (d.slot_type == static_cast<uint8_t>(SlotType::kFp32)) {
    float g0 = static_cast<const float*>(d.slots[0])[i];
    for (int r = 1; r < d.num_slots; ++r) {
      g0 = __fadd_rn(g0, static_cast<const float*>(d.slots[r])[i]);
    }
    return g0;
  }
  float g0 = DecodeBf16(static_cast<const uint16_t*>(d.slots[0])[i]);
  for (int r = 1; r < d.num_slots; ++r) {
    g0 = __fadd_rn(g0, DecodeBf16(static_cast<const uint16_t*>(d.slots[r])[i]));
  }
  return g0;
}

// ChunkSum's test of one element: gs * gs is not finite.
__device__ __forceinline__ bool NotFinite(float g0, float grad_scale) {
  const float gs = __fmul_rn(g0, grad_scale);
  return (__float_as_uint(__fmul_rn(gs, gs)) & 0x7F800000u) == 0x7F800000u;
}

// The sum of squares of chunk [first, first + 128) ∩ [.., end), by the 128-element tree, in every
// lane; clears *finite when some gs * gs is not finite.
__device__ double ChunkSum(const GradDesc& d, float grad_scale, int64_t first, int64_t end,
                           bool sums, bool* finite) {
  const int lane = threadIdx.x & 31;
  double s[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int64_t i = first + lane + 32 * q;
    s[q] = 0.0;
    if (i >= end) continue;
    const float g0 = SlotSum(d, i);
    if (NotFinite(g0, grad_scale)) *finite = false;
    const double x = static_cast<double>(__fmul_rn(g0, grad_scale));
    s[q] = __dmul_rn(x, x);
  }
  if (!sums) return 0.0;
  s[0] = __dadd_rn(s[0], s[2]);  // stride 64
  s[1] = __dadd_rn(s[1], s[3]);
  s[0] = __dadd_rn(s[0], s[1]);  // stride 32
#pragma unroll
  for (int h = 16; h >= 1; h /= 2) s[0] = __dadd_rn(s[0], __shfl_down_sync(0xFFFFFFFFu, s[0], h));
  return __shfl_sync(0xFFFFFFFFu, s[0], 0);
}

struct GradParams {
  const GradDesc* descs;
  const int64_t* starts;        // first item of each tensor
  const int64_t* block_starts;  // first norm block of each tensor
  int num_descs;
  float grad_scale;
  int sums;
  double* partials;  // kGradWarps per item
  double* block_sums;
  int* all_finite;
};

__global__ void __launch_bounds__(kThreads) ClassKernel(const GradParams P) {
  const GradDesc& d = P.descs[FindOwner(P.starts, P.num_descs, blockIdx.x)];
  const int64_t local = blockIdx.x - d.first_item;
  const int64_t nb = local / d.sub_blocks, b = local - nb * d.sub_blocks;
  const int64_t begin = nb * kNormBlockRows * d.cols;
  const int64_t end = min(d.rows, (nb + 1) * kNormBlockRows) * d.cols;
  const uint64_t chunks = static_cast<uint64_t>((end - begin + 127) / 128);
  const uint64_t padded = BitCeil(chunks);
  const uint64_t classes = static_cast<uint64_t>(kGradWarps) * d.sub_blocks;
  const uint64_t cls = static_cast<uint64_t>(b) * kGradWarps + (threadIdx.x >> 5);
  const uint64_t leaves = padded > classes ? padded / classes : 1;
  const int bits = Log2(leaves);
  bool finite = true;
  PairwiseStack stack;
  for (uint64_t k = 0; k < leaves; ++k) {
    const uint64_t chunk =
        cls + static_cast<uint64_t>(BitReverse(static_cast<uint32_t>(k), bits)) * classes;
    double v = 0.0;
    if (chunk < chunks) {
      v = ChunkSum(d, P.grad_scale, begin + static_cast<int64_t>(chunk) * 128, end, P.sums,
                   &finite);
    }
    if (P.sums) stack.Push(static_cast<uint32_t>(k), v);
  }
  if (__any_sync(0xFFFFFFFFu, !finite) && (threadIdx.x & 31) == 0) *P.all_finite = 0;
  if (P.sums && (threadIdx.x & 31) == 0) {
    P.partials[blockIdx.x * kGradWarps + (threadIdx.x >> 5)] = stack.level[bits];
  }
}

// The check alone (no clipping, so no sums): ClassKernel's items, each a contiguous share of its
// norm block read in 16-byte vectors, eight elements a thread, in no particular order (finiteness
// has none). Same test per element as ChunkSum.
__global__ void __launch_bounds__(kThreads) FiniteKernel(const GradParams P) {
  const GradDesc& d = P.descs[FindOwner(P.starts, P.num_descs, blockIdx.x)];
  const int64_t local = blockIdx.x - d.first_item;
  const int64_t nb = local / d.sub_blocks, b = local - nb * d.sub_blocks;
  const int64_t begin = nb * kNormBlockRows * d.cols;  // a multiple of 8 (128 rows)
  const int64_t end = min(d.rows, (nb + 1) * kNormBlockRows) * d.cols;
  const int64_t share = (end - begin + 8 * d.sub_blocks - 1) / (8 * d.sub_blocks) * 8;
  const int64_t lo = min(end, begin + b * share);
  const int64_t hi = min(end, lo + share);
  const bool bf16 = d.slot_type == static_cast<uint8_t>(SlotType::kBf16);
  bool aligned = true;
  for (int r = 0; r < d.num_slots; ++r) {
    aligned = aligned && (reinterpret_cast<uintptr_t>(d.slots[r]) & 15u) == 0;
  }
  const int64_t vector_end = aligned ? lo + (hi - lo) / 8 * 8 : lo;
  bool bad = false;
  for (int64_t i = lo + 8 * static_cast<int64_t>(threadIdx.x); i < vector_end; i += 8 * kThreads) {
    float g[8];
    for (int r = 0; r < d.num_slots; ++r) {
      float x[8];
      if (bf16) {
        const uint4 u =
            *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(d.slots[r]) + i);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          x[2 * k] = DecodeBf16(w[k] & 0xFFFFu);
          x[2 * k + 1] = DecodeBf16(w[k] >> 16);
        }
      } else {
        const float4* f =
            reinterpret_cast<const float4*>(static_cast<const float*>(d.slots[r]) + i);
        const float4 a = f[0], c = f[1];
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
        x[4] = c.x, x[5] = c.y, x[6] = c.z, x[7] = c.w;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) g[j] = r == 0 ? x[j] : __fadd_rn(g[j], x[j]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) bad = bad || NotFinite(g[j], P.grad_scale);
  }
  for (int64_t i = vector_end + threadIdx.x; i < hi; i += kThreads) {
    bad = bad || NotFinite(SlotSum(d, i), P.grad_scale);
  }
  if (__any_sync(0xFFFFFFFFu, bad) && (threadIdx.x & 31) == 0) *P.all_finite = 0;
}

__global__ void __launch_bounds__(kThreads) BlockKernel(const GradParams P) {
  __shared__ double sm[kThreads];
  const int t = threadIdx.x;
  const int di = FindOwner(P.block_starts, P.num_descs, blockIdx.x);
  const GradDesc& d = P.descs[di];
  const int64_t nb = blockIdx.x - d.first_block;
  const double* values = P.partials + (d.first_item + nb * d.sub_blocks) * kGradWarps;
  const int classes = kGradWarps * d.sub_blocks;
  int width = classes;  // values left for the tree in shared memory
  if (classes > kThreads) {
    const int leaves = classes / kThreads;
    const int bits = Log2(static_cast<uint64_t>(leaves));
    PairwiseStack stack;
    for (int k = 0; k < leaves; ++k) {
      stack.Push(static_cast<uint32_t>(k), values[t + BitReverse(k, bits) * kThreads]);
    }
    sm[t] = stack.level[bits];
    width = kThreads;
  } else if (t < classes) {
    sm[t] = values[t];
  }
  __syncthreads();
  for (int h = width / 2; h >= 1; h /= 2) {
    if (t < h) sm[t] = __dadd_rn(sm[t], sm[t + h]);
    __syncthreads();
  }
  if (t == 0) P.block_sums[blockIdx.x] = sm[0];
}

__global__ void SetOne(int* flag) { *flag = 1; }

// SumInOrder then ClipFactor (kernels/cpu/step_rules_cpu.cc) by one thread: the same IEEE
// additions in the same order, a correctly rounded square root and division, one rounding to FP32.
__global__ void DecisionKernel(const double* sums, int64_t n, double max_norm, float* clip) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total = __dadd_rn(total, sums[i]);
  const double c = __ddiv_rn(max_norm, __dadd_rn(__dsqrt_rn(total), 1e-6));
  *clip = __double2float_rn(c < 1.0 ? c : 1.0);
}

constexpr int kSkipCopiesPerLaunch = 64;
struct SkipCopies {
  CudaSkipCopy items[kSkipCopiesPerLaunch];
  int count;
};

// blockIdx.y picks the copy; the grid's x blocks stride over its 16-byte words, then its tail.
__global__ void __launch_bounds__(256)
    CopyIfSkippedKernel(const __grid_constant__ SkipCopies C, const int* all_finite) {
  if (*all_finite != 0 || blockIdx.y >= static_cast<unsigned>(C.count)) return;
  const CudaSkipCopy& c = C.items[blockIdx.y];
  // 16-byte words where both ends are aligned, bytes for the rest.
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(c.d_src) | reinterpret_cast<uintptr_t>(c.d_dst)) & 15u) == 0;
  const int64_t words = aligned ? c.bytes / 16 : 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < words; i += stride) {
    static_cast<uint4*>(c.d_dst)[i] = static_cast<const uint4*>(c.d_src)[i];
  }
  for (int64_t i = words * 16 + first; i < c.bytes; i += stride) {
    static_cast<uint8_t*>(c.d_dst)[i] = static_cast<const uint8_t*>(c.d_src)[i];
  }
}

}  // namespace
}  // namespace paramd::kernels::cuda_internal

namespace paramd::kernels {

KStatus GradCheckCuda(const CudaStepPlan& plan, float grad_scale, double* d_block_sums,
                      int* d_all_finite, cudaStream_t stream) {
  using namespace cuda_internal;
  if (plan.d_workspace() == nullptr || d_all_finite == nullptr) {
    return KStatus(Code::kInvalidArgument, "GradCheckCuda: unbound plan or no d_all_finite");
  }
  SetOne<<<1, 1, 0, stream>>>(d_all_finite);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (plan.num_grad_items() == 0) return KStatus::Ok();
  auto* base = static_cast<unsigned char*>(plan.d_workspace());
  GradParams P{};
  P.descs = reinterpret_cast<const GradDesc*>(base + plan.layout().grad_descs);
  P.starts = reinterpret_cast<const int64_t*>(base + plan.layout().grad_starts);
  P.block_starts = reinterpret_cast<const int64_t*>(base + plan.layout().block_starts);
  P.num_descs = static_cast<int>(plan.grad_tensors());
  P.grad_scale = grad_scale;
  P.sums = d_block_sums != nullptr;
  P.partials = reinterpret_cast<double*>(base + plan.layout().scratch);
  P.block_sums = d_block_sums;
  P.all_finite = d_all_finite;
  if (P.sums) {
    ClassKernel<<<static_cast<unsigned>(plan.num_grad_items()), kThreads, 0, stream>>>(P);
  } else {
    FiniteKernel<<<static_cast<unsigned>(plan.num_grad_items()), kThreads, 0, stream>>>(P);
  }
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (P.sums && plan.num_norm_blocks() > 0) {
    BlockKernel<<<static_cast<unsigned>(plan.num_norm_blocks()), kThreads, 0, stream>>>(P);
    PARAMD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return KStatus::Ok();
}

KStatus StepDecisionCuda(const double* d_block_sums, int64_t n, double max_grad_norm, float* d_clip,
                         cudaStream_t stream) {
  if (d_clip == nullptr || (n > 0 && d_block_sums == nullptr) || !(max_grad_norm > 0)) {
    return KStatus(Code::kInvalidArgument,
                   "StepDecisionCuda: needs the block sums, a clip to write and max_grad_norm > 0");
  }
  cuda_internal::DecisionKernel<<<1, 1, 0, stream>>>(d_block_sums, n, max_grad_norm, d_clip);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return KStatus::Ok();
}

KStatus CopyIfSkippedCuda(std::span<const CudaSkipCopy> copies, const int* d_all_finite,
                          cudaStream_t stream) {
  using cuda_internal::kSkipCopiesPerLaunch;
  if (d_all_finite == nullptr) {
    return KStatus(Code::kInvalidArgument, "CopyIfSkippedCuda: no d_all_finite");
  }
  for (size_t first = 0; first < copies.size(); first += kSkipCopiesPerLaunch) {
    cuda_internal::SkipCopies C{};
    int64_t most = 0;
    for (size_t i = first; i < copies.size() && C.count < kSkipCopiesPerLaunch; ++i) {
      C.items[C.count++] = copies[i];
      most = copies[i].bytes > most ? copies[i].bytes : most;
    }
    // Enough blocks for the largest copy at a few words per thread, at most one wave per copy.
    const int64_t blocks = (most / 16 + 4 * 256 - 1) / (4 * 256);
    const dim3 grid(static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 132 ? 132 : blocks)),
                    static_cast<unsigned>(C.count));
    cuda_internal::CopyIfSkippedKernel<<<grid, 256, 0, stream>>>(C, d_all_finite);
    PARAMD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return KStatus::Ok();
}

}  // namespace paramd::kernels
