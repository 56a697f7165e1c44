// FusedStepCuda: pass 1 (tile path), pass 1' (flat path) and the launch of pass 2 (serve.cu).
//
// Tile path, for tensors whose cols are a multiple of 128 and rows at least 8. A persistent grid
// (blocks_per_sm per multiprocessor) walks the launch's list of 128 x 128 tiles (block b takes
// tiles b, b + grid, ...). A tile is walked in sub-units of 8 * R rows x 128 columns (R = rows per
// warp, 1, 2 or 4; 4 by default): warp w owns rows w, w + 8, ... of a sub-unit and lane l their
// columns 4l .. 4l + 3. Since cols % 128 == 0, every row segment of a tile is one whole 128-element
// chunk of the flattened tensor, so a moment's chunk scale is one warp reduction (redux.sync) and
// an mxfp8 row block is 8 lanes; the R rows of a warp are independent chains, written stage by
// stage so their latencies overlap.
//
// Memory pipeline: the inputs of a sub-unit (master, remainder, slots, moments, and each row's two
// chunk scales) are copied into shared memory with cp.async (16 bytes a copy), `stages` sub-units
// ahead of the one computed, across tile boundaries; one barrier per sub-unit (the slot computed
// last is refilled right after it). Outputs are stored from registers, coalesced per warp. The
// tensor descriptor of the tile being computed is copied into shared memory (two copies, by tile
// parity), so none of its reads waits on the step's global stores.
//
// Block formats: mxfp8 rowwise is cast per sub-unit. mxfp8 columnwise: with 4 rows per warp a
// sub-unit is one whole 32-row group, so each thread's column maxima meet in shared memory through
// atomics and every thread casts its own rows from registers (MxColumnFromRegisters); with 1 or 2
// rows per warp the new master (served values) goes into a shared buffer of 32 rows, whose column
// amaxes are reduced across the 8 warps before the group is cast. fp8_block keeps all 128 rows in
// that buffer: after the tile, its amax, scale and both directions, the columnwise one transposed
// out of shared memory. Outputs are written with st.global (device_vec.cuh's StGlobal), output
// kind by output kind over all rows of a sub-unit. Each tile's master amax goes to the tensor's
// counter with one atomicMax; the block that completes a tensor's last tile turns it into the
// fp8_tensor scale (and the amax output), so pass 2 reads a finished scale: fp8_tensor costs one
// more read of the master, not two.
//
// Arithmetic: the AdamW sequence of DESIGN.md §3 with explicit __fmaf_rn; square root and division
// through branch-free copies of the library's fast sequences for operands in their exact range
// (step_math.cuh), the whole sub-unit redone with __fsqrt_rn / __fdiv_rn when one is outside it.
// Kernels are compiled per policy kind (the benchmark's policy and the fp32 policy, whose branches
// fold away) next to one generic kernel that reads the policy of each tensor.
//
// Flat path (pass 1'), for the rest: a warp per 128-element chunk of the flattened tensor, lane l
// holding elements l, l + 32, l + 64, l + 96 (coalesced scalar accesses, any alignment),
// elementwise outputs only; block formats of these tensors go to pass 2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_vec.cuh"
#include "kernels/cuda/serve_launch.h"
#include "kernels/cuda/step_desc.h"
#include "kernels/cuda/step_math.cuh"
#include "kernels/cuda_step.h"

