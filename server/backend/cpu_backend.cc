#include "server/backend/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cpu_step.h"
#include "kernels/formats.h"
#include "kernels/step_rules.h"
#include "server/backend/initial_state.h"
#include "server/backend/kernel_status.h"

namespace paramd {
namespace {

// Elements per parallel block of the gradient check: a multiple of the 128-element chunk.
constexpr int64_t kGrain = kernels::kDefaultGrain;

// The scales of a moment of type `t` over `n` elements: one per chunk, or none.
size_t ChunkScales(kernels::MomentType t, int64_t n) {
  return kernels::HasChunkScales(t) ? static_cast<size_t>(kernels::NumChunks(n)) : 0;
}

// Zeroes `v` (sized, not yet written) over the pool's threads, 2 MiB (a huge page) a block, so its
// first touch is spread over them rather than made by one request thread: a large model's state
// is tens of GB, and faulting it in on one thread was most of its upload. The calling thread (a
// request's) joins as a guest, not placed on the step CPUs.
template <typename T>
void ZeroOverPool(kernels::ThreadPool& pool, AlignedVector<T>& v) {
  constexpr int64_t kBlock = int64_t{2} << 20;
  auto* bytes = reinterpret_cast<uint8_t*>(v.data());
  const int64_t n = static_cast<int64_t>(v.size() * sizeof(T));
  pool.ParallelForAsGuest(n, kBlock, [bytes](int64_t begin, int64_t end) {
    std::memset(bytes + begin, 0, static_cast<size_t>(end - begin));
  });
}

class CpuTensorState : public TensorState {
 public:
  // A new tensor's state: moments zero (written over `pool`), their scales one (the master is the
  // caller's).
  CpuTensorState(const TensorInfo& info, kernels::ThreadPool& pool)
      : info(info), n(info.rows * info.cols) {
    const StateBytes bytes = PolicyStateBytes(info);
    exp_avg.resize(static_cast<size_t>(bytes.exp_avg));
    exp_avg_sq.resize(static_cast<size_t>(bytes.exp_avg_sq));
    ZeroOverPool(pool, exp_avg);
    ZeroOverPool(pool, exp_avg_sq);
    exp_avg_scale_inv.assign(ChunkScales(info.policy.exp_avg, n), 1.0f);
    exp_avg_sq_scale_inv.assign(ChunkScales(info.policy.exp_avg_sq, n), 1.0f);
  }
  // An imported state, its arrays moved in (not sized and overwritten: that would touch the
  // moments' memory twice). A state is checked whole against the policy before it gets here.
  CpuTensorState(const TensorInfo& info, HostTensorState&& state)
      : info(info),
        n(info.rows * info.cols),
        master(std::move(state.master)),
        remainder(std::move(state.remainder)),
        exp_avg(std::move(state.exp_avg)),
        exp_avg_sq(std::move(state.exp_avg_sq)),
        exp_avg_scale_inv(std::move(state.exp_avg_scale_inv)),
        exp_avg_sq_scale_inv(std::move(state.exp_avg_sq_scale_inv)),
        tensor_scale(state.scalars.fp8_tensor_scale),
        delayed_scale(state.scalars.fp8_delayed_scale),
        history(info.delayed_history) {
    const StateBytes bytes = PolicyStateBytes(info);
    PARAMD_CHECK(static_cast<int64_t>(exp_avg.size()) == bytes.exp_avg &&
                 static_cast<int64_t>(exp_avg_sq.size()) == bytes.exp_avg_sq &&
                 exp_avg_scale_inv.size() == ChunkScales(info.policy.exp_avg, n) &&
                 exp_avg_sq_scale_inv.size() == ChunkScales(info.policy.exp_avg_sq, n));
    history.Restore(state.scalars.delayed_history);
  }

  StateBytes state_bytes() const override { return PolicyStateBytes(info); }

