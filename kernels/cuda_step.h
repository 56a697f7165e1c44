// The fused step on the GPU (DESIGN.md §2-§3, §10): rank slots -> gradient -> AdamW -> new master
// and moments -> served formats, for MANY tensors in ONE launch, bit-identical to FusedStepCpu
// followed by ServeQuantizeCpu (kernels/fused_step.h, kernels/recipes.h), and the step rules of
// kernels/step_rules.h on the GPU. Host API only (no device types): g++ compiles this header;
// the kernels live in kernels/cuda/*.cu. Every pointer named d_* is device memory the caller owns;
// every call takes an explicit stream and is asynchronous unless it says otherwise.
//
// Bit-identity: every stored code, scale and served byte equals the CPU's. FP32 words (an fp32
// master, fp32 moments, the fp32 served copy) are equal too, except where they are NaN: the GPU's
// arithmetic returns one canonical NaN whatever the operands, x86 keeps an operand's payload, so a
// NaN there may differ in its payload bits (never in being NaN). Found-inf skipping keeps NaN out
// of a real step.
//
// Launch structure (kernels/cuda/fused_step.cu has the details):
//   pass 1, one launch over all tensors whose cols are a multiple of 128 (the tile path): a
//     persistent grid walks a list of 128 x 128 tiles, each in sub-units of 8 x R rows (R = 1, 2
//     or 4 rows per warp), every row segment a whole 128-element chunk of the moments' scales,
//     streamed into shared memory by a cp.async pipeline several sub-units deep. The step writes
//     master, moments, the elementwise outputs (fp32, bf16, fp16 rowwise) and mxfp8 rowwise per
//     sub-unit, mxfp8 columnwise per 32-row group, fp8_block (both directions) per tile, and each
//     tile's master amax; the last tile of a tensor turns the amax into the fp8_tensor scale.
//   pass 1', one more launch, only when some tensor's cols are not a multiple of 128 (or it is
//     1-D, or a buffer is not 16-byte aligned): the flat path, a warp per 128-element chunk of the
//     flattened tensor, elementwise outputs only.
//   pass 2, only when a tensor serves what pass 1 cannot (fp8_tensor, whose scale needs the whole
//     tensor's amax; fp8_delayed; columnwise fp32/bf16/fp16, which are transposes; the block
//     formats of flat-path tensors): one launch of the serve kernel over all of them, reading the
//     stored master once per output.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t (host types only)

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/fused_step.h"
#include "kernels/recipes.h"
#include "kernels/status.h"

namespace paramd::kernels {

// One served output of a tensor: a recipe x direction and its buffers, sized by ServeLayout.
struct CudaServeOutput {
  Recipe recipe = Recipe::kFp32;
  Direction direction = Direction::kRowwise;
  void* d_data = nullptr;
  void* d_scales = nullptr;  // null for plain casts

  bool operator==(const CudaServeOutput&) const = default;
};

// One tensor of a multi-tensor step. State buffers are typed by `policy` as in FusedStepArgs
// (scale arrays hold NumChunks(rows * cols) FP32 values 1 / s).
struct CudaStepTensor {
  int64_t rows = 0;  // [rows, cols], row-major; 1-D tensors are [1, n]
  int64_t cols = 0;
  StatePolicy policy{};
  uint32_t tensor_index = 0;  // registration index in the job (Philox counter word 3)
  // The whole tensor's index of element 0 (RngStream::index_offset): a row range of a split tensor.
  uint64_t index_offset = 0;
  SlotType slot_type = SlotType::kFp32;
  std::vector<const void*> d_slots;  // rank order, each rows * cols elements

  void* d_master = nullptr;
  int16_t* d_master_remainder = nullptr;  // kBf16Remainder only
  void* d_exp_avg = nullptr;
  float* d_exp_avg_scale_inv = nullptr;  // kFp16 / kFp8 exp_avg only
  void* d_exp_avg_sq = nullptr;
  float* d_exp_avg_sq_scale_inv = nullptr;  // kFp16 / kFp8 exp_avg_sq only

  std::vector<CudaServeOutput> outputs;  // at most one per recipe x direction
  // fp8_tensor outputs: the tensor's scale, read (the previous one; 1 at first) and rewritten by
  // the step with NextFp8TensorScale(amax of the new master, previous).
  float* d_fp8_tensor_scale = nullptr;
  // fp8_delayed outputs: the scale to cast with (the host's AmaxHistory::NextScale).
  const float* d_fp8_delayed_scale = nullptr;
  // Optional: receives the amax of the new stored master (e.g. for the fp8_delayed history).
  float* d_master_amax = nullptr;

