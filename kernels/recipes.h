// Serve recipes (DESIGN.md §3): an FP32 master tensor [rows, cols] (row-major) quantized into the
// bytes and scales a trainer's next GEMM reads, for every recipe x direction. The CPU backend
// implements this header in kernels/cpu/recipes_*.cc; paramd::reference has an independent float64
// model of every recipe that the tests compare against, bit for bit.
//
// Work is done per ROW RANGE [row_begin, row_end): row_begin a multiple of kServePanelRows (128)
// and row_end a multiple of it or `rows`. A call writes only that range's data and scales, so the
// fused step can quantize each 128-row panel right after updating it, while it is in cache, and
// disjoint ranges can run concurrently on several threads. Ranges composed over a tensor give the
// same bits as one call over the whole of it.
//
// Layouts (all row-major, unpadded, unswizzled; sizes from ServeLayout). Columnwise data is the
// transpose [cols, rows] of the rowwise data, except mxfp8's, which is [rows, cols] in both:
//   recipe        rowwise scales                     columnwise scales
//   fp32/bf16/fp16  none                               none
//   fp8_tensor,     1 FP32 scale_inv                   1 FP32 scale_inv
//   fp8_delayed
//   fp8_block       FP32 scale_inv                     FP32 scale_inv [ceil(cols/128),
//                   [ceil(rows/128), ceil(cols/128)]   ceil(rows/128)]: the transpose
//   mxfp8           E8M0 [rows, ceil(cols/32)]         E8M0 [ceil(rows/32), cols]
// Per recipe:
//   fp32, bf16, fp16: plain casts (Bf16FromFloat, Fp16FromFloat of kernels/formats.h).
//   fp8_tensor / fp8_delayed: q = E4M3(x * scale) (one FP32 multiply) with the tensor's scale from
//     NextFp8TensorScale / NextFp8DelayedScale; the stored scale is scale_inv = 1 / scale.
//   fp8_block: 128x128 blocks (edge blocks partial), scale = Pow2Scale(amax, 448), q =
//     E4M3(x * scale), stored scale_inv = 1 / scale (exact).
//   mxfp8: 32-element blocks along a row (rowwise) or a column (columnwise), both from the master;
//     code = MxScaleCode(amax) with a partial last block zero-padded for its amax (i.e. its amax
//     is that of the elements present), q = E4M3(x * MxDataScale(code)); a NaN or inf block gets
//     code 255 and its data cast with scale 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/fused_step.h"  // CpuPath
#include "kernels/status.h"

namespace paramd::kernels {

enum class Recipe : uint8_t { kFp32, kBf16, kFp16, kFp8Tensor, kFp8Delayed, kFp8Block, kMxfp8 };
enum class Direction : uint8_t { kRowwise, kColumnwise };

// How a recipe's scales are laid over its data.
enum class ScaleKind : uint8_t {
  kNone,      // plain casts
  kTensor,    // one FP32 scale_inv for the tensor
  kBlock128,  // one FP32 scale_inv per 128x128 block
  kMx32,      // one E8M0 code per 32 elements along the direction
};

// The recipes, once. Indexed by the enum's value.
struct RecipeInfo {
  Recipe recipe;
  const char* name;  // as the config and the protocol spell it
  DType data_dtype;
  DType scale_dtype;  // meaningful when scale_kind != kNone
  ScaleKind scale_kind;
};
inline constexpr RecipeInfo kRecipes[] = {
    {Recipe::kFp32, "fp32", DType::kFp32, DType::kFp32, ScaleKind::kNone},
    {Recipe::kBf16, "bf16", DType::kBf16, DType::kFp32, ScaleKind::kNone},
    {Recipe::kFp16, "fp16", DType::kFp16, DType::kFp32, ScaleKind::kNone},
    {Recipe::kFp8Tensor, "fp8_tensor", DType::kE4m3, DType::kFp32, ScaleKind::kTensor},
    {Recipe::kFp8Delayed, "fp8_delayed", DType::kE4m3, DType::kFp32, ScaleKind::kTensor},
    {Recipe::kFp8Block, "fp8_block", DType::kE4m3, DType::kFp32, ScaleKind::kBlock128},
    {Recipe::kMxfp8, "mxfp8", DType::kE4m3, DType::kE8m0, ScaleKind::kMx32},
};
inline constexpr int kNumRecipes = static_cast<int>(sizeof(kRecipes) / sizeof(kRecipes[0]));

constexpr const RecipeInfo& RecipeInfoOf(Recipe r) { return kRecipes[static_cast<int>(r)]; }
constexpr const char* RecipeName(Recipe r) { return RecipeInfoOf(r).name; }
constexpr std::optional<Recipe> RecipeFromName(std::string_view name) {
  for (const RecipeInfo& info : kRecipes) {
    if (name == info.name) return info.recipe;
  }
  return std::nullopt;
}
constexpr const char* DirectionName(Direction d) {
  return d == Direction::kRowwise ? "rowwise" : "columnwise";
}
constexpr std::optional<Direction> DirectionFromName(std::string_view name) {
  if (name == "rowwise") return Direction::kRowwise;
  if (name == "columnwise") return Direction::kColumnwise;
  return std::nullopt;
}

inline constexpr int64_t kServePanelRows = 128;  // the unit of a row range
inline constexpr int64_t kFp8BlockSize = 128;    // fp8_block: 128x128
inline constexpr int64_t kMxBlockSize = 32;      // mxfp8: 32 elements

// The buffers one recipe x direction of a [rows, cols] tensor needs. Shapes are row-major.
struct ServeBufferLayout {
  DType data_dtype = DType::kFp32;
  int64_t data_rows = 0;
  int64_t data_cols = 0;
  int64_t data_bytes = 0;
  DType scale_dtype = DType::kFp32;  // meaningful when scale_count > 0
  int64_t scale_rows = 0;
  int64_t scale_cols = 0;
  int64_t scale_count = 0;  // scale_rows * scale_cols; 0 for plain casts
  int64_t scale_bytes = 0;
};

// Used by the daemon to size its served buffers. rows, cols >= 0.
ServeBufferLayout ServeLayout(Recipe recipe, Direction direction, int64_t rows, int64_t cols);

// A per-tensor scale and the scale_inv stored with the data.
struct TensorScale {
  float scale = 1.0f;
  float scale_inv = 1.0f;
};

// fp8_tensor: scale = 448 / amax as one FP32 division, clamped to [2^-126, 2^126]; amax 0 or
// non-finite keeps prev_scale (pass 1 at first); scale_inv = 1 / scale. `amax` is the whole
// tensor's (AmaxCombine of the panels' AmaxRowsCpu, or of the update pass's).
TensorScale NextFp8TensorScale(float amax, float prev_scale);

// fp8_delayed: scale = 448 / 2^margin / max(history), i.e. (448 * 2^-margin, exact) / max as one
// FP32 division, with fp8_tensor's clamp and zero/non-finite rule (max is AmaxCombine of the
// entries, so one NaN entry keeps prev_scale until it leaves the history); an empty history gives
// scale 1. margin is clamped to [0, 126].
TensorScale NextFp8DelayedScale(const float* history, int count, int margin, float prev_scale);

// The amax of the last `len` applied steps of one tensor, for fp8_delayed. Per step of the job:
// the scale of step t is computed from the history as it stands (NextFp8DelayedScale), the
// weights are cast with it, and then the step's amax (of the new master) is Appended, dropping
// the oldest entry once `len` are held. Version 0 (initial weights) and skipped steps append
// nothing.
class AmaxHistory {
 public:
  explicit AmaxHistory(int len);  // len >= 1 (smaller values act as 1)