  // Takes `from`'s sizes and scalars (the same tensor's), reusing its own buffers (sized once, not
  // written: common/aligned_vector.h): a step from `from` into this state (StepArgs' sources)
  // writes every array before it is read.
  void ShapedAs(const CpuTensorState& from) {
    master.resize(from.master.size());
    remainder.resize(from.remainder.size());
    exp_avg.resize(from.exp_avg.size());
    exp_avg_sq.resize(from.exp_avg_sq.size());
    exp_avg_scale_inv.resize(from.exp_avg_scale_inv.size());
    exp_avg_sq_scale_inv.resize(from.exp_avg_sq_scale_inv.size());
    working.resize(from.working.size());
    tensor_scale = from.tensor_scale;
    delayed_scale = from.delayed_scale;
    history = from.history;
  }
  // Trades every array and scalar with `other` (the same tensor's state): O(1).
  void Swap(CpuTensorState& other) {
    master.swap(other.master);
    remainder.swap(other.remainder);
    exp_avg.swap(other.exp_avg);
    exp_avg_sq.swap(other.exp_avg_sq);
    exp_avg_scale_inv.swap(other.exp_avg_scale_inv);
    exp_avg_sq_scale_inv.swap(other.exp_avg_sq_scale_inv);
    working.swap(other.working);
    std::swap(tensor_scale, other.tensor_scale);
    std::swap(delayed_scale, other.delayed_scale);
    std::swap(history, other.history);
  }