  // Equal descriptors make equal plans (a plan made once serves every step that has them).
  bool operator==(const CudaStepTensor&) const = default;
};

// Per-step scalars, the same for every tensor of a launch (DESIGN.md §2-§3).
struct CudaStepScalars {
  AdamwScalars adamw{};     // MakeAdamwScalars(hyper, k)
  float grad_scale = 1.0f;  // rounded once to FP32 on the host
  float clip = 1.0f;        // ClipFactor(...) from the block sums; 1 = no clipping
  uint64_t seed = 0;        // the job's seed (stochastic rounding)
  uint32_t k = 0;           // count of applied steps including this one
  // A step decided on the device (the host does not wait for the gradient check): when set, the
  // kernels read the clip there (StepDecisionCuda's) instead of `clip`, and where the flag
  // GradCheckCuda wrote is 0 (a gradient is not finite) they write nothing at all: the state, the
  // served outputs and the fp8_tensor scale stay as they are. `k` is then the count if this step
  // applies.
  const float* d_clip = nullptr;
  const int* d_all_finite = nullptr;
};

// Launch knobs of pass 1 (the benchmark sweeps them); 0 = the built-in choice.
struct CudaStepTuning {
  int blocks_per_sm = 0;  // resident thread blocks per multiprocessor of the persistent grid
  int stages = 0;         // sub-units in flight in each block's cp.async pipeline (2..8)
  int rows_per_warp = 0;  // rows each warp updates per pipeline step: 1, 2 or 4 (kernels compiled
                          // for one policy only; 0 = the measured best)
  bool generic = false;   // the kernel that reads the policy per tensor, even where one compiled
                          // for the launch's single policy exists (for comparison)
};

// The device-side description of a set of tensors: built once (tensors and buffers do not move
// between steps), then stepped any number of times. Holds host-side copies only; the device
// descriptors live in a workspace the caller allocates.
class CudaStepPlan {
 public:
  // Validates the tensors (shapes, policies, buffers, outputs) and lays out the descriptors. No
  // device call. kInvalidArgument names the first problem.
  static KStatus Create(std::span<const CudaStepTensor> tensors, CudaStepPlan* plan);

  // Bytes of device workspace the plan needs (descriptors, per-tensor counters, the scratch of
  // GradCheckCuda). Allocate with cudaMalloc (256-byte aligned).
  size_t workspace_bytes() const { return workspace_bytes_; }
  // Copies the descriptors into d_workspace and zeroes its counters (on `stream`; the host side is
  // done when this returns). The workspace must stay allocated while the plan is used, and one
  // plan's launches must not overlap (they share the counters).
  KStatus Bind(void* d_workspace, size_t bytes, cudaStream_t stream);
  // The same without waiting: the descriptors go through `h_staging`, page-locked host memory of
  // at least workspace_bytes() that the caller keeps unchanged until the stream has run the copy.
  KStatus BindAsync(void* d_workspace, size_t bytes, void* h_staging, cudaStream_t stream);
  // Zeroes the counters of a bound plan again (between launches that use them: the gradient check,
  // then the step), on `stream`.
  KStatus ResetCounters(cudaStream_t stream) const;

  int num_tensors() const { return num_tensors_; }
  // Norm blocks (128-row blocks) of all tensors, in order: the length of GradCheckCuda's sums.
  int64_t num_norm_blocks() const { return num_norm_blocks_; }
  int64_t tile_path_tensors() const { return tile_tensors_; }
  int64_t flat_path_tensors() const { return flat_tensors_; }
  int64_t second_pass_outputs() const { return serve_items_; }

  // Internal to kernels/cuda: the descriptor image and where its parts go.
  struct Layout {  // byte offsets into the workspace
    size_t tile_descs = 0, tile_starts = 0, flat_descs = 0, flat_starts = 0, serve_descs = 0,
           serve_starts = 0, grad_descs = 0, grad_starts = 0, block_starts = 0, slot_ptrs = 0,
           counters = 0, scratch = 0;
  };
  const Layout& layout() const { return layout_; }
  void* d_workspace() const { return d_workspace_; }
  int64_t num_tiles() const { return num_tiles_; }
  int64_t num_flat_chunks() const { return num_flat_chunks_; }
  int64_t num_grad_items() const { return num_grad_items_; }
  int64_t grad_tensors() const { return grad_tensors_; }
  int64_t num_serve_tiles() const { return num_serve_tiles_; }
  // The widest tile-path tensor's element sizes (bytes) and slot count: they size the stages of
  // pass 1's pipeline. buffer_rows: rows of the new master kept in shared memory per tile (128
  // with fp8_block outputs, 32 with mxfp8 columnwise ones only, else 0).
  struct TileShape {
    int master_bytes = 0, remainder_bytes = 0, m_bytes = 0, v_bytes = 0, slots = 0, slot_bytes = 0,
        scaled_moments = 0, buffer_rows = 0;
    int policy_kind = 0;  // a kernel compiled for the one policy of every tile-path tensor, or 0
  };
  const TileShape& tile_shape() const { return tile_shape_; }
  size_t counters_bytes() const { return counters_bytes_; }