namespace paramd::kernels::cuda_internal {
namespace {

// Where each input of a sub-unit sits in a pipeline stage (bytes).
struct StageLayout {
  uint32_t master, remainder, m, v, slots, slot_stride, scales, bytes;
};

struct TileParams {
  const StepDesc* descs;
  const int64_t* starts;
  int num_descs;
  int64_t num_tiles;
  StepScalarsDev s;
  StageLayout stage;
  int stages;
  int buffer_rows;  // 0, 32 or 128
  uint32_t buffer_offset, colmax_offset, colscale_offset, reduce_offset;
};

// What a tile kernel knows of the policy. kAnyPolicy reads it from each tensor's descriptor; the
// other kinds are compiled for one policy that every tile-path tensor of the launch has, so their
// branches fold away (CudaStepPlan::TileShape::policy_kind).
template <int kKind>
struct PolicyOf {
  uint8_t slot_type, master_type, m_type, v_type;
  bool m_stochastic, v_stochastic;
  int num_slots;
  __device__ __forceinline__ explicit PolicyOf(const StepDesc& d) {
    if constexpr (kKind == kIssuePolicy || kKind == kIssueFp32GradPolicy) {
      slot_type = static_cast<uint8_t>(kKind == kIssuePolicy ? SlotType::kBf16 : SlotType::kFp32);
      master_type = static_cast<uint8_t>(MasterType::kFp32);
      m_type = static_cast<uint8_t>(MomentType::kFp8);
      v_type = static_cast<uint8_t>(MomentType::kFp16);
      m_stochastic = v_stochastic = false;
      num_slots = 1;
    } else if constexpr (kKind == kFp32Policy) {
      slot_type = static_cast<uint8_t>(SlotType::kFp32);
      master_type = static_cast<uint8_t>(MasterType::kFp32);
      m_type = v_type = static_cast<uint8_t>(MomentType::kFp32);
      m_stochastic = v_stochastic = false;
      num_slots = 1;
    } else {
      slot_type = d.slot_type;
      master_type = d.master_type;
      m_type = d.m_type;
      v_type = d.v_type;
      m_stochastic = d.m_stochastic != 0;
      v_stochastic = d.v_stochastic != 0;
      num_slots = d.num_slots;
    }
  }
};

// ---- cp.async ----------------------------------------------------------------------------------

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most n of this thread's committed groups are pending (n < 8).
__device__ __forceinline__ void CpAsyncWait(int n) {
  switch (n) {
    case 0:
      asm volatile("cp.async.wait_group 0;" ::: "memory");
      break;
    case 1:
      asm volatile("cp.async.wait_group 1;" ::: "memory");
      break;
    case 2:
      asm volatile("cp.async.wait_group 2;" ::: "memory");
      break;
    case 3:
      asm volatile("cp.async.wait_group 3;" ::: "memory");
      break;
    case 4:
      asm volatile("cp.async.wait_group 4;" ::: "memory");
      break;
    case 5:
      asm volatile("cp.async.wait_group 5;" ::: "memory");
      break;
    case 6:
      asm volatile("cp.async.wait_group 6;" ::: "memory");
      break;
    default:
      asm volatile("cp.async.wait_group 7;" ::: "memory");
      break;
  }
}

// ---- the walk over tiles -----------------------------------------------------------------------

struct Cursor {
  int64_t tile;  // >= num_tiles when done
  int desc;
  int64_t r0, c0;
  int rows;  // valid rows of the tile
  int nsub;  // its sub-units
  int su;
};

template <int kRows>
__device__ __forceinline__ void OpenTile(const TileParams& P, int64_t tile, Cursor* c) {
  c->tile = tile;
  c->su = 0;
  if (tile >= P.num_tiles) return;
  c->desc = FindOwner(P.starts, P.num_descs, tile);
  const StepDesc& d = P.descs[c->desc];
  const int64_t local = tile - d.first_item;
  const int64_t tiles_c = d.cols / kTileCols;
  const int64_t tr = local / tiles_c;
  c->r0 = tr * kTileRows;
  c->c0 = (local - tr * tiles_c) * kTileCols;
  c->rows = static_cast<int>(min(static_cast<int64_t>(kTileRows), d.rows - c->r0));
  c->nsub = (c->rows + kSubRows * kRows - 1) / (kSubRows * kRows);
}

template <int kRows>
__device__ __forceinline__ void Advance(const TileParams& P, Cursor* c) {
  if (++c->su == c->nsub) OpenTile<kRows>(P, c->tile + gridDim.x, c);
}

// Copies rows [r0, r0 + rows) x columns [c0, c0 + 128) of a row-major stream of kEsize-byte
// elements into dst (row after row, 128 * kEsize bytes each), 16 bytes per cp.async. Each thread
// keeps one 16-byte piece of the row and steps down the rows (kThreads / pieces per pass), so a
// copy costs an address increment, not an index decomposition; rows <= kRowsMax.
template <int kEsize, int kRowsMax>
__device__ __forceinline__ void CopyRowsT(unsigned char* dst, const void* src, int64_t r0,
                                          int64_t c0, int rows, int64_t cols) {
  constexpr int kPieces = 8 * kEsize;  // 128 * kEsize / 16
  constexpr int kRowsPerPass = kThreads / kPieces;
  constexpr int kPasses = (kRowsMax + kRowsPerPass - 1) / kRowsPerPass;
  const int row = threadIdx.x / kPieces;
  const int piece = threadIdx.x % kPieces;
  const unsigned char* g =
      static_cast<const unsigned char*>(src) + ((r0 + row) * cols + c0) * kEsize + piece * 16;
  unsigned char* s = dst + row * (128 * kEsize) + piece * 16;
  const int64_t step = static_cast<int64_t>(kRowsPerPass) * cols * kEsize;
#pragma unroll
  for (int k = 0; k < kPasses; ++k) {
    if (row + k * kRowsPerPass < rows) {
      CpAsync16(s + k * kRowsPerPass * 128 * kEsize, g + k * step);
    }
  }
}

template <int kRowsMax>
__device__ __forceinline__ void CopyRows(unsigned char* dst, const void* src, int esize, int64_t r0,
                                         int64_t c0, int rows, int64_t cols) {
  if (esize == 4) {
    CopyRowsT<4, kRowsMax>(dst, src, r0, c0, rows, cols);
  } else if (esize == 2) {
    CopyRowsT<2, kRowsMax>(dst, src, r0, c0, rows, cols);
  } else {
    CopyRowsT<1, kRowsMax>(dst, src, r0, c0, rows, cols);
  }
}

__device__ __forceinline__ int MomentSize(uint8_t t) {
  return t == static_cast<uint8_t>(MomentType::kFp32)  ? 4
         : t == static_cast<uint8_t>(MomentType::kFp8) ? 1
                                                       : 2;
}

// Stage bytes 0..127 hold the exp_avg scales of the sub-unit's rows, 128..255 exp_avg_sq's.
inline constexpr int kScaleBytes = 256;

template <int kKind, int kRows>
__device__ void IssueSubUnit(const TileParams& P, const Cursor& c, unsigned char* stage) {
  const StepDesc& d = P.descs[c.desc];
  const PolicyOf<kKind> pol(d);
  const int64_t cols = d.cols;
  const void* master = d.master;
  const void* remainder = d.remainder;
  const void* const* slots = d.slots;
  const void* slot0 = d.slot0;
  const void* m = d.m;
  const void* v = d.v;
  const float* m_scale = d.m_scale_inv;
  const float* v_scale = d.v_scale_inv;
  constexpr int kSub = kSubRows * kRows;
  const int64_t r0 = c.r0 + c.su * kSub;
  const int rows = min(kSub, c.rows - c.su * kSub);
  const int mbytes = pol.master_type == static_cast<uint8_t>(MasterType::kFp32) ? 4 : 2;
  CopyRows<kSub>(stage + P.stage.master, master, mbytes, r0, c.c0, rows, cols);
  if (pol.master_type == static_cast<uint8_t>(MasterType::kBf16Remainder)) {
    CopyRows<kSub>(stage + P.stage.remainder, remainder, 2, r0, c.c0, rows, cols);
  }
  const int sbytes = pol.slot_type == static_cast<uint8_t>(SlotType::kFp32) ? 4 : 2;
  CopyRows<kSub>(stage + P.stage.slots, slot0, sbytes, r0, c.c0, rows, cols);
  for (int r = 1; r < pol.num_slots; ++r) {
    CopyRows<kSub>(stage + P.stage.slots + r * P.stage.slot_stride, slots[r], sbytes, r0, c.c0,
                   rows, cols);
  }
  CopyRows<kSub>(stage + P.stage.m, m, MomentSize(pol.m_type), r0, c.c0, rows, cols);
  CopyRows<kSub>(stage + P.stage.v, v, MomentSize(pol.v_type), r0, c.c0, rows, cols);
  // One scale per row segment (chunk (r * cols + c0) / 128) of each scaled moment.
  const int t = threadIdx.x;
  const int64_t chunk0 = r0 * (cols / kChunkElements) + c.c0 / kChunkElements;
  if (t < rows && m_scale != nullptr) {
    CpAsync4(stage + P.stage.scales + 4 * t, m_scale + chunk0 + t * (cols / kChunkElements));
  } else if (t >= 32 && t < 32 + rows && v_scale != nullptr) {
    CpAsync4(stage + P.stage.scales + 128 + 4 * (t - 32),
             v_scale + chunk0 + (t - 32) * (cols / kChunkElements));
  }
}

// ---- one sub-unit ------------------------------------------------------------------------------

// Loads 4 consecutive values of a moment from the stage and dequantizes them.
__device__ __forceinline__ void LoadMoment4(uint8_t type, const unsigned char* row, int lane,
                                            float s_inv, float* out) {
  if (type == static_cast<uint8_t>(MomentType::kFp32)) {
    const float4 x = reinterpret_cast<const float4*>(row)[lane];
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
  } else if (type == static_cast<uint8_t>(MomentType::kBf16)) {
    const uint2 x = reinterpret_cast<const uint2*>(row)[lane];
    out[0] = DecodeBf16(x.x & 0xFFFFu), out[1] = DecodeBf16(x.x >> 16);
    out[2] = DecodeBf16(x.y & 0xFFFFu), out[3] = DecodeBf16(x.y >> 16);
  } else if (type == static_cast<uint8_t>(MomentType::kFp16)) {
    const uint2 x = reinterpret_cast<const uint2*>(row)[lane];
    out[0] = __fmul_rn(DecodeFp16Moment(x.x & 0xFFFFu), s_inv);
    out[1] = __fmul_rn(DecodeFp16Moment(x.x >> 16), s_inv);
    out[2] = __fmul_rn(DecodeFp16Moment(x.y & 0xFFFFu), s_inv);
    out[3] = __fmul_rn(DecodeFp16Moment(x.y >> 16), s_inv);
  } else {
    const uint32_t x = reinterpret_cast<const uint32_t*>(row)[lane];
    float a, b, c, e;
    DecodeE4m3x2Moment(x & 0xFFFFu, &a, &b);
    DecodeE4m3x2Moment(x >> 16, &c, &e);
    out[0] = __fmul_rn(a, s_inv), out[1] = __fmul_rn(b, s_inv);
    out[2] = __fmul_rn(c, s_inv), out[3] = __fmul_rn(e, s_inv);
  }
}

// The chunk scales of a moment's kRows rows (all lanes; the warp holds each whole 128-element
// chunk): the amaxes of the new values and their power-of-two scales (1 for unscaled types). All
// reductions first, then the scales by the normal-amax formula, and the definition only when one
// amax is not normal (one uniform branch instead of one per row), so the rows' latencies overlap.
template <int kRows>
__device__ __forceinline__ void MomentScales(uint8_t type, const float (*y)[4], float* scale) {
  if (type == static_cast<uint8_t>(MomentType::kFp32) ||
      type == static_cast<uint8_t>(MomentType::kBf16)) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) scale[k] = 1.0f;
    return;
  }
  const float top = MomentTop(type);
  uint32_t bits[kRows];
  bool normal = true;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const float a = AbsMaxDev(AbsMaxDev(y[k][0], y[k][1]), AbsMaxDev(y[k][2], y[k][3]));
    bits[k] = WarpMaxU(__float_as_uint(a));
  }
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    normal = normal & NormalBits(bits[k]);
    scale[k] = Pow2ScaleNormalDev(bits[k], top);
  }
  if (!normal) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) scale[k] = Pow2ScaleDev(__uint_as_float(bits[k]), top);
  }
}

