// CudaStepPlan: validation of a multi-tensor step, the choice of path per tensor and per output,
// and the descriptor image the kernels read (kernels/cuda/step_desc.h). Host code only.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/step_desc.h"
#include "kernels/cuda_step.h"
#include "kernels/step_rules.h"

namespace paramd::kernels {
namespace {

using cuda_internal::GradDesc;
using cuda_internal::ServeDesc;
using cuda_internal::StepDesc;

KStatus Invalid(int tensor, const std::string& what) {
  return KStatus(Code::kInvalidArgument,
                 "CudaStepPlan: tensor " + std::to_string(tensor) + ": " + what);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t Align(size_t x) { return (x + 255) / 256 * 256; }

int MomentBytes(MomentType t) { return t == MomentType::kFp32 ? 4 : t == MomentType::kFp8 ? 1 : 2; }
int MasterBytes(MasterType t) { return t == MasterType::kFp32 ? 4 : 2; }

bool Aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

KStatus ValidateMoment(int i, const char* name, MomentType type, Rounding rounding,
                       const void* codes, const float* scale_inv) {
  const std::string n = name;
  if (type != MomentType::kFp32 && type != MomentType::kBf16 && type != MomentType::kFp16 &&
      type != MomentType::kFp8) {
    return Invalid(i, "unknown " + n + " type");
  }
  if (rounding != Rounding::kNearest && rounding != Rounding::kStochastic) {
    return Invalid(i, "unknown " + n + " rounding");
  }
  if (codes == nullptr) return Invalid(i, n + " is required");
  if (HasChunkScales(type) && scale_inv == nullptr) return Invalid(i, n + " needs its scales");
  if (type == MomentType::kFp32 && rounding == Rounding::kStochastic) {
    return Invalid(i, "an fp32 " + n + " has nothing to round stochastically");
  }
  return KStatus::Ok();
}

KStatus Validate(int i, const CudaStepTensor& t) {
  if (t.rows < 0 || t.cols < 0) return Invalid(i, "negative shape");
  if (t.rows * t.cols == 0) return KStatus::Ok();  // nothing to step
  if (t.d_slots.empty()) return Invalid(i, "needs at least one gradient slot");
  for (size_t r = 0; r < t.d_slots.size(); ++r) {
    if (t.d_slots[r] == nullptr) return Invalid(i, "slot " + std::to_string(r) + " is null");
  }
  if (t.slot_type != SlotType::kFp32 && t.slot_type != SlotType::kBf16) {
    return Invalid(i, "unknown slot type");
  }
  const StatePolicy& p = t.policy;
  if (p.master != MasterType::kFp32 && p.master != MasterType::kBf16Remainder &&
      p.master != MasterType::kFp16) {
    return Invalid(i, "unknown master type");
  }
  if (t.d_master == nullptr) return Invalid(i, "master is required");
  if (p.master == MasterType::kBf16Remainder && t.d_master_remainder == nullptr) {
    return Invalid(i, "a bf16+remainder master needs its remainders");
  }
  if (KStatus st = ValidateMoment(i, "exp_avg", p.exp_avg, p.exp_avg_rounding, t.d_exp_avg,
                                  t.d_exp_avg_scale_inv);
      !st.ok()) {
    return st;
  }
  if (KStatus st = ValidateMoment(i, "exp_avg_sq", p.exp_avg_sq, p.exp_avg_sq_rounding,
                                  t.d_exp_avg_sq, t.d_exp_avg_sq_scale_inv);
      !st.ok()) {
    return st;
  }
  uint32_t seen = 0;
  for (const CudaServeOutput& o : t.outputs) {
    if (static_cast<int>(o.recipe) >= kNumRecipes ||
        (o.direction != Direction::kRowwise && o.direction != Direction::kColumnwise)) {
      return Invalid(i, "unknown recipe or direction");
    }
    const uint32_t bit = 1u << (static_cast<int>(o.recipe) * 2 + static_cast<int>(o.direction));
    if ((seen & bit) != 0) {
      return Invalid(i, std::string("two outputs for ") + RecipeName(o.recipe) + " " +
                            DirectionName(o.direction));
    }
    seen |= bit;
    const ServeBufferLayout l = ServeLayout(o.recipe, o.direction, t.rows, t.cols);
    if (o.d_data == nullptr) return Invalid(i, std::string(RecipeName(o.recipe)) + " data is null");
    if (l.scale_count > 0 && o.d_scales == nullptr) {
      return Invalid(i, std::string(RecipeName(o.recipe)) + " scales are null");
    }
    if (o.recipe == Recipe::kFp8Tensor && t.d_fp8_tensor_scale == nullptr) {
      return Invalid(i, "fp8_tensor outputs need d_fp8_tensor_scale");
    }
    if (o.recipe == Recipe::kFp8Delayed && t.d_fp8_delayed_scale == nullptr) {
      return Invalid(i, "fp8_delayed outputs need d_fp8_delayed_scale");
    }
  }
  return KStatus::Ok();
}

// The tile path needs whole 128-column tiles (every row segment a whole chunk), enough rows to
// keep a sub-unit's warps busy, and the alignment of its 16-byte copies and 4-byte stores.
bool TilePath(const CudaStepTensor& t) {
  if (t.cols % kChunkElements != 0 || t.rows < cuda_internal::kSubRows) return false;
  bool ok = Aligned(t.d_master, 16) && Aligned(t.d_master_remainder, 16) &&
            Aligned(t.d_exp_avg, 16) && Aligned(t.d_exp_avg_sq, 16) &&
            Aligned(t.d_exp_avg_scale_inv, 4) && Aligned(t.d_exp_avg_sq_scale_inv, 4);
  for (const void* s : t.d_slots) ok = ok && Aligned(s, 16);
  for (const CudaServeOutput& o : t.outputs)
    ok = ok && Aligned(o.d_data, 16) && Aligned(o.d_scales, 4);
  return ok;
}

// Outputs pass 1 writes: rowwise plain casts on both paths; on the tile path also fp8_block and
// mxfp8 in both directions.
uint32_t InPassBit(const CudaServeOutput& o, bool tile) {
  using namespace cuda_internal;
  const bool row = o.direction == Direction::kRowwise;
  constexpr uint32_t kNone = 0;
  switch (o.recipe) {
    case Recipe::kFp32:
      return row ? uint32_t{kOutFp32} : kNone;
    case Recipe::kBf16:
      return row ? uint32_t{kOutBf16} : kNone;
    case Recipe::kFp16:
      return row ? uint32_t{kOutFp16} : kNone;
    case Recipe::kFp8Block:
      return tile ? uint32_t{row ? kOutBlockRow : kOutBlockCol} : kNone;
    case Recipe::kMxfp8:
      return tile ? uint32_t{row ? kOutMxRow : kOutMxCol} : kNone;
    case Recipe::kFp8Delayed:
      return tile && row ? uint32_t{kOutFp8Scaled} : kNone;
    default:
      return 0;
  }
}

template <typename T>
void Put(std::vector<unsigned char>& image, size_t offset, const T& value) {
  std::memcpy(image.data() + offset, &value, sizeof(T));
}

}  // namespace

KStatus CudaStepPlan::Create(std::span<const CudaStepTensor> tensors, CudaStepPlan* plan) {
  using namespace cuda_internal;
  *plan = CudaStepPlan();
  CudaStepPlan& p = *plan;
  p.num_tensors_ = static_cast<int>(tensors.size());
  for (int i = 0; i < p.num_tensors_; ++i) {
    if (KStatus st = Validate(i, tensors[i]); !st.ok()) return st;
  }

  std::vector<StepDesc> tile, flat;
  std::vector<ServeDesc> serve;
  std::vector<GradDesc> grad;
  std::vector<int> tile_owner, flat_owner, grad_owner;  // tensor of each descriptor
  size_t total_slots = 0;
  for (int i = 0; i < p.num_tensors_; ++i) {
    const CudaStepTensor& t = tensors[i];
    p.num_norm_blocks_ += NumNormBlocks(t.rows * t.cols == 0 ? 0 : t.rows);
    if (t.rows * t.cols == 0) continue;
    const bool is_tile = TilePath(t);
    StepDesc d{};
    d.rows = t.rows;
    d.cols = t.cols;
    d.num_slots = static_cast<int32_t>(t.d_slots.size());
    d.slot0 = t.d_slots[0];
    d.tensor_index = t.tensor_index;
    d.index_offset = t.index_offset;
    d.slot_type = static_cast<uint8_t>(t.slot_type);
    d.master_type = static_cast<uint8_t>(t.policy.master);
    d.m_type = static_cast<uint8_t>(t.policy.exp_avg);
    d.v_type = static_cast<uint8_t>(t.policy.exp_avg_sq);
    d.m_stochastic = t.policy.exp_avg_rounding == Rounding::kStochastic;
    d.v_stochastic = t.policy.exp_avg_sq_rounding == Rounding::kStochastic;
    d.master = t.d_master;
    d.remainder = t.d_master_remainder;
    d.m = t.d_exp_avg;
    d.m_scale_inv = t.d_exp_avg_scale_inv;
    d.v = t.d_exp_avg_sq;
    d.v_scale_inv = t.d_exp_avg_sq_scale_inv;
    d.fp8_tensor_scale = t.d_fp8_tensor_scale;
    d.master_amax = t.d_master_amax;
    bool fp8_tensor = false;
    for (const CudaServeOutput& o : t.outputs) {
      const uint32_t bit = InPassBit(o, is_tile);
      d.outputs |= bit;
      auto* data8 = static_cast<uint8_t*>(o.d_data);
      switch (bit) {
        case kOutFp32:
          d.out_fp32 = static_cast<float*>(o.d_data);
          break;
        case kOutBf16:
          d.out_bf16 = static_cast<uint16_t*>(o.d_data);
          break;
        case kOutFp16:
          d.out_fp16 = static_cast<uint16_t*>(o.d_data);
          break;
        case kOutBlockRow:
          d.block_row = data8, d.block_row_scales = static_cast<float*>(o.d_scales);
          break;
        case kOutBlockCol:
          d.block_col = data8, d.block_col_scales = static_cast<float*>(o.d_scales);
          break;
        case kOutMxRow:
          d.mx_row = data8, d.mx_row_scales = static_cast<uint8_t*>(o.d_scales);
          break;
        case kOutMxCol:
          d.mx_col = data8, d.mx_col_scales = static_cast<uint8_t*>(o.d_scales);
          break;
        case kOutFp8Scaled:
          d.fp8_row = data8, d.fp8_row_scale_inv = static_cast<float*>(o.d_scales);
          d.fp8_row_scale = t.d_fp8_delayed_scale;
          break;
        default: {  // the serve pass
          ServeDesc s{};
          s.rows = t.rows;
          s.cols = t.cols;
          s.tile_cols = CeilDiv(t.cols, kTileCols);
          s.first_tile = p.num_serve_tiles_;
          p.num_serve_tiles_ += CeilDiv(t.rows, kTileRows) * s.tile_cols;
          s.master = t.d_master;
          s.remainder = t.d_master_remainder;
          s.tensor_scale = o.recipe == Recipe::kFp8Tensor    ? t.d_fp8_tensor_scale
                           : o.recipe == Recipe::kFp8Delayed ? t.d_fp8_delayed_scale
                                                             : nullptr;
          s.data = o.d_data;
          s.scales = o.d_scales;
          s.master_type = static_cast<uint8_t>(t.policy.master);
          s.recipe = static_cast<uint8_t>(o.recipe);
          s.direction = static_cast<uint8_t>(o.direction);
          serve.push_back(s);
          break;
        }
      }
      fp8_tensor = fp8_tensor || o.recipe == Recipe::kFp8Tensor;
    }
    if (fp8_tensor || t.d_master_amax != nullptr) d.outputs |= kNeedAmax;
    total_slots += t.d_slots.size();
    if (is_tile) {
      d.items = CeilDiv(t.rows, kTileRows) * (t.cols / kTileCols);
      d.first_item = p.num_tiles_;
      p.num_tiles_ += d.items;
      TileShape& s = p.tile_shape_;
      s.master_bytes = std::max(s.master_bytes, MasterBytes(t.policy.master));
      if (t.policy.master == MasterType::kBf16Remainder) s.remainder_bytes = 2;
      s.m_bytes = std::max(s.m_bytes, MomentBytes(t.policy.exp_avg));
      s.v_bytes = std::max(s.v_bytes, MomentBytes(t.policy.exp_avg_sq));
      s.slots = std::max(s.slots, d.num_slots);
      s.slot_bytes = std::max(s.slot_bytes, t.slot_type == SlotType::kFp32 ? 4 : 2);
      if (HasChunkScales(t.policy.exp_avg) || HasChunkScales(t.policy.exp_avg_sq)) {
        s.scaled_moments = 1;
      }
      if (d.outputs & (kOutBlockRow | kOutBlockCol)) {
        s.buffer_rows = kTileRows;
      } else if (d.outputs & kOutMxCol) {
        s.buffer_rows = std::max(s.buffer_rows, kMxGroupRows);
      }
      const StatePolicy& pol = t.policy;
      const bool nearest = pol.exp_avg_rounding == Rounding::kNearest &&
                           pol.exp_avg_sq_rounding == Rounding::kNearest;
      int kind = kAnyPolicy;
      if (d.num_slots == 1 && pol.master == MasterType::kFp32 && nearest) {
        if (pol.exp_avg == MomentType::kFp8 && pol.exp_avg_sq == MomentType::kFp16) {
          kind = t.slot_type == SlotType::kBf16 ? kIssuePolicy : kIssueFp32GradPolicy;
        } else if (t.slot_type == SlotType::kFp32 && pol.exp_avg == MomentType::kFp32 &&
                   pol.exp_avg_sq == MomentType::kFp32) {
          kind = kFp32Policy;
        }
      }
      s.policy_kind = tile.empty() ? kind : (s.policy_kind == kind ? kind : int{kAnyPolicy});
      tile.push_back(d);
      tile_owner.push_back(i);
    } else {
      d.items = NumChunks(t.rows * t.cols);
      d.first_item = p.num_flat_chunks_;
      p.num_flat_chunks_ += d.items;
      flat.push_back(d);
      flat_owner.push_back(i);
    }
    // The grad check: enough sub-blocks per norm block that each warp owns about 32 chunks.
    GradDesc g{};
    g.rows = t.rows;
    g.cols = t.cols;
    g.num_slots = d.num_slots;
    g.slot_type = d.slot_type;
    const int64_t full_chunks = CeilDiv(std::min<int64_t>(t.rows, kNormBlockRows) * t.cols, 128);
    const int64_t padded = std::bit_ceil(static_cast<uint64_t>(full_chunks));
    g.sub_blocks = static_cast<int32_t>(std::clamp<int64_t>(
        std::bit_floor(static_cast<uint64_t>(std::max<int64_t>(1, padded / (kGradWarps * 32)))), 1,
        1024));
    g.first_item = p.num_grad_items_;
    g.first_block = p.num_norm_blocks_ - NumNormBlocks(t.rows);
    p.num_grad_items_ += NumNormBlocks(t.rows) * g.sub_blocks;
    grad.push_back(g);
    grad_owner.push_back(i);
  }
  p.tile_tensors_ = static_cast<int64_t>(tile.size());
  p.flat_tensors_ = static_cast<int64_t>(flat.size());
  p.serve_items_ = static_cast<int64_t>(serve.size());
  p.grad_tensors_ = static_cast<int64_t>(grad.size());

  // Workspace layout.
  Layout& l = p.layout_;
  size_t at = 0;
  auto region = [&at](size_t bytes) {
    const size_t start = at;
    at = Align(at + bytes);
    return start;
  };
  l.tile_descs = region(tile.size() * sizeof(StepDesc));
  l.tile_starts = region(tile.size() * sizeof(int64_t));
  l.flat_descs = region(flat.size() * sizeof(StepDesc));
  l.flat_starts = region(flat.size() * sizeof(int64_t));
  l.serve_descs = region(serve.size() * sizeof(ServeDesc));
  l.serve_starts = region(serve.size() * sizeof(int64_t));
  l.grad_descs = region(grad.size() * sizeof(GradDesc));
  l.grad_starts = region(grad.size() * sizeof(int64_t));
  l.block_starts = region(grad.size() * sizeof(int64_t));
  l.slot_ptrs = region(total_slots * sizeof(void*));
  l.counters = region(static_cast<size_t>(p.num_tensors_) * 2 * sizeof(uint32_t));
  l.scratch = region(static_cast<size_t>(p.num_grad_items_) * kGradWarps * sizeof(double));
  p.workspace_bytes_ = at;
  p.counters_bytes_ = l.scratch - l.counters;

  // The image: pointers into the workspace are stored relative to it and rebased by Bind.
  std::vector<unsigned char>& image = p.image_;
  image.assign(l.counters, 0);
  size_t slot_at = l.slot_ptrs;
  std::vector<size_t> slot_offset(static_cast<size_t>(p.num_tensors_), 0);
  for (int i = 0; i < p.num_tensors_; ++i) {
    slot_offset[i] = slot_at;
    for (const void* s : tensors[i].d_slots) {
      Put(image, slot_at, s);
      slot_at += sizeof(void*);
    }
  }
  auto relative = [](size_t offset) { return reinterpret_cast<void*>(offset); };
  auto put_steps = [&](const std::vector<StepDesc>& descs, const std::vector<int>& owner,
                       size_t descs_at, size_t starts_at) {
    for (size_t j = 0; j < descs.size(); ++j) {
      StepDesc d = descs[j];
      const int i = owner[j];
      d.slots = static_cast<const void* const*>(relative(slot_offset[i]));
      d.amax_bits = static_cast<uint32_t*>(relative(l.counters + 8 * static_cast<size_t>(i)));
      d.items_done = static_cast<uint32_t*>(relative(l.counters + 8 * static_cast<size_t>(i) + 4));
      const size_t at_j = descs_at + j * sizeof(StepDesc);
      Put(image, at_j, d);
      p.relocations_.push_back(at_j + offsetof(StepDesc, slots));
      p.relocations_.push_back(at_j + offsetof(StepDesc, amax_bits));
      p.relocations_.push_back(at_j + offsetof(StepDesc, items_done));
      Put(image, starts_at + j * sizeof(int64_t), d.first_item);
    }
  };
  put_steps(tile, tile_owner, l.tile_descs, l.tile_starts);
  put_steps(flat, flat_owner, l.flat_descs, l.flat_starts);
  for (size_t j = 0; j < serve.size(); ++j) {
    Put(image, l.serve_descs + j * sizeof(ServeDesc), serve[j]);
    Put(image, l.serve_starts + j * sizeof(int64_t), serve[j].first_tile);
  }
  for (size_t j = 0; j < grad.size(); ++j) {
    GradDesc g = grad[j];
    g.slots = static_cast<const void* const*>(relative(slot_offset[grad_owner[j]]));
    const size_t at_j = l.grad_descs + j * sizeof(GradDesc);
    Put(image, at_j, g);
    p.relocations_.push_back(at_j + offsetof(GradDesc, slots));
    Put(image, l.grad_starts + j * sizeof(int64_t), g.first_item);
    Put(image, l.block_starts + j * sizeof(int64_t), g.first_block);
  }
  return KStatus::Ok();
}

KStatus CudaStepPlan::Bind(void* d_workspace, size_t bytes, cudaStream_t stream) {
  std::vector<unsigned char> image(image_.size());
  if (KStatus st = BindAsync(d_workspace, bytes, image.data(), stream); !st.ok()) return st;
  // The image is a local: wait for the copy before it goes.
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return KStatus::Ok();
}

KStatus CudaStepPlan::BindAsync(void* d_workspace, size_t bytes, void* h_staging,
                                cudaStream_t stream) {
  if (d_workspace == nullptr || bytes < workspace_bytes_ ||
      reinterpret_cast<uintptr_t>(d_workspace) % 256 != 0 ||
      (h_staging == nullptr && !image_.empty())) {
    return KStatus(Code::kInvalidArgument,
                   "CudaStepPlan::Bind: needs a 256-byte aligned workspace of " +
                       std::to_string(workspace_bytes_) + " bytes and host staging");
  }
  auto* image = static_cast<unsigned char*>(h_staging);
  if (!image_.empty()) std::memcpy(image, image_.data(), image_.size());
  const uintptr_t base = reinterpret_cast<uintptr_t>(d_workspace);
  for (size_t at : relocations_) {
    uintptr_t v;
    std::memcpy(&v, image + at, sizeof v);
    v += base;
    std::memcpy(image + at, &v, sizeof v);
  }
  if (!image_.empty()) {
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(d_workspace, image, image_.size(), cudaMemcpyHostToDevice, stream));
  }
  d_workspace_ = d_workspace;
  return ResetCounters(stream);
}

KStatus CudaStepPlan::ResetCounters(cudaStream_t stream) const {
  if (d_workspace_ == nullptr) {
    return KStatus(Code::kInvalidArgument, "CudaStepPlan::ResetCounters: the plan is not bound");
  }
  if (counters_bytes_ > 0) {
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        static_cast<unsigned char*>(d_workspace_) + layout_.counters, 0, counters_bytes_, stream));
  }
  return KStatus::Ok();
}

size_t ServeQuantizeCudaWorkspaceBytes(size_t n) {
  return Align(n * sizeof(cuda_internal::ServeDesc)) + Align(n * sizeof(int64_t));
}

bool CudaDeviceAvailable(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why != nullptr) {
      *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" +
             cudaGetErrorString(err) + ")";
    }
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  if (count == 0) {
    if (why != nullptr) *why = "no CUDA device";
    return false;
  }
  return true;
}

}  // namespace paramd::kernels