  void Append(float amax);
  TensorScale NextScale(int margin, float prev_scale) const;
  // The entries, oldest first (for checkpoints; Restore takes them back, keeping the newest len).
  std::vector<float> Entries() const;
  void Restore(const std::vector<float>& oldest_first);
  int size() const { return count_; }
  int capacity() const { return static_cast<int>(ring_.size()); }

 private:
  std::vector<float> ring_;
  int next_ = 0;   // where the next entry goes
  int count_ = 0;  // entries held, <= capacity()
};

// One tensor and one served output.
struct ServeArgs {
  const float* master = nullptr;  // [rows, cols], row-major: the stored master values
  int64_t rows = 0;
  int64_t cols = 0;
  Recipe recipe = Recipe::kFp32;
  Direction direction = Direction::kRowwise;
  float tensor_scale = 1.0f;  // fp8_tensor / fp8_delayed: the scale (positive, finite)
  void* data = nullptr;       // the whole output, ServeLayout(...).data_bytes
  void* scales = nullptr;     // the whole scale buffer, ServeLayout(...).scale_bytes (or null)
  // bf16 of a bf16+remainder master: its stored high halves ([rows, cols]), served as they are
  // (rowwise or transposed) instead of a cast of `master`, which may then be null.
  const uint16_t* bf16_halves = nullptr;
  // fp8_block with cols a multiple of 128: the amax of each 128-element chunk of `master` over the
  // rows being quantized, as FusedStepCpu's chunk_amax_bits gives them (row_begin's first chunk
  // first), so the blocks' amaxes are not read again from the master. Null: they are.
  const uint32_t* chunk_amax_bits = nullptr;
};

// Quantizes rows [row_begin, row_end) of the master into args.data and args.scales, writing only
// that range's part of them (per-tensor recipes: the range starting at row 0 also writes the one
// scale_inv). No alignment is required; outputs must not overlap the master. Every CpuPath gives
// the same bits. Returns kInvalidArgument (nothing written) for a bad range, shape, scale or
// missing buffer, kUnimplemented for a path this CPU cannot run.
KStatus ServeQuantizeCpu(const ServeArgs& args, int64_t row_begin, int64_t row_end,
                         CpuPath path = CpuPath::kAuto);

// The amax of n values (DESIGN.md §3: NaN if any is NaN, else the largest magnitude, inf
// included); 0 for n == 0. Partial amaxes combine with AmaxCombine in any order, same bits. Every
// path gives the same bits, so one this CPU cannot run is replaced by the scalar path.
float AmaxCpu(const float* x, int64_t n, CpuPath path = CpuPath::kAuto);

// The amax of rows [row_begin, row_end) of a row-major [*, cols] tensor.
float AmaxRowsCpu(const float* master, int64_t cols, int64_t row_begin, int64_t row_end,
                  CpuPath path = CpuPath::kAuto);

}  // namespace paramd::kernels