// Re-quantizes 4 consecutive new moment values with their chunk's scale and stores them at
// element i of the moment.
__device__ __forceinline__ void StoreMoment4(uint8_t type, bool stochastic, void* base, int64_t i,
                                             float scale, const float* y, const uint32_t* r) {
  if (type == static_cast<uint8_t>(MomentType::kFp32)) {
    StGlobal(static_cast<float*>(base) + i, make_float4(y[0], y[1], y[2], y[3]));
    return;
  }
  if (type == static_cast<uint8_t>(MomentType::kFp8)) {
    uint32_t packed;
    if (stochastic) {
      packed = EncodeMoment(type, y[0], scale, true, r[0]) |
               (EncodeMoment(type, y[1], scale, true, r[1]) << 8) |
               (EncodeMoment(type, y[2], scale, true, r[2]) << 16) |
               (EncodeMoment(type, y[3], scale, true, r[3]) << 24);
    } else {
      packed = E4m3x4(__fmul_rn(y[0], scale), __fmul_rn(y[1], scale), __fmul_rn(y[2], scale),
                      __fmul_rn(y[3], scale));
    }
    StGlobal(static_cast<uint8_t*>(base) + i, packed);
    return;
  }
  uint32_t c[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) c[j] = EncodeMoment(type, y[j], scale, stochastic, r[j]);
  StGlobal(static_cast<uint16_t*>(base) + i, make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16)));
}

struct ThreadAcc {
  float amax;       // AbsMaxDev of the served master over the tile (this thread's elements)
  float colmax[4];  // mxfp8 columnwise (kRows < 4): this thread's columns over the current group
};

// mxfp8 columnwise of a sub-unit that is one whole 32-row group (kRows == 4), from the served
// values in registers. The column maxima meet in shared memory through atomicMax (entry
// j * 32 + lane for column 4 * lane + j: conflict-free), double-buffered by sub-unit parity: the
// pipeline's barrier at the top of each sub-unit orders one sub-unit's reads of a buffer before
// the next-but-one's atomics, and this sub-unit clears the other buffer, which the last one read
// before that barrier. One more barrier here, after which every warp derives the scales of its
// lanes' 4 columns (the same in every warp; warp 0 stores the codes) and casts its rows.
__device__ __forceinline__ void MxColumnFromRegisters(const StepDesc& d, const Cursor& c,
                                                      const float* colmax, const float (*served)[4],
                                                      uint32_t* group_max, int unit) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint32_t* mine = group_max + (unit & 1) * 128;
#pragma unroll
  for (int j = 0; j < 4; ++j) atomicMax(mine + j * 32 + lane, __float_as_uint(colmax[j]));
  if (threadIdx.x < 128) group_max[((unit & 1) ^ 1) * 128 + threadIdx.x] = 0u;
  __syncthreads();
  float scale[4];
  uint32_t codes = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t code;
    scale[j] = MxBlockScaleDev(__uint_as_float(mine[j * 32 + lane]), &code);
    codes |= code << (8 * j);
  }
  const int64_t cols = d.cols;
  const int g0 = c.su * kMxGroupRows;  // tile row of the group
  if (w == 0) {
    StGlobal(d.mx_col_scales + ((c.r0 + g0) / kMxGroupRows) * cols + c.c0 + 4 * lane, codes);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int local_row = g0 + w + kSubRows * k;
    if (local_row >= c.rows) continue;
    const int64_t i = (c.r0 + local_row) * cols + c.c0 + 4 * lane;
    StGlobal(d.mx_col + i,
             E4m3x4(__fmul_rn(served[k][0], scale[0]), __fmul_rn(served[k][1], scale[1]),
                    __fmul_rn(served[k][2], scale[2]), __fmul_rn(served[k][3], scale[3])));
  }
}