 private:
  int num_tensors_ = 0;
  int64_t num_norm_blocks_ = 0, tile_tensors_ = 0, flat_tensors_ = 0, serve_items_ = 0;
  int64_t num_tiles_ = 0, num_flat_chunks_ = 0, num_grad_items_ = 0, num_serve_tiles_ = 0;
  int64_t grad_tensors_ = 0;
  std::vector<size_t> relocations_;  // image offsets of pointers relative to the workspace
  TileShape tile_shape_;
  size_t counters_bytes_ = 0;
  Layout layout_;
  std::vector<unsigned char> image_;  // bytes [0, layout_.counters) of the workspace, unbound
  size_t workspace_bytes_ = 0;
  void* d_workspace_ = nullptr;
};

// One step of every tensor of the plan: pass 1 (and 1', 2 where needed; see the top of this
// file). The plan must be bound.
KStatus FusedStepCuda(const CudaStepPlan& plan, const CudaStepScalars& scalars, cudaStream_t stream,
                      const CudaStepTuning& tuning = {});

// The step rules on the GPU (kernels/step_rules.h): finiteness of every element (d_all_finite, an
// int set to 1 and cleared to 0 when some gs * gs is not finite) and, when d_block_sums is not
// null, the FP64 sum of squares of each 128-row block of each tensor, in the exact pairwise order
// of GradBlockSumsCpu (bit-identical when finite), plan.num_norm_blocks() doubles in tensor then
// block order: SumInOrder and ClipFactor on the host give the clip. Two launches.
KStatus GradCheckCuda(const CudaStepPlan& plan, float grad_scale, double* d_block_sums,
                      int* d_all_finite, cudaStream_t stream);

// The clip of a step decided on the device: ClipFactor(SumInOrder(d_block_sums[0, n)),
// max_grad_norm) written to *d_clip, bit-identical to the host's (one thread adds the sums in
// order). One launch.
KStatus StepDecisionCuda(const double* d_block_sums, int64_t n, double max_grad_norm, float* d_clip,
                         cudaStream_t stream);

// A copy that runs only when a step decided on the device was skipped (*d_all_finite == 0): the
// new version's bytes from the previous version's.
struct CudaSkipCopy {
  void* d_dst = nullptr;
  const void* d_src = nullptr;
  int64_t bytes = 0;
};
// Queues the copies (a few launches; the arguments travel by value, the host is done at return).
KStatus CopyIfSkippedCuda(std::span<const CudaSkipCopy> copies, const int* d_all_finite,
                          cudaStream_t stream);

// One output of the standalone serve pass: the GPU twin of ServeQuantizeCpu over a whole tensor,
// from a stored master of any type (fp32; bf16+remainder reconstructed, whose bf16 output is its
// stored served half as the step writes it; fp16 decoded).
struct CudaServeArgs {
  MasterType master_type = MasterType::kFp32;
  const void* d_master = nullptr;
  const int16_t* d_master_remainder = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  Recipe recipe = Recipe::kFp32;
  Direction direction = Direction::kRowwise;
  const float* d_tensor_scale = nullptr;  // fp8_tensor / fp8_delayed: the scale (device)
  void* d_data = nullptr;
  void* d_scales = nullptr;
};

// Device workspace ServeQuantizeCuda needs for n outputs.
size_t ServeQuantizeCudaWorkspaceBytes(size_t n);
// Quantizes every output in one launch. The descriptors are copied into d_workspace on `stream`
// (the host side is done when this returns).
KStatus ServeQuantizeCuda(std::span<const CudaServeArgs> outputs, void* d_workspace, size_t bytes,
                          cudaStream_t stream);

// Whether a CUDA device is usable here, and if not why (for tests and benchmarks to skip).
bool CudaDeviceAvailable(std::string* why);

}  // namespace paramd::kernels
