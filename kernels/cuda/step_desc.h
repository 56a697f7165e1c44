// Internal to kernels/cuda: the descriptors the host (step_plan.cc, compiled by g++) lays out in
// the device workspace and the kernels (*.cu) read. Plain data, the same layout on both sides.
#pragma once

#include <cstdint>

namespace paramd::kernels::cuda_internal {

inline constexpr int kThreads = 256;   // threads of every thread block here (8 warps)
inline constexpr int kTileRows = 128;  // a tile of the tile path: 128 x 128 elements
inline constexpr int kTileCols = 128;
inline constexpr int kSubRows = 8;       // a sub-unit: 8 rows x 128 columns, one row per warp
inline constexpr int kMxGroupRows = 32;  // mxfp8 columnwise blocks: 32 rows
// Floats per row of the new-master tile in shared memory: rows stay 16-byte aligned (float4
// accesses along a row, conflict-free); column walks see 4-way bank conflicts at most.
inline constexpr int kTileBufStride = 132;
inline constexpr int kGradWarps = 8;  // warps per thread block of the grad check

// Tile kernels compiled for one policy (CudaStepPlan::TileShape::policy_kind); kAnyPolicy reads
// it from the descriptors.
enum PolicyKind : int {
  kAnyPolicy = 0,
  kIssuePolicy = 1,  // fp32 master, one bf16 slot, fp8 exp_avg, fp16 exp_avg_sq, both nearest
  kFp32Policy = 2,   // fp32 master, one fp32 slot, fp32 moments
  // kIssuePolicy's states with one fp32 slot: a trainer whose parameters are fp32 (bf16 autocast
  // over fp32 weights) pushes fp32 gradients.
  kIssueFp32GradPolicy = 3,
};

// In-pass outputs of a tile-path or flat-path tensor (StepDesc::outputs).
enum OutputBits : uint32_t {
  kOutFp32 = 1u << 0,
  kOutBf16 = 1u << 1,
  kOutFp16 = 1u << 2,
  kOutBlockRow = 1u << 3,
  kOutBlockCol = 1u << 4,
  kOutMxRow = 1u << 5,
  kOutMxCol = 1u << 6,
  kNeedAmax = 1u << 7,  // the last tile turns the master amax into the fp8_tensor scale / amax out
  // fp8_delayed rowwise: E4M3 of served x a scale known before the step (its amax history's), so it
  // needs no second read of the master (tile path only).
  kOutFp8Scaled = 1u << 8,
};

// One tensor of pass 1 (or 1'). Enum fields hold the values of kernels/fused_step.h's enums.
struct StepDesc {
  int64_t rows, cols;
  int64_t first_item;  // first tile (tile path) or chunk (flat path) in the launch's numbering
  int64_t items;       // its tiles or chunks
  const void* const* slots;  // device array of num_slots device pointers
  const void* slot0;         // slots[0], saving the tile path a dependent load
  int32_t num_slots;
  uint32_t tensor_index;
  uint32_t outputs;  // OutputBits
  uint8_t slot_type, master_type, m_type, v_type, m_stochastic, v_stochastic, pad0, pad1;
  uint64_t index_offset;  // RngStream::index_offset
  void* master;
  int16_t* remainder;
  void* m;
  float* m_scale_inv;
  void* v;
  float* v_scale_inv;
  float* out_fp32;
  uint16_t* out_bf16;
  uint16_t* out_fp16;
  uint8_t* block_row;
  float* block_row_scales;
  uint8_t* block_col;
  float* block_col_scales;
  uint8_t* mx_row;
  uint8_t* mx_row_scales;
  uint8_t* mx_col;
  uint8_t* mx_col_scales;
  uint8_t* fp8_row;            // kOutFp8Scaled: codes
  float* fp8_row_scale_inv;    // kOutFp8Scaled: 1 / scale, written by the tensor's first tile
  const float* fp8_row_scale;  // kOutFp8Scaled: the scale (device scalar)
  float* fp8_tensor_scale;     // in/out, with kNeedAmax
  float* master_amax;          // out, optional
  uint32_t* amax_bits;         // workspace counter pair: zero between launches
  uint32_t* items_done;
};

// One output of the serve kernel (pass 2 or ServeQuantizeCuda): 128 x 128 tiles.
struct ServeDesc {
  int64_t rows, cols;
  int64_t first_tile;
  int64_t tile_cols;  // ceil(cols / 128)
  const void* master;
  const int16_t* remainder;
  const float* tensor_scale;
  void* data;
  void* scales;
  uint8_t master_type, recipe, direction, pad[5];
};

// One tensor of the grad check: its norm blocks (128 rows) are each split into `sub_blocks`
// thread blocks (a power of two) of kGradWarps warps; warp w of sub-block b owns the chunks
// c = b * kGradWarps + w (mod kGradWarps * sub_blocks) of its norm block.
struct GradDesc {
  int64_t rows, cols;
  int64_t first_item;   // first (norm block, sub-block) item
  int64_t first_block;  // first norm block in the plan's numbering
  const void* const* slots;
  int32_t num_slots;
  int32_t sub_blocks;
  uint8_t slot_type, pad[7];
};

// Index of the last entry of starts[0, n) that is <= item (starts ascending, starts[0] == 0).
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline int
    FindOwner(const int64_t* starts, int n, int64_t item) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (starts[mid] <= item) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace paramd::kernels::cuda_internal