// One sub-unit: warp w owns rows w, w + 8, ..., w + 8 (kRows - 1) of it, lane l their columns
// 4l .. 4l + 3. The kRows rows are independent chains, written stage by stage (all loads, all
// updates, all reductions, ...) so their latencies overlap.
template <int kKind, int kRows>
__device__ __forceinline__ void ComputeSubUnit(const TileParams& P, const StepScalarsDev& s,
                                               const StepDesc& d, const Cursor& c,
                                               const unsigned char* stage, float* buffer,
                                               uint32_t* group_max, ThreadAcc* acc, int* mx_units) {
  const int w = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const PolicyOf<kKind> pol(d);
  const int64_t cols = d.cols;
  const uint32_t outputs = d.outputs;
  constexpr int kSub = kSubRows * kRows;
  const int first_local = c.su * kSub + w;  // tile row of this warp's row 0

  const float* scales = reinterpret_cast<const float*>(stage + P.stage.scales);
  // The inputs of row k (g0 from the rank-ordered slots, dequantized moments, old master) from the
  // stage. A lambda, so the rare exact recomputation below reloads them instead of keeping them
  // in registers.
  auto load_row = [&](int k, float* g, float* m, float* v, float* p_old) {
    const int sr = w + kSubRows * k;  // row within the stage
    const bool fp32_slots = pol.slot_type == static_cast<uint8_t>(SlotType::kFp32);
    for (int q = 0; q < pol.num_slots; ++q) {
      const unsigned char* base = stage + P.stage.slots + q * P.stage.slot_stride;
      float x[4];
      if (fp32_slots) {
        const float4 t = reinterpret_cast<const float4*>(base + sr * 512)[lane];
        x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
      } else {
        const uint2 t = reinterpret_cast<const uint2*>(base + sr * 256)[lane];
        x[0] = DecodeBf16(t.x & 0xFFFFu), x[1] = DecodeBf16(t.x >> 16);
        x[2] = DecodeBf16(t.y & 0xFFFFu), x[3] = DecodeBf16(t.y >> 16);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) g[j] = q == 0 ? x[j] : __fadd_rn(g[j], x[j]);
    }
    const int msz = MomentSize(pol.m_type), vsz = MomentSize(pol.v_type);
    LoadMoment4(pol.m_type, stage + P.stage.m + sr * 128 * msz, lane, scales[sr], m);
    LoadMoment4(pol.v_type, stage + P.stage.v + sr * 128 * vsz, lane, scales[32 + sr], v);
    if (pol.master_type == static_cast<uint8_t>(MasterType::kFp32)) {
      const float4 x = reinterpret_cast<const float4*>(stage + P.stage.master + sr * 512)[lane];
      p_old[0] = x.x, p_old[1] = x.y, p_old[2] = x.z, p_old[3] = x.w;
    } else {
      const uint2 hi = reinterpret_cast<const uint2*>(stage + P.stage.master + sr * 256)[lane];
      const uint32_t h[4] = {hi.x & 0xFFFFu, hi.x >> 16, hi.y & 0xFFFFu, hi.y >> 16};
      if (pol.master_type == static_cast<uint8_t>(MasterType::kFp16)) {
#pragma unroll
        for (int j = 0; j < 4; ++j) p_old[j] = DecodeFp16Moment(h[j]);
      } else {
        const uint2 lo = reinterpret_cast<const uint2*>(stage + P.stage.remainder + sr * 256)[lane];
        const uint32_t q[4] = {lo.x & 0xFFFFu, lo.x >> 16, lo.y & 0xFFFFu, lo.y >> 16};
#pragma unroll
        for (int j = 0; j < 4; ++j) p_old[j] = MergeMaster(h[j], q[j]);
      }
    }
  };

  // The update, the stored master and the served values.
  float mn[kRows][4], vn[kRows][4], served[kRows][4], pn[kRows][4];
  uint32_t hi[kRows][4], low[kRows][4];
  // All elements through the branch-free sequences, then, only if one of them left their range,
  // all again through the exact library ones (one branch per thread instead of two per element).
  bool ok = true;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    float g[4], m[4], v[4], p_old[4];
    load_row(k, g, m, v, p_old);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      AdamwElementFast(s, g[j], m[j], v[j], p_old[j], &mn[k][j], &vn[k][j], &pn[k][j], &ok);
    }
  }
  if (!ok) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      float g[4], m[4], v[4], p_old[4];
      load_row(k, g, m, v, p_old);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        AdamwElement(s, g[j], m[j], v[j], p_old[j], &mn[k][j], &vn[k][j], &pn[k][j]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p = pn[k][j];
      const StoredMaster st = StoreMasterValue(pol.master_type, p);
      served[k][j] = st.served;
      hi[k][j] = st.hi;
      low[k][j] = st.low;
    }
  }

  // Chunk scales of the moments: one warp reduction per row and moment, all independent.
  float m_scale[kRows], v_scale[kRows];
  MomentScales<kRows>(pol.m_type, mn, m_scale);
  MomentScales<kRows>(pol.v_type, vn, v_scale);
  // Amaxes of the served values: per row (the thread's 4 values) and, for mxfp8 rowwise, per
  // 32-element block (8 lanes).
  float row_amax[kRows], block_amax[kRows];
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    row_amax[k] =
        AbsMaxDev(AbsMaxDev(served[k][0], served[k][1]), AbsMaxDev(served[k][2], served[k][3]));
    block_amax[k] = row_amax[k];
  }
  if (outputs & kOutMxRow) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      block_amax[k] = __uint_as_float(GroupMaxU<8>(__float_as_uint(block_amax[k])));
    }
  }
  // mxfp8 rowwise codes and data scales of all rows: the normal-amax formula, the definition
  // only when some amax is not normal.
  uint32_t mx_code[kRows];
  float mx_scale[kRows];
  if (outputs & kOutMxRow) {
    bool normal = true;
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const uint32_t bits = __float_as_uint(block_amax[k]);
      normal = normal & NormalBits(bits);
      mx_code[k] = MxScaleCodeNormalDev(bits);
      mx_scale[k] = __uint_as_float((254u - mx_code[k]) << 23);
    }
    if (!normal) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) mx_scale[k] = MxBlockScaleDev(block_amax[k], &mx_code[k]);
    }
  }
  // mxfp8 columnwise from registers (kRows == 4: a sub-unit is exactly one 32-row group of its
  // tile): this thread's column maxima over its rows.
  float colmax[4] = {0.0f, 0.0f, 0.0f, 0.0f};

  // The stores, output by output over all rows (one branch per output kind and sub-unit, the rows
  // straight-line code in between, so their address arithmetic and stores overlap). A sub-unit
  // whose rows are all inside the tile (all but a tile's last, short one) needs no row checks.
  auto store_rows = [&](auto full_tag) {
    constexpr bool kFull = decltype(full_tag)::value;
    bool valid[kRows];
    int64_t i[kRows];  // this thread's first element of each row
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int local_row = first_local + kSubRows * k;
      valid[k] = kFull || local_row < c.rows;
      i[k] = (c.r0 + local_row) * cols + c.c0 + 4 * lane;
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if (!valid[k]) continue;
      if (pol.master_type == static_cast<uint8_t>(MasterType::kFp32)) {
        StGlobal(static_cast<float*>(d.master) + i[k],
                 make_float4(served[k][0], served[k][1], served[k][2], served[k][3]));
      } else {
        StGlobal(static_cast<uint16_t*>(d.master) + i[k],
                 make_uint2(hi[k][0] | (hi[k][1] << 16), hi[k][2] | (hi[k][3] << 16)));
        if (pol.master_type == static_cast<uint8_t>(MasterType::kBf16Remainder)) {
          StGlobal(d.remainder + i[k],
                   make_uint2(low[k][0] | (low[k][1] << 16), low[k][2] | (low[k][3] << 16)));
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if (!valid[k]) continue;
      // Random words of stochastic rounding. The thread's 4 elements start at a multiple of 4
      // (cols is a multiple of 128 here, and a split tensor's index_offset is r0 * cols), so each
      // stochastic moment costs one Philox block (RandomWords4 checks it).
      uint32_t r0[4] = {0, 0, 0, 0}, r1[4] = {0, 0, 0, 0};
      const uint64_t index = d.index_offset + static_cast<uint64_t>(i[k]);
      if (pol.m_stochastic) {
        RandomWords4(s.seed, RoundingStream::kExpAvg, s.k, d.tensor_index, index, r0);
      }
      if (pol.v_stochastic) {
        RandomWords4(s.seed, RoundingStream::kExpAvgSq, s.k, d.tensor_index, index, r1);
      }
      StoreMoment4(pol.m_type, pol.m_stochastic, d.m, i[k], m_scale[k], mn[k], r0);
      StoreMoment4(pol.v_type, pol.v_stochastic, d.v, i[k], v_scale[k], vn[k], r1);
    }
    // Scaled moments' chunk scales are powers of two: their inverses are exact bit operations.
    if (lane == 0) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (!valid[k]) continue;
        const uint64_t chunk = static_cast<uint64_t>(i[k]) / kChunkElements;
        if (d.m_scale_inv != nullptr) StGlobal(d.m_scale_inv + chunk, Pow2ScaleInvDev(m_scale[k]));
        if (d.v_scale_inv != nullptr) StGlobal(d.v_scale_inv + chunk, Pow2ScaleInvDev(v_scale[k]));
      }
    }
    if (outputs & kOutFp32) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (!valid[k]) continue;
        StGlobal(d.out_fp32 + i[k],
                 make_float4(served[k][0], served[k][1], served[k][2], served[k][3]));
      }
    }
    if (outputs & kOutBf16) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (!valid[k]) continue;
        uint32_t b[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          b[j] = pol.master_type == static_cast<uint8_t>(MasterType::kBf16Remainder)
                     ? hi[k][j]
                     : Bf16(served[k][j]);
        }
        StGlobal(d.out_bf16 + i[k], make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16)));
      }
    }
    if (outputs & kOutFp8Scaled) {
      const float sc = *d.fp8_row_scale;
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (!valid[k]) continue;
        StGlobal(d.fp8_row + i[k],
                 E4m3x4(__fmul_rn(served[k][0], sc), __fmul_rn(served[k][1], sc),
                        __fmul_rn(served[k][2], sc), __fmul_rn(served[k][3], sc)));
      }
      if (c.tile == d.first_item && c.su == 0 && threadIdx.x == 0) {
        *d.fp8_row_scale_inv = ScaleInv(sc);
      }
    }
    if (outputs & kOutFp16) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (!valid[k]) continue;
        uint32_t h[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          h[j] = pol.master_type == static_cast<uint8_t>(MasterType::kFp16) ? hi[k][j]
                                                                            : Fp16(served[k][j]);
        }
        StGlobal(d.out_fp16 + i[k], make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16)));
      }
    }
    if (outputs & kOutMxRow) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (!valid[k]) continue;
        const float sc = mx_scale[k];
        StGlobal(d.mx_row + i[k], E4m3x4(__fmul_rn(served[k][0], sc), __fmul_rn(served[k][1], sc),
                                         __fmul_rn(served[k][2], sc), __fmul_rn(served[k][3], sc)));
      }
      if ((lane & 7) == 0) {
#pragma unroll
        for (int k = 0; k < kRows; ++k) {
          if (!valid[k]) continue;
          // Element i / 32 is this block's code: rows hold cols / 32 codes.
          StGlobalU8(d.mx_row_scales + static_cast<uint64_t>(i[k]) / 32, mx_code[k]);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if (!valid[k]) continue;
      acc->amax = AbsMaxDev(acc->amax, row_amax[k]);
    }
    if (outputs & kOutMxCol) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (!valid[k]) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if constexpr (kRows == 4) {
            colmax[j] = AbsMaxDev(colmax[j], served[k][j]);
          } else {
            acc->colmax[j] = AbsMaxDev(acc->colmax[j], served[k][j]);
          }
        }
      }
    }
    const uint32_t buffered =
        kRows == 4 ? (kOutBlockRow | kOutBlockCol) : (kOutMxCol | kOutBlockRow | kOutBlockCol);
    if (outputs & buffered) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (!valid[k]) continue;
        const int local_row = first_local + kSubRows * k;
        reinterpret_cast<float4*>(buffer + (local_row % P.buffer_rows) * kTileBufStride)[lane] =
            make_float4(served[k][0], served[k][1], served[k][2], served[k][3]);
      }
    }
  };
  if (c.su * kSub + kSub <= c.rows) {
    store_rows(std::true_type{});
  } else {
    store_rows(std::false_type{});
  }
  if constexpr (kRows == 4) {
    if (outputs & kOutMxCol) MxColumnFromRegisters(d, c, colmax, served, group_max, (*mx_units)++);
  }
}