  const TensorInfo info;
  const int64_t n;
  // 64-byte aligned, so that a step out of place (an early step's) streams its FP32 moments.
  AlignedVector<uint8_t> master;     // FP32, FP16 codes, or the served BF16 halves
  AlignedVector<int16_t> remainder;  // bf16+remainder only
  AlignedVector<uint8_t> exp_avg;
  AlignedVector<uint8_t> exp_avg_sq;
  AlignedVector<float> exp_avg_scale_inv;
  AlignedVector<float> exp_avg_sq_scale_inv;
  // The step's FP32 values, which the block and per-tensor formats are cut from, where the job
  // does not serve FP32 and the master is not FP32 itself (empty otherwise).
  AlignedVector<float> working;
  float tensor_scale = 1.0f;   // fp8_tensor: the previous step's scale
  float delayed_scale = 1.0f;  // fp8_delayed: likewise
  kernels::AmaxHistory history{16};
};

bool IsElementwise(const ServedFormat& f) { return WrittenInTheStepsPass(f.key); }

bool IsPerTensor(const ServedFormat& f) {
  return f.key.recipe == v1::RECIPE_FP8_TENSOR || f.key.recipe == v1::RECIPE_FP8_DELAYED;
}

// The state's buffers are std::vectors: the one place an allocation can throw, turned into the
// status of the request that asked for it (the daemon's budget makes it rare: the machine's
// memory went to another process).
absl::Status OutOfHostMemory(const TensorInfo& info) {
  return absl::ResourceExhaustedError(
      absl::StrCat("no host memory for the state of a ", info.rows, "x", info.cols, " tensor"));
}

// The FP32 values this step's formats are cut from: the served FP32 bytes, an FP32 master itself,
// or the tensor's working copy.
const float* Fp32Source(const CpuTensorState& s, ServedTensor* out) {
  if (const float* fp32 = out->Fp32(); fp32 != nullptr) return fp32;
  if (s.info.policy.master == kernels::MasterType::kFp32) {
    return reinterpret_cast<const float*>(s.master.data());
  }
  return s.working.data();
}

// Sizes the working copy where the tensor needs one (see CpuTensorState::working), its pages
// touched over the pool.
void SizeWorking(CpuTensorState& s, const ServedTensor& out, kernels::ThreadPool& pool) {
  std::vector<FormatKey> keys;
  for (const ServedFormat& f : out.formats) keys.push_back(f.key);
  s.working.resize(static_cast<size_t>(CpuWorkingBytes(s.info, keys) / 4));
  ZeroOverPool(pool, s.working);
}

// The kernel's arguments for format `f` of this step, cut from the step's FP32 values.
kernels::ServeArgs ServeArgsFor(const CpuTensorState& s, ServedTensor* out, ServedFormat& f,
                                float tensor_scale) {
  const bool split = s.info.policy.master == kernels::MasterType::kBf16Remainder;
  return ServeArgsOf(s.info, Fp32Source(s, out),
                     split ? reinterpret_cast<const uint16_t*>(s.master.data()) : nullptr,
                     tensor_scale, f);
}

// The kernel's arguments for stepping `s`, in place, or from `from`'s arrays into `s`'s (an early
// step: `from` is only read).
kernels::FusedStepArgs StepArgs(CpuTensorState& s, const TensorStep& t, const StepScalars& k,
                                const CpuTensorState* from) {
  kernels::FusedStepArgs args;
  args.slots = t.slots.data();
  args.num_slots = static_cast<int>(t.slots.size());
  args.slot_type = t.slot_type;
  args.grad_scale = k.grad_scale;
  args.clip = k.clip;
  args.scalars = k.adamw;
  args.policy = s.info.policy;
  args.rng = {k.seed, static_cast<uint32_t>(k.k), s.info.index, s.info.first_element()};
  args.numel = s.n;
  args.master = s.master.data();
  args.master_remainder = s.remainder.empty() ? nullptr : s.remainder.data();
  args.exp_avg = s.exp_avg.data();
  args.exp_avg_scale_inv = s.exp_avg_scale_inv.empty() ? nullptr : s.exp_avg_scale_inv.data();
  args.exp_avg_sq = s.exp_avg_sq.data();
  args.exp_avg_sq_scale_inv =
      s.exp_avg_sq_scale_inv.empty() ? nullptr : s.exp_avg_sq_scale_inv.data();
  if (from != nullptr) {
    const auto or_null = [](const auto& v) { return v.empty() ? nullptr : v.data(); };
    args.master_in = from->master.data();
    args.master_remainder_in = or_null(from->remainder);
    args.exp_avg_in = from->exp_avg.data();
    args.exp_avg_scale_inv_in = or_null(from->exp_avg_scale_inv);
    args.exp_avg_sq_in = from->exp_avg_sq.data();
    args.exp_avg_sq_scale_inv_in = or_null(from->exp_avg_sq_scale_inv);
  }
  if (!s.working.empty()) args.out_fp32 = s.working.data();
  for (ServedFormat& f : t.out->formats) {
    if (!IsElementwise(f)) continue;
    if (f.key.recipe == v1::RECIPE_FP32) args.out_fp32 = reinterpret_cast<float*>(f.data());
    if (f.key.recipe == v1::RECIPE_BF16) args.out_bf16 = reinterpret_cast<uint16_t*>(f.data());
    if (f.key.recipe == v1::RECIPE_FP16) args.out_fp16 = reinterpret_cast<uint16_t*>(f.data());
  }
  return args;
}

}  // namespace

CpuBackend::CpuBackend(int threads, std::string name, std::vector<int> cpus)
    : name_(std::move(name)), pool_(threads, std::move(cpus)) {}
CpuBackend::~CpuBackend() = default;

absl::StatusOr<std::unique_ptr<TensorState>> CpuBackend::CreateState(
    const TensorInfo& info, std::span<const float> initial, ServedTensor* out,
    const WholeAmax& whole_amax) try {
  InitialState initial_state;
  absl::Status status = MakeInitialState(info, initial, pool_, &initial_state, out, whole_amax);
  if (!status.ok()) return status;
  auto state = std::make_unique<CpuTensorState>(info, pool_);
  state->master = std::move(initial_state.master);
  state->remainder = std::move(initial_state.remainder);
  state->tensor_scale = initial_state.fp8_tensor_scale;
  state->delayed_scale = initial_state.delayed_scale;
  state->history = kernels::AmaxHistory(info.delayed_history);
  SizeWorking(*state, *out, pool_);
  return state;
} catch (const std::bad_alloc&) {
  return OutOfHostMemory(info);
}

absl::Status CpuBackend::ApplyStep(std::span<TensorStep> tensors, const StepScalars& scalars,
                                   const std::function<void(size_t)>& tensor_done) {
  // Tensor by tensor, each with every thread, and each reported as soon as it is done: the job
  // publishes it while the next ones are stepped. A small tensor is one ParallelFor of few
  // blocks; grouping small tensors would save little next to the publish it would delay.
  for (size_t index = 0; index < tensors.size(); ++index) {
    TensorStep& t = tensors[index];
    if (t.adopt != nullptr) {
      // Its early step made this step's state and served bytes already: the two states trade
      // their buffers.
      auto& s = *static_cast<CpuTensorState*>(t.state);
      s.Swap(*static_cast<CpuTensorState*>(t.adopt));
      early_steps_adopted_.fetch_add(1, std::memory_order_relaxed);
    } else {
      PARAMD_RETURN_IF_ERROR(StepTensor(t, scalars));
    }
    if (tensor_done) tensor_done(index);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TensorState>> CpuBackend::MakeShadow(const TensorState& of) try {
  const auto& source = static_cast<const CpuTensorState&>(of);
  auto shadow = std::make_unique<CpuTensorState>(source.info, pool_);
  shadow->ShapedAs(source);
  // Every page touched here, over the pool, not by the early step that first writes them.
  ZeroOverPool(pool_, shadow->master);
  ZeroOverPool(pool_, shadow->remainder);
  ZeroOverPool(pool_, shadow->working);
  return shadow;
} catch (const std::bad_alloc&) {
  return OutOfHostMemory(static_cast<const CpuTensorState&>(of).info);
}

// One pass: the kernel reads `from`'s arrays and writes the shadow's (FusedStepArgs' sources).
absl::Status CpuBackend::StepEarly(const TensorState& from, TensorState& into,
                                   const TensorStep& step, const StepScalars& scalars) try {
  const auto& source = static_cast<const CpuTensorState&>(from);
  auto& target = static_cast<CpuTensorState&>(into);
  target.ShapedAs(source);  // MakeShadow's sizes: the scalars are what it takes
  TensorStep t = step;
  t.state = &target;
  t.adopt = nullptr;
  return StepTensor(t, scalars, &source);
} catch (const std::bad_alloc&) {
  return OutOfHostMemory(static_cast<const CpuTensorState&>(from).info);
}

absl::Status CpuBackend::StepTensor(TensorStep& t, const StepScalars& scalars,
                                    const TensorState* from) {
  std::vector<kernels::ServeArgs> cut, per_tensor;
  {
    auto& s = *static_cast<CpuTensorState*>(t.state);
    // fp8_delayed's scale comes from earlier steps' amaxes: known now.
    const float delayed = s.history.NextScale(s.info.delayed_margin, s.delayed_scale).scale;
    for (ServedFormat& f : t.out->formats) {
      if (IsElementwise(f)) continue;  // written by the step's own pass
      if (IsPerTensor(f)) {
        per_tensor.push_back(ServeArgsFor(s, t.out, f, delayed));
      } else {
        cut.push_back(ServeArgsFor(s, t.out, f, 1.0f));
      }
    }
    kernels::CpuTensorStepArgs args;
    args.step = StepArgs(s, t, scalars, static_cast<const CpuTensorState*>(from));
    args.rows = s.info.rows;
    args.cols = s.info.cols;
    args.cut = cut;
    args.per_tensor = per_tensor;
    args.previous_tensor_scale = s.tensor_scale;
    absl::Status combined;  // the amax exchange's own status, kept with its code
    if (t.whole_amax) {
      args.whole_amax = [&t, &combined](float range_amax, float* whole) {
        absl::StatusOr<float> amax = t.whole_amax(range_amax);
        if (!amax.ok()) {
          combined = amax.status();
          return kernels::KStatus(kernels::Code::kInternal, combined.ToString());
        }
        *whole = *amax;
        return kernels::KStatus::Ok();
      };
    }
    kernels::CpuTensorStepResult result;
    const kernels::KStatus stepped = kernels::CpuTensorStep(args, pool_, &result);
    PARAMD_RETURN_IF_ERROR(combined);
    PARAMD_RETURN_IF_ERROR(FromKernel(stepped));
    s.tensor_scale = result.tensor_scale;
    s.delayed_scale = delayed;
    s.history.Append(result.amax);  // after the cast; a skipped step appends nothing
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ReadStateArray(const TensorState& state, StateArray array, int64_t offset,
                                        std::span<uint8_t> out) {
  const auto& s = static_cast<const CpuTensorState&>(state);
  std::span<const uint8_t> bytes;
  auto view = [](const auto& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()),
                                    v.size() * sizeof(v[0]));
  };
  switch (array) {
    case StateArray::kMaster:
      bytes = view(s.master);
      break;
    case StateArray::kMasterRemainder:
      bytes = view(s.remainder);
      break;
    case StateArray::kExpAvg:
      bytes = view(s.exp_avg);
      break;
    case StateArray::kExpAvgScaleInv:
      bytes = view(s.exp_avg_scale_inv);
      break;
    case StateArray::kExpAvgSq:
      bytes = view(s.exp_avg_sq);
      break;
    case StateArray::kExpAvgSqScaleInv:
      bytes = view(s.exp_avg_sq_scale_inv);
      break;
  }
  if (offset < 0 ||
      offset + static_cast<int64_t>(out.size()) > static_cast<int64_t>(bytes.size())) {
    return absl::InternalError(absl::StrCat("state read [", offset, ", +", out.size(),
                                            ") outside an array of ", bytes.size(), " bytes"));
  }
  std::memcpy(out.data(), bytes.data() + offset, out.size());
  return absl::OkStatus();
}

absl::StatusOr<TensorScalars> CpuBackend::ReadStateScalars(const TensorState& state) {
  const auto& s = static_cast<const CpuTensorState&>(state);
  return TensorScalars{s.tensor_scale, s.delayed_scale, s.history.Entries()};
}

absl::StatusOr<std::unique_ptr<TensorState>> CpuBackend::ImportState(const TensorInfo& info,
                                                                     HostTensorState state,
                                                                     ServedTensor* out) try {
  PARAMD_RETURN_IF_ERROR(ServeImportedMaster(info, state, pool_, out));
  auto imported = std::make_unique<CpuTensorState>(info, std::move(state));
  SizeWorking(*imported, *out, pool_);
  return imported;
} catch (const std::bad_alloc&) {
  return OutOfHostMemory(info);
}

absl::StatusOr<TensorCheck> CpuBackend::CheckTensor(const TensorInfo& info,
                                                    const kernels::GradSlots& grad, bool norms,
                                                    bool guest) {
  TensorCheck check;
  check.grad_scale = grad.grad_scale;
  check.norms = norms;
  std::atomic<bool> finite{true};
  absl::Status status;
  absl::Mutex mu;
  auto run = [&](kernels::KStatus st, bool block_finite) {
    if (!block_finite) finite.store(false, std::memory_order_relaxed);
    if (!st.ok()) {
      absl::MutexLock lock(&mu);
      if (status.ok()) status = FromKernel(st);
    }
  };
  auto loop = [&](int64_t n, int64_t grain, const auto& fn) {
    if (guest) {
      pool_.ParallelForAsGuest(n, grain, fn);
    } else {
      pool_.ParallelFor(n, grain, fn);
    }
  };
  if (norms) {
    std::vector<double>& sums = check.block_sums;
    sums.assign(static_cast<size_t>(kernels::NumNormBlocks(info.rows)), 0.0);
    loop(static_cast<int64_t>(sums.size()), 1, [&](int64_t b0, int64_t b1) {
      // The kernel's status first: it writes block_finite, which `run` reads.
      bool block_finite = true;
      const kernels::KStatus st = kernels::GradBlockSumsCpu(grad, info.rows, info.cols, b0, b1,
                                                            sums.data() + b0, &block_finite);
      run(st, block_finite);
    });
  } else {
    loop(info.rows * info.cols, kGrain, [&](int64_t begin, int64_t end) {
      bool block_finite = true;
      const kernels::KStatus st = kernels::GradFiniteCpu(grad, begin, end, &block_finite);
      run(st, block_finite);
    });
  }
  if (!status.ok()) return status;
  check.finite = finite.load();
  return check;
}

absl::StatusOr<TensorCheck> CpuBackend::CheckLanded(const TensorInfo& info,
                                                    std::span<const void* const> slots,
                                                    kernels::SlotType slot_type, float grad_scale,
                                                    bool norms) {
  const kernels::GradSlots grad{slots.data(), static_cast<int>(slots.size()), slot_type,
                                grad_scale};
  return CheckTensor(info, grad, norms, /*guest=*/true);
}

absl::StatusOr<GradientCheck> CpuBackend::CheckGradients(std::span<TensorStep> tensors,
                                                         float grad_scale, bool norms) {
  // Each tensor's share is its own blocks' sums, whoever computed them: a landed check that
  // answers this step (same scale, same bytes) is taken as it is, the others computed now, and
  // StepDecidedOnHost adds them in tensor then block order either way.
  GradientCheck check;
  for (TensorStep& t : tensors) {
    std::vector<double>& sums = check.block_sums.emplace_back();
    if (t.landed != nullptr && t.landed->Answers(grad_scale, norms)) {
      landed_checks_used_.fetch_add(1, std::memory_order_relaxed);
      check.finite = check.finite && t.landed->finite;
      if (norms) sums = t.landed->block_sums;
      continue;
    }
    checked_at_step_.fetch_add(1, std::memory_order_relaxed);
    const auto& s = *static_cast<const CpuTensorState*>(t.state);
    const kernels::GradSlots grad{t.slots.data(), static_cast<int>(t.slots.size()), t.slot_type,
                                  grad_scale};
    PARAMD_ASSIGN_OR_RETURN(TensorCheck mine, CheckTensor(s.info, grad, norms, /*guest=*/false));
    check.finite = check.finite && mine.finite;
    sums = std::move(mine.block_sums);
  }
  return check;
}

}  // namespace paramd