// ---- epilogues ---------------------------------------------------------------------------------

// mxfp8 columnwise of the 32-row group that starts at tile row g0 (its rows are in the buffer).
__device__ void MxColumnGroup(const TileParams& P, const StepDesc& d, const Cursor& c, int g0,
                              unsigned char* smem, float* buffer, ThreadAcc* acc) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint32_t* colmax = reinterpret_cast<uint32_t*>(smem + P.colmax_offset);  // [8][128]
  float* colscale = reinterpret_cast<float*>(smem + P.colscale_offset);    // [128]
  reinterpret_cast<uint4*>(colmax + w * 128)[lane] =
      make_uint4(__float_as_uint(acc->colmax[0]), __float_as_uint(acc->colmax[1]),
                 __float_as_uint(acc->colmax[2]), __float_as_uint(acc->colmax[3]));
#pragma unroll
  for (int j = 0; j < 4; ++j) acc->colmax[j] = 0.0f;
  __syncthreads();
  const int group_rows = min(kMxGroupRows, c.rows - g0);
  if (threadIdx.x < 128) {
    uint32_t bits = 0;
    for (int k = 0; k < 8; ++k) bits = max(bits, colmax[k * 128 + threadIdx.x]);
    const uint32_t code = MxScaleCodeDev(AmaxFromBits(bits));
    colscale[threadIdx.x] = MxDataScaleDev(code);
    StGlobalU8(d.mx_col_scales + ((c.r0 + g0) / kMxGroupRows) * d.cols + c.c0 + threadIdx.x, code);
  }
  __syncthreads();
  const float4 sc = reinterpret_cast<const float4*>(colscale)[lane];
  uint8_t* out = d.mx_col;
  const int64_t cols = d.cols;
  for (int rr = w; rr < group_rows; rr += 8) {
    const float4 x = reinterpret_cast<const float4*>(buffer + ((g0 + rr) % P.buffer_rows) *
                                                                  kTileBufStride)[lane];
    const int64_t i = (c.r0 + g0 + rr) * cols + c.c0 + 4 * lane;
    StGlobal(out + i, E4m3x4(__fmul_rn(x.x, sc.x), __fmul_rn(x.y, sc.y), __fmul_rn(x.z, sc.z),
                             __fmul_rn(x.w, sc.w)));
  }
}

// The tile's amax over the block (in every thread).
__device__ uint32_t BlockMaxU(uint32_t x, uint32_t* reduce) {
  x = WarpMaxU(x);
  if ((threadIdx.x & 31) == 0) reduce[threadIdx.x >> 5] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t out = 0;
    for (int k = 0; k < kThreads / 32; ++k) out = max(out, reduce[k]);
    reduce[8] = out;
  }
  __syncthreads();
  return reduce[8];
}

// fp8_block of a whole tile from the buffer (128 rows kept): both directions.
__device__ void BlockTile(const StepDesc& d, const Cursor& c, uint32_t tile_bits, float* buffer) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float scale = Pow2ScaleDev(AmaxFromBits(tile_bits), kE4m3Max);
  const int64_t brows = (d.rows + kTileRows - 1) / kTileRows, bcols = d.cols / kTileCols;
  const int64_t br = c.r0 / kTileRows, bc = c.c0 / kTileCols;
  if (d.outputs & kOutBlockRow) {
    for (int rr = w; rr < c.rows; rr += 8) {
      const float4 x = reinterpret_cast<const float4*>(buffer + rr * kTileBufStride)[lane];
      *reinterpret_cast<uint32_t*>(d.block_row + (c.r0 + rr) * d.cols + c.c0 + 4 * lane) =
          E4m3x4(__fmul_rn(x.x, scale), __fmul_rn(x.y, scale), __fmul_rn(x.z, scale),
                 __fmul_rn(x.w, scale));
    }
    if (threadIdx.x == 0) d.block_row_scales[br * bcols + bc] = ScaleInv(scale);
  }
  if (d.outputs & kOutBlockCol) {
    // Transposed: column cc of the tile is a run of rows in the [cols, rows] output; lane l
    // casts rows l, l + 32, l + 64, l + 96 of it (4-way bank conflicts at most).
    for (int cc = w; cc < kTileCols; cc += 8) {
      uint8_t* out = d.block_col + (c.c0 + cc) * d.rows + c.r0;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int rr = lane + 32 * q;
        if (rr < c.rows) {
          out[rr] = static_cast<uint8_t>(E4m3(__fmul_rn(buffer[rr * kTileBufStride + cc], scale)));
        }
      }
    }
    if (threadIdx.x == 0) d.block_col_scales[bc * brows + br] = ScaleInv(scale);
  }
}

// Adds `items` finished items with master amax bits `bits` to the tensor's counters; the call that
// completes the tensor turns the amax into the fp8_tensor scale and the amax output, and resets
// the counters for the next launch. One thread calls it.
__device__ void FinishItems(const StepDesc& d, uint32_t bits, uint32_t items) {
  atomicMax(d.amax_bits, bits);
  __threadfence();
  const uint32_t done = atomicAdd(d.items_done, items) + items;
  if (done != static_cast<uint32_t>(d.items)) return;
  __threadfence();
  const float amax = AmaxFromBits(atomicOr(d.amax_bits, 0u));
  if (d.fp8_tensor_scale != nullptr) {
    *d.fp8_tensor_scale = Fp8TensorScale(amax, *d.fp8_tensor_scale);
  }
  if (d.master_amax != nullptr) *d.master_amax = amax;
  *d.amax_bits = 0;
  *d.items_done = 0;
}

// Resident blocks the compiler plans registers for: three for one row per warp (the benchmark's
// best on an H200 before rows per warp existed), two otherwise.
template <int kKind, int kRows>
__global__ void __launch_bounds__(kThreads, (kKind != kAnyPolicy && kRows == 1) ? 3 : 2)
    TileKernel(const TileParams P) {
  StepScalarsDev s;
  if (!DecidedScalars(P.s, &s)) return;
  extern __shared__ __align__(16) unsigned char smem[];
  // The consumer's tensor descriptor, copied once per tile: reads of it cannot alias the global
  // stores of the step, so none of them waits on those. Two copies (by tile parity): threads are
  // at most one sub-unit apart, so a fast thread copies the next tile's while a slow one may still
  // read this tile's.
  __shared__ StepDesc descs[2];
  float* buffer = reinterpret_cast<float*>(smem + P.buffer_offset);
  uint32_t* reduce = reinterpret_cast<uint32_t*>(smem + P.reduce_offset);
  const int S = P.stages;
  constexpr int kSub = kSubRows * kRows;

  // The pipeline: sub-unit t lives in slot t % S. Before computing t, its group is complete
  // (S - 2 newer ones may still fly) and one barrier shows every thread is past computing t - 1,
  // whose slot then receives t + S - 1.
  Cursor prod, cons;
  OpenTile<kRows>(P, blockIdx.x, &prod);
  cons = prod;
  for (int k = 0; k < S - 1; ++k) {
    if (prod.tile < P.num_tiles) {
      IssueSubUnit<kKind, kRows>(P, prod, smem + k * P.stage.bytes);
      Advance<kRows>(P, &prod);
    }
    CpAsyncCommit();
  }
  ThreadAcc acc{0.0f, {0.0f, 0.0f, 0.0f, 0.0f}};
  // kRows == 4's mxfp8 columnwise maxima (MxColumnFromRegisters): both buffers start cleared (the
  // first barrier below orders this before any use).
  uint32_t* group_max = reinterpret_cast<uint32_t*>(smem + P.colmax_offset);
  int mx_units = 0;
  if (kRows == 4) group_max[threadIdx.x] = 0u;
  int slot = 0;
  int parity = 0;
  while (cons.tile < P.num_tiles) {
    StepDesc& desc = descs[parity];
    if (cons.su == 0 && threadIdx.x < sizeof(StepDesc) / 8) {
      reinterpret_cast<uint64_t*>(&desc)[threadIdx.x] =
          reinterpret_cast<const uint64_t*>(P.descs + cons.desc)[threadIdx.x];
    }
    CpAsyncWait(S - 2);
    __syncthreads();
    const int next = slot == 0 ? S - 1 : slot - 1;  // (slot + S - 1) % S: computed last time
    if (prod.tile < P.num_tiles) {
      IssueSubUnit<kKind, kRows>(P, prod, smem + next * P.stage.bytes);
      Advance<kRows>(P, &prod);
    }
    CpAsyncCommit();
    ComputeSubUnit<kKind, kRows>(P, s, desc, cons, smem + slot * P.stage.bytes, buffer, group_max,
                                 &acc, &mx_units);
    const uint32_t outputs = desc.outputs;
    const int row_end = (cons.su + 1) * kSub;  // tile rows done so far
    const bool tile_done = cons.su + 1 == cons.nsub;
    if (kRows != 4 && (outputs & kOutMxCol) && (row_end % kMxGroupRows == 0 || tile_done)) {
      MxColumnGroup(P, desc, cons, (row_end - 1) / kMxGroupRows * kMxGroupRows, smem, buffer, &acc);
      __syncthreads();  // the buffer's rows are free again
    }
    if (tile_done) {
      if (outputs & (kOutBlockRow | kOutBlockCol | kNeedAmax)) {
        const uint32_t bits = BlockMaxU(__float_as_uint(acc.amax), reduce);
        if (outputs & (kOutBlockRow | kOutBlockCol)) BlockTile(desc, cons, bits, buffer);
        if ((outputs & kNeedAmax) && threadIdx.x == 0) FinishItems(desc, bits, 1);
        __syncthreads();
      }
      acc.amax = 0.0f;
      parity ^= 1;
    }
    Advance<kRows>(P, &cons);
    slot = slot + 1 == S ? 0 : slot + 1;
  }
  CpAsyncWait(0);
}

// ---- flat path ---------------------------------------------------------------------------------

struct FlatParams {
  const StepDesc* descs;
  const int64_t* starts;
  int num_descs;
  int64_t num_chunks;
  StepScalarsDev s;
};

__device__ __forceinline__ float LoadMomentAt(uint8_t type, const void* base, int64_t i,
                                              float s_inv) {
  if (type == static_cast<uint8_t>(MomentType::kFp32)) return static_cast<const float*>(base)[i];
  if (type == static_cast<uint8_t>(MomentType::kBf16)) {
    return DecodeBf16(static_cast<const uint16_t*>(base)[i]);
  }
  if (type == static_cast<uint8_t>(MomentType::kFp16)) {
    return __fmul_rn(DecodeFp16Moment(static_cast<const uint16_t*>(base)[i]), s_inv);
  }
  return __fmul_rn(DecodeE4m3(static_cast<const uint8_t*>(base)[i]), s_inv);
}

// The chunk's moment codes: y[q] is element base + lane + 32 q (valid when < end).
__device__ __forceinline__ void StoreMomentFlat(uint8_t type, bool stochastic, void* base,
                                                float* scale_inv, int64_t chunk, int64_t first,
                                                int64_t end, const float* y, const uint32_t* r) {
  const int lane = threadIdx.x & 31;
  float scale = 1.0f;
  if (type == static_cast<uint8_t>(MomentType::kFp16) ||
      type == static_cast<uint8_t>(MomentType::kFp8)) {
    uint32_t bits = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (first + lane + 32 * q < end) bits = max(bits, AbsBitsDev(y[q]));
    }
    bits = WarpMaxU(bits);
    scale = Pow2ScaleDev(__uint_as_float(bits), MomentTop(type));
    if (lane == 0) scale_inv[chunk] = __fdiv_rn(1.0f, scale);
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int64_t i = first + lane + 32 * q;
    if (i >= end) continue;
    if (type == static_cast<uint8_t>(MomentType::kFp32)) {
      static_cast<float*>(base)[i] = y[q];
    } else if (type == static_cast<uint8_t>(MomentType::kFp8)) {
      static_cast<uint8_t*>(base)[i] =
          static_cast<uint8_t>(EncodeMoment(type, y[q], scale, stochastic, r[q]));
    } else {
      static_cast<uint16_t*>(base)[i] =
          static_cast<uint16_t>(EncodeMoment(type, y[q], scale, stochastic, r[q]));
    }
  }
}

__global__ void __launch_bounds__(kThreads) FlatKernel(const FlatParams P) {
  StepScalarsDev s;
  if (!DecidedScalars(P.s, &s)) return;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  int cur = -1;
  uint32_t acc_bits = 0, acc_items = 0;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
       item < P.num_chunks; item += warps) {
    const int di = FindOwner(P.starts, P.num_descs, item);
    const StepDesc& d = P.descs[di];
    if (di != cur) {
      if (cur >= 0 && (P.descs[cur].outputs & kNeedAmax) && lane == 0) {
        FinishItems(P.descs[cur], acc_bits, acc_items);
      }
      cur = di;
      acc_bits = 0;
      acc_items = 0;
    }
    const int64_t chunk = item - d.first_item;
    const int64_t first = chunk * kChunkElements;
    const int64_t end = min(first + kChunkElements, d.rows * d.cols);
    const float m_sinv = d.m_scale_inv != nullptr ? d.m_scale_inv[chunk] : 1.0f;
    const float v_sinv = d.v_scale_inv != nullptr ? d.v_scale_inv[chunk] : 1.0f;
    float mn[4], vn[4], served[4];
    uint32_t r0[4] = {0, 0, 0, 0}, r1[4] = {0, 0, 0, 0};
    StoredMaster st[4];
    uint32_t bits = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int64_t i = first + lane + 32 * q;
      served[q] = 0.0f;
      mn[q] = vn[q] = 0.0f;
      if (i >= end) continue;
      float g0;
      if (d.slot_type == static_cast<uint8_t>(SlotType::kFp32)) {
        g0 = static_cast<const float*>(d.slots[0])[i];
        for (int k = 1; k < d.num_slots; ++k) {
          g0 = __fadd_rn(g0, static_cast<const float*>(d.slots[k])[i]);
        }
      } else {
        g0 = DecodeBf16(static_cast<const uint16_t*>(d.slots[0])[i]);
        for (int k = 1; k < d.num_slots; ++k) {
          g0 = __fadd_rn(g0, DecodeBf16(static_cast<const uint16_t*>(d.slots[k])[i]));
        }
      }
      const float m = LoadMomentAt(d.m_type, d.m, i, m_sinv);
      const float v = LoadMomentAt(d.v_type, d.v, i, v_sinv);
      float p_old;
      if (d.master_type == static_cast<uint8_t>(MasterType::kFp32)) {
        p_old = static_cast<const float*>(d.master)[i];
      } else if (d.master_type == static_cast<uint8_t>(MasterType::kFp16)) {
        p_old = DecodeFp16Moment(static_cast<const uint16_t*>(d.master)[i]);
      } else {
        p_old = MergeMaster(static_cast<const uint16_t*>(d.master)[i],
                            static_cast<uint16_t>(d.remainder[i]));
      }
      const uint64_t index = d.index_offset + static_cast<uint64_t>(i);
      if (d.m_stochastic) {
        r0[q] = RandomWord(s.seed, RoundingStream::kExpAvg, s.k, d.tensor_index, index);
      }
      if (d.v_stochastic) {
        r1[q] = RandomWord(s.seed, RoundingStream::kExpAvgSq, s.k, d.tensor_index, index);
      }
      float p;
      AdamwElement(s, g0, m, v, p_old, &mn[q], &vn[q], &p);
      st[q] = StoreMasterValue(d.master_type, p);
      served[q] = st[q].served;
      if (d.master_type == static_cast<uint8_t>(MasterType::kFp32)) {
        static_cast<float*>(d.master)[i] = p;
      } else {
        static_cast<uint16_t*>(d.master)[i] = static_cast<uint16_t>(st[q].hi);
        if (d.master_type == static_cast<uint8_t>(MasterType::kBf16Remainder)) {
          d.remainder[i] = static_cast<int16_t>(static_cast<uint16_t>(st[q].low));
        }
      }
      if (d.outputs & kOutFp32) d.out_fp32[i] = served[q];
      if (d.outputs & kOutBf16) {
        d.out_bf16[i] = static_cast<uint16_t>(
            d.master_type == static_cast<uint8_t>(MasterType::kBf16Remainder) ? st[q].hi
                                                                              : Bf16(served[q]));
      }
      if (d.outputs & kOutFp16) {
        d.out_fp16[i] = static_cast<uint16_t>(
            d.master_type == static_cast<uint8_t>(MasterType::kFp16) ? st[q].hi : Fp16(served[q]));
      }
      bits = max(bits, AbsBitsDev(served[q]));
    }
    StoreMomentFlat(d.m_type, d.m_stochastic, d.m, d.m_scale_inv, chunk, first, end, mn, r0);
    StoreMomentFlat(d.v_type, d.v_stochastic, d.v, d.v_scale_inv, chunk, first, end, vn, r1);
    acc_bits = max(acc_bits, WarpMaxU(bits));
    ++acc_items;
  }
  if (cur >= 0 && (P.descs[cur].outputs & kNeedAmax) && lane == 0) {
    FinishItems(P.descs[cur], acc_bits, acc_items);
  }
}

// ---- host side ---------------------------------------------------------------------------------

StepScalarsDev DeviceScalars(const CudaStepScalars& s) {
  StepScalarsDev d;
  d.grad_scale = s.grad_scale;
  d.clip = s.clip;
  d.beta1 = s.adamw.beta1;
  d.beta2 = s.adamw.beta2;
  d.c1 = s.adamw.c1;
  d.c2 = s.adamw.c2;
  d.eps = s.adamw.eps;
  d.decay = s.adamw.decay;
  d.neg_step_size = -s.adamw.step_size;
  d.bc2 = s.adamw.bc2;
  d.seed = s.seed;
  d.k = s.k;
  d.clip_active = s.clip != 1.0f;
  d.d_clip = s.d_clip;
  d.d_all_finite = s.d_all_finite;
  return d;
}

uint32_t Align16(uint32_t x) { return (x + 15u) & ~15u; }

KStatus Multiprocessors(int* sms) {
  int device = 0;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  PARAMD_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device));
  return KStatus::Ok();
}

// The tile kernels compiled: per policy kind, rows per warp in a sub-unit (the generic kernel
// only with one: it needs many more registers).
using TileKernelFn = void (*)(TileParams);
TileKernelFn TileKernelFor(int kind, int rows) {
  if (kind == kIssuePolicy) {
    return rows == 4   ? TileKernel<kIssuePolicy, 4>
           : rows == 1 ? TileKernel<kIssuePolicy, 1>
                       : TileKernel<kIssuePolicy, 2>;
  }
  if (kind == kIssueFp32GradPolicy) {
    return rows == 4   ? TileKernel<kIssueFp32GradPolicy, 4>
           : rows == 1 ? TileKernel<kIssueFp32GradPolicy, 1>
                       : TileKernel<kIssueFp32GradPolicy, 2>;
  }
  if (kind == kFp32Policy) {
    return rows == 4   ? TileKernel<kFp32Policy, 4>
           : rows == 1 ? TileKernel<kFp32Policy, 1>
                       : TileKernel<kFp32Policy, 2>;
  }
  return TileKernel<kAnyPolicy, 1>;
}

KStatus LaunchTiles(const CudaStepPlan& plan, const StepScalarsDev& s, const CudaStepTuning& tuning,
                    cudaStream_t stream) {
  const CudaStepPlan::TileShape& shape = plan.tile_shape();
  const auto* base = static_cast<const unsigned char*>(plan.d_workspace());
  TileParams P{};
  P.descs = reinterpret_cast<const StepDesc*>(base + plan.layout().tile_descs);
  P.starts = reinterpret_cast<const int64_t*>(base + plan.layout().tile_starts);
  P.num_descs = static_cast<int>(plan.tile_path_tensors());
  P.num_tiles = plan.num_tiles();
  P.s = s;
  const int kind = tuning.generic ? int{kAnyPolicy} : shape.policy_kind;
  // Rows per warp: the benchmark's best on an H200 (issue policy 4 with either gradient, fp32
  // policy 2).
  const int rows =
      kind == kAnyPolicy ? 1
      : (tuning.rows_per_warp == 1 || tuning.rows_per_warp == 2 || tuning.rows_per_warp == 4)
          ? tuning.rows_per_warp
          : (kind == kFp32Policy ? 2 : 4);
  const TileKernelFn kernel = TileKernelFor(kind, rows);
  // A stage: each input's 8 * rows x 128 elements at the widest size any tensor of the launch
  // needs, and the two moments' chunk scales of those rows.
  StageLayout& L = P.stage;
  const uint32_t elems = kSubRows * rows * kTileCols;
  uint32_t at = 0;
  L.master = at, at += Align16(elems * shape.master_bytes);
  L.remainder = at, at += Align16(elems * shape.remainder_bytes);
  L.m = at, at += Align16(elems * shape.m_bytes);
  L.v = at, at += Align16(elems * shape.v_bytes);
  L.slot_stride = Align16(elems * shape.slot_bytes);
  L.slots = at, at += L.slot_stride * shape.slots;
  L.scales = at, at += kScaleBytes;
  L.bytes = Align16(at);
  // With 4 rows per warp, mxfp8 columnwise runs from registers: only fp8_block needs the buffer.
  const int buffer_rows = rows == 4 && shape.buffer_rows == kMxGroupRows ? 0 : shape.buffer_rows;
  P.buffer_rows = buffer_rows == 0 ? 1 : buffer_rows;
  const uint32_t fixed_bytes = Align16(buffer_rows * kTileBufStride * 4) +
                               8 * 128 * 4 /* colmax */ + 128 * 4 /* colscale */ + 64 +
                               static_cast<uint32_t>(sizeof(StepDesc)) + 1024 /* reserved */;
  // Resident blocks per multiprocessor: as many as the kernel's registers allow (at most 3),
  // then as many pipeline stages as fit in each block's share of shared memory (at most 8).
  cudaFuncAttributes attr{};
  PARAMD_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, kernel));
  const int by_registers = 65536 / (std::max(attr.numRegs, 1) * kThreads);
  const int blocks_per_sm =
      tuning.blocks_per_sm > 0 ? tuning.blocks_per_sm : std::clamp(by_registers, 1, 3);
  const uint32_t share = 228u * 1024u / blocks_per_sm;
  const uint32_t budget = std::min<uint32_t>(227u * 1024u, share) - std::min(share, fixed_bytes);
  // A requested depth is cut to what fits in one block's shared memory.
  const uint32_t most = (227u * 1024u - std::min(227u * 1024u, fixed_bytes)) / L.bytes;
  int stages = tuning.stages > 0 ? std::min<int>(tuning.stages, static_cast<int>(most))
                                 : static_cast<int>(budget / L.bytes);
  stages = std::clamp(stages, 2, 8);
  P.stages = stages;
  uint32_t smem = stages * L.bytes;
  P.buffer_offset = smem, smem += Align16(buffer_rows * kTileBufStride * 4);
  P.colmax_offset = smem, smem += 8 * 128 * 4;
  P.colscale_offset = smem, smem += 128 * 4;
  P.reduce_offset = smem, smem += 64;
  if (smem + sizeof(StepDesc) > 227u * 1024u) {
    return KStatus(Code::kInvalidArgument,
                   "FusedStepCuda: a pipeline stage of " + std::to_string(L.bytes) + " bytes (" +
                       std::to_string(shape.slots) + " slots) does not fit twice in shared memory");
  }
  int sms = 0;
  if (KStatus st = Multiprocessors(&sms); !st.ok()) return st;
  PARAMD_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int64_t grid = std::min<int64_t>(P.num_tiles, static_cast<int64_t>(sms) * blocks_per_sm);
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(P);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return KStatus::Ok();
}

KStatus LaunchFlat(const CudaStepPlan& plan, const StepScalarsDev& s, cudaStream_t stream) {
  const auto* base = static_cast<const unsigned char*>(plan.d_workspace());
  FlatParams P{};
  P.descs = reinterpret_cast<const StepDesc*>(base + plan.layout().flat_descs);
  P.starts = reinterpret_cast<const int64_t*>(base + plan.layout().flat_starts);
  P.num_descs = static_cast<int>(plan.flat_path_tensors());
  P.num_chunks = plan.num_flat_chunks();
  P.s = s;
  int sms = 0;
  if (KStatus st = Multiprocessors(&sms); !st.ok()) return st;
  const int64_t warps_needed = P.num_chunks;
  const int64_t grid = std::min<int64_t>((warps_needed + 7) / 8, static_cast<int64_t>(sms) * 8);
  FlatKernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(P);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return KStatus::Ok();
}

}  // namespace
}  // namespace paramd::kernels::cuda_internal

namespace paramd::kernels {

KStatus FusedStepCuda(const CudaStepPlan& plan, const CudaStepScalars& scalars, cudaStream_t stream,
                      const CudaStepTuning& tuning) {
  if (plan.d_workspace() == nullptr) {
    return KStatus(Code::kInvalidArgument, "FusedStepCuda: the plan is not bound");
  }
  const cuda_internal::StepScalarsDev s = cuda_internal::DeviceScalars(scalars);
  if (plan.num_tiles() > 0) {
    if (KStatus st = cuda_internal::LaunchTiles(plan, s, tuning, stream); !st.ok()) return st;
  }
  if (plan.num_flat_chunks() > 0) {
    if (KStatus st = cuda_internal::LaunchFlat(plan, s, stream); !st.ok()) return st;
  }
  if (plan.second_pass_outputs() > 0) {
    const auto* base = static_cast<const unsigned char*>(plan.d_workspace());
    return cuda_internal::LaunchServe(
        reinterpret_cast<const cuda_internal::ServeDesc*>(base + plan.layout().serve_descs),
        reinterpret_cast<const int64_t*>(base + plan.layout().serve_starts),
        static_cast<int>(plan.second_pass_outputs()), plan.num_serve_tiles(), stream,
        scalars.d_all_finite);
  }
  return KStatus::Ok();
}

}  // namespace paramd::kernels
