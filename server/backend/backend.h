// Where a job's state lives and its step runs. `cpu` keeps it in host memory; `cuda:N` (later) on a
// GPU. The coordinator hands a backend whole steps; the backend owns the state buffers.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/aligned_vector.h"
#include "common/device_bytes.h"
#include "common/host_buffer.h"
#include "common/kernel_formats.h"
#include "kernels/fused_step.h"
#include "kernels/recipes.h"
#include "paramd/v1/control.pb.h"
#include "paramd/v1/data.pb.h"
#include "paramd/v1/types.pb.h"

namespace paramd {

// A serve format as a small value (recipe x direction), usable as a key.
struct FormatKey {
  v1::Recipe recipe = v1::RECIPE_FP32;
  v1::Direction direction = v1::DIRECTION_ROWWISE;
  friend bool operator==(const FormatKey&, const FormatKey&) = default;
};
std::string FormatName(const FormatKey& format);
// The key of a format as the protocol spells it (DIRECTION_UNSPECIFIED means rowwise).
FormatKey FormatKeyOf(const v1::ServeFormat& format);

// One served format of one version: its bytes (data, then scales) and how they are laid out.
struct ServedFormat {
  FormatKey key;
  kernels::ServeBufferLayout layout;
  HostBuffer bytes;  // layout.data_bytes + layout.scale_bytes
  // The same bytes in the backend's exported GPU memory (trainers on the node read them in place);
  // empty where the backend exports none. The backend fills both.
  DeviceBytes device;

  uint8_t* data() { return bytes.data(); }
  uint8_t* scales() { return bytes.data() + layout.data_bytes; }
};

// The served bytes of one version of one tensor. Immutable once published: a reader holding the
// pointer holds a lease on that version; the next step writes other buffers. Device bytes may be
// published while their step still runs on the GPU: readers wait for DeviceExports::step_event.
struct ServedTensor {
  int64_t version = -1;
  std::atomic<bool> skipped{false};
  std::vector<ServedFormat> formats;  // the job's formats in order (ServedFormats)
  // True while the host bytes of the formats that also lie in GPU memory are not copied down yet:
  // a cuda:N step leaves them on the GPU, and a host reader (a pull of streamed bytes) asks the
  // backend for them once per version (HostStagingAbility::ReadyHostBytes).
  mutable absl::Mutex host_mu;
  mutable bool host_stale ABSL_GUARDED_BY(host_mu) = false;

 private:
  mutable absl::Mutex outcome_mu_;
  bool outcome_pending_ ABSL_GUARDED_BY(outcome_mu_) = false;

 public:
  // A step decided on the device (Backend::Step on cuda:N) publishes its versions before it
  // knows whether it was skipped: the outcome is pending from publication until the step has run,
  // then `skipped` holds it.
  void SetOutcomePending();
  void ResolveOutcome(bool was_skipped);
  bool outcome_pending() const;
  // Where the backend copies the step's found-inf flag to host memory (0: skipped), readable once
  // the step has run; a host reader that waited for the step resolves the outcome from it
  // (HostStagingAbility::ReadyHostBytes) before the job does. Null where no outcome is pending.
  const int* decision_flag = nullptr;

  const ServedFormat* Find(const FormatKey& format) const;
  // The FP32 rowwise bytes, or null where the job does not serve FP32.
  float* Fp32() {
    for (ServedFormat& f : formats) {
      if (f.key == FormatKey{v1::RECIPE_FP32, v1::DIRECTION_ROWWISE}) {
        return reinterpret_cast<float*>(f.data());
      }
    }
    return nullptr;
  }
  int64_t bytes() const;
};

// A row range of a tensor split over owners (TensorInfo::row_offset), served in a per-tensor recipe
// (fp8_tensor, fp8_delayed): given the amax of the range's stored master, returns the whole
// tensor's, every owner's combined (DESIGN.md §3). Its error fails the call that asked. Null for a
// whole tensor.
using WholeAmax = std::function<absl::StatusOr<float>(float range_amax)>;

// What a backend needs to know about one tensor of a job.
struct TensorInfo {
  int64_t rows = 0;
  int64_t cols = 0;
  uint32_t index = 0;  // registration index in the job (stochastic rounding's counter)
  // A row range [row_offset, row_offset + rows) of a tensor split over owners (DESIGN.md §7): its
  // first row in the whole tensor, a multiple of 128, so that its moment chunks, norm blocks and
  // 128-row serve blocks are the whole tensor's and its random bits those of the same elements
  // (kernels::RngStream::index_offset). 0 for a whole tensor.
  int64_t row_offset = 0;
  // The index in the whole tensor of the range's first element (RngStream::index_offset).
  uint64_t first_element() const { return static_cast<uint64_t>(row_offset * cols); }
  kernels::StatePolicy policy;
  int delayed_history = 16;  // fp8_delayed: amax history length
  int delayed_margin = 0;    // fp8_delayed: margin
};

// Bytes of state by kind (proto StateBytes).
struct StateBytes {
  int64_t master = 0;
  int64_t exp_avg = 0;
  int64_t exp_avg_sq = 0;
  int64_t moment_scales = 0;
  int64_t total() const { return master + exp_avg + exp_avg_sq + moment_scales; }
};

// The bytes a tensor's state takes under its policy (DESIGN.md §10's formula: master, moments and
// their per-chunk scales). Every backend allocates exactly this.
StateBytes PolicyStateBytes(const TensorInfo& info);

// Whether a format is a rowwise plain cast (FP32, BF16, FP16), which the step writes in its own
// pass; the block and per-tensor formats and the columnwise ones are cut from FP32 values after it.
bool WrittenInTheStepsPass(const FormatKey& format);

// The kernel's arguments for one served format of a tensor (kernels/recipes.h), cut from `fp32`
// (its FP32 values) with `tensor_scale` for a per-tensor recipe; a bf16 format of a bf16+remainder
// master passes that master's halves, which it serves as they are.
kernels::ServeArgs ServeArgsOf(const TensorInfo& info, const float* fp32,
                               const uint16_t* bf16_halves, float tensor_scale, ServedFormat& f);

// The FP32 values the cpu backend keeps beside a tensor's master to cut its other formats from:
// 4 B per element where the job does not serve FP32 rowwise, the master is 16-bit, and a format
// is cut after the step; else 0 (the served FP32 bytes or an FP32 master are those values).
int64_t CpuWorkingBytes(const TensorInfo& info, std::span<const FormatKey> formats);

// One tensor's optimizer state on a backend.
class TensorState {
 public:
  virtual ~TensorState() = default;
  virtual StateBytes state_bytes() const = 0;
};

// The arrays of a tensor's state (exported and imported in their stored dtypes, see
// server/state/state_fields.h for their names, types and shapes).
enum class StateArray {
  kMaster,            // FP32, FP16 codes, or the served BF16 halves of a bf16+remainder master
  kMasterRemainder,   // int16 remainders (bf16+remainder only)
  kExpAvg,            // codes of the policy's exp_avg type
  kExpAvgScaleInv,    // FP32 1/s per 128-element chunk (fp16 and fp8 exp_avg only)
  kExpAvgSq,          // codes of the policy's exp_avg_sq type
  kExpAvgSqScaleInv,  // likewise for exp_avg_sq
};

// The scalars a tensor's next step depends on besides its arrays.
struct TensorScalars {
  float fp8_tensor_scale = 1.0f;       // fp8_tensor: the scale of the served version
  float fp8_delayed_scale = 1.0f;      // fp8_delayed: likewise
  std::vector<float> delayed_history;  // fp8_delayed: amax history, oldest first
};

// A tensor's whole state on the host, as imported (checked against the tensor's TensorInfo: every
// array has its policy's size, unused ones are empty; the history holds at most
// info.delayed_history entries).
struct HostTensorState {
  // 64-byte aligned (common/aligned_vector.h): a cpu backend keeps them as its state's arrays.
  AlignedVector<uint8_t> master;
  AlignedVector<int16_t> remainder;
  AlignedVector<uint8_t> exp_avg;
  AlignedVector<float> exp_avg_scale_inv;
  AlignedVector<uint8_t> exp_avg_sq;
  AlignedVector<float> exp_avg_sq_scale_inv;
  TensorScalars scalars;
};

// One tensor's share of a GradientCheck, computed as its gradients landed
// (LandedCheckAbility::CheckLanded): the scale it was computed with, whether its block sums were,
// its finiteness and its FP64 block sums (DESIGN.md §2), the very values a check at the step gives
// for the same bytes and scale.
struct TensorCheck {
  float grad_scale = 1.0f;
  bool norms = false;
  bool finite = true;
  std::vector<double> block_sums;  // one per 128-row block where `norms`
  // Whether it is the check a step with this scale asks for: the same FP32 scale, bit for bit (a
  // different scale rounds gs differently), and the block sums where the step needs them.
  bool Answers(float step_grad_scale, bool step_norms) const;
};

// The inputs of one tensor's step.
struct TensorStep {
  TensorState* state = nullptr;
  std::vector<const void*> slots;  // one gradient buffer per rank, rank order
  // Per rank (empty = none): a gradient a trainer wrote into the backend's exported GPU memory;
  // where set, the step reads it there and slots[r] is not read.
  std::vector<const void*> device_slots;
  kernels::SlotType slot_type = kernels::SlotType::kFp32;
  ServedTensor* out = nullptr;  // formats already sized; the backend fills the bytes
  // Per rank (empty = none): the event (LentReadyEvent's) its lent gradient's reads wait for on
  // the device (the step's first launch that reads it). And the version this step follows, which
  // a skipped step re-serves (alive until the step returns).
  std::vector<const void*> ready_events;
  const ServedTensor* previous = nullptr;
  // Called once between the step's pass and the per-tensor pass, with the amax of the new master.
  WholeAmax whole_amax;
  // The check of these slots computed as they landed (LandedCheckAbility), alive while the step
  // runs; null where there is none. A backend that has the ability uses it in CheckGradients
  // instead of reading the gradients again where it Answers the step, else checks them itself.
  const TensorCheck* landed = nullptr;
  // The state an early step of this tensor made for this very step (EarlyStepAbility::StepEarly,
  // with the step's scalars, from `state` and these slots), whose served bytes `out` already
  // holds; null where there is none. An applied step takes it in place of `state` (an O(1) swap
  // of their buffers) instead of stepping the tensor; a skipped step leaves both as they are.
  TensorState* adopt = nullptr;
};

// What a step came to (Backend::Step).
struct StepOutcome {
  bool skipped = false;
  float clip = 1.0f;
};

// The job-wide scalars of one step.
struct StepScalars {
  kernels::AdamwScalars adamw{};
  float grad_scale = 1.0f;
  float clip = 1.0f;
  uint64_t seed = 0;  // the job's seed (stochastic rounding)
  int64_t k = 1;      // applied steps including this one
};

// The job-wide checks of a step's gradients (DESIGN.md §2): all finite, and the FP64 sums of
// squares per 128-row block of each tensor, in tensor order then block order.
struct GradientCheck {
  bool finite = true;
  std::vector<std::vector<double>> block_sums;  // [tensor][block]
};

// The check a step is decided by: whether every gradient of the job is finite, and the job's block
// sums in registration order, then block order (all its daemons' where it is sharded).
struct JobCheck {
  bool finite = true;
  std::vector<double> block_sums;
};

// A sharded job's daemons agreeing on a step's check (DESIGN.md §7; server/shard/): from this
// daemon's check of its part, the whole job's. Its error fails the step.
using CheckAgreement = std::function<absl::StatusOr<JobCheck>(const GradientCheck& local)>;

// Publishes tensors [begin, end) of a step: their served bytes (TensorStep::out) are final, or
// their writes queued before the backend's step event (DeviceExports). `decided` is the step's
// outcome where it was decided before them (on the host); null while the device decides it: the
// versions are published with their outcome pending, resolved from what Step returns.
using StepPublisher = std::function<void(size_t begin, size_t end, const StepOutcome* decided)>;

// One step of a job (Backend::Step).
struct StepInput {
  std::span<TensorStep> tensors;
  StepScalars scalars;       // `clip` is the step's to decide, not read
  double max_grad_norm = 0;  // > 0: the clip from the job's global norm (DESIGN.md §2)
  // Null for a job on this daemon alone: its check is the job's, and the backend may decide the
  // step where the gradients lie.
  CheckAgreement agreement;
  StepPublisher publish;  // every tensor is published before Step returns OK
};

// What a backend may hand out besides its core (Backend::exported_memory() and the like): each
// ability is an interface a backend implements or not, and a caller asks for it (null: the backend
// has none) instead of calling a method that does nothing. `cuda:N` has the first three below; the
// cpu backend the LandedCheckAbility and the EarlyStepAbility.

// GPU memory trainers on this node map (DESIGN.md §6), each job's of its own, and trainers' GPU
// memory lent for a step's gradients. A backend without it (cpu) exports none, and the job keeps
// every buffer in host memory.
class ExportedMemoryAbility {
 public:
  // What a trainer of `job` needs to map that job's memory (its device, the step event, the job's
  // allocations alone; no allocation for "").
  virtual DeviceExports Exports(const std::string& job = "") const = 0;
  // Job `job`'s exported memory, which the job keeps while it lives.
  virtual std::shared_ptr<ExportedMemory> ExportedMemoryFor(const std::string& job) = 0;
  // `bytes` of GPU memory a trainer lent for a step's gradient (cuda_ipc: InPlaceMark.lent), mapped
  // where the step reads them: valid while the result lives (server/backend/cuda/lent_memory.h).
  virtual absl::StatusOr<std::shared_ptr<const void>> MapLent(const v1::LentMemory& lent,
                                                              int64_t bytes) = 0;
  // The event a lent gradient's mark names (LentMemory.ready_event), opened here and kept while the
  // backend lives; null where the mark names none (the trainer's work had completed). The step's
  // reads of that gradient wait for it on the device (TensorStep::ready_events).
  virtual absl::StatusOr<const void*> LentReadyEvent(const v1::LentMemory& lent) = 0;

 protected:
  ~ExportedMemoryAbility() = default;
};

// Host memory of the backend's own for the jobs' slots and served bytes, and served bytes a step
// leaves in GPU memory until a host reader asks for them (cuda:N).
class HostStagingAbility {
 public:
  // Host memory for jobs' gradient slots and served bytes (cuda:N: page-locked, so the copies to
  // and from the GPU run at the link's speed). It lives as long as the process. A backend without
  // this ability leaves the choice to the daemon (shared memory, or the heap).
  virtual BufferAllocator* HostAllocator() = 0;
  // Makes `served`'s host bytes current for a host reader: a copy down from GPU memory, once per
  // version, where the step left them there (ServedTensor::host_stale); OK at once elsewhere. A
  // version whose outcome is pending (a step decided on the device) is waited for, and its
  // outcome resolved.
  virtual absl::Status ReadyHostBytes(const ServedTensor& served) = 0;
  // Versions copied down so far by ReadyHostBytes (a test counts them).
  virtual int64_t host_copies() const = 0;

 protected:
  ~HostStagingAbility() = default;
};

// State and served formats in GPU memory (cuda:N), which the daemon's device memory budget then
// covers (server/job/job_memory.h).
class DeviceMemoryAbility {
 public:
  // Free GPU memory now, bytes.
  virtual absl::StatusOr<int64_t> FreeDeviceMemory() = 0;
  // Step plans made so far (the backend keeps its steps' plans in GPU memory and makes one only
  // for a step whose tensors' buffers it has not seen in a recent step; a test counts them).
  virtual int64_t plans_made() const = 0;

 protected:
  ~DeviceMemoryAbility() = default;
};

// The gradient check of one tensor computed when its last slot lands, before the commit
// (DESIGN.md §2), on the host: the job runs it where the backend has this ability (cpu), outside
// the job's lock, and hands the result to the step (TensorStep::landed). Exact by construction: it
// is the same kernel over the same bytes as the step's own check, with the scale the step is
// expected to run with (a rank's commit of the step, else the previous step's); a step whose scale
// differs, or whose slots may have changed since, checks them again (CheckGradients).
class LandedCheckAbility {
 public:
  // Finiteness of `slots` (rank order, the step's) * grad_scale and its square, and with `norms`
  // the block sums of tensor `info`'s gradient: CheckGradients' values for that tensor. Runs on
  // the caller's thread with the backend's step threads; safe while a step runs.
  virtual absl::StatusOr<TensorCheck> CheckLanded(const TensorInfo& info,
                                                  std::span<const void* const> slots,
                                                  kernels::SlotType slot_type, float grad_scale,
                                                  bool norms) = 0;
  // Tensors whose gradients CheckGradients read at a step (no landed check answered it), and
  // tensors whose landed check it used instead (a test counts them).
  virtual int64_t checked_at_step() const = 0;
  virtual int64_t landed_checks_used() const = 0;

 protected:
  ~LandedCheckAbility() = default;
};

// The early step (RegisterRequest.early_step, docs/host_tier.md): one tensor stepped as soon as its
// gradients landed, before the commits, into a second state (a shadow) and the next version's
// served bytes, leaving the tensor's state as it is; the job hands the shadow to the step
// (TensorStep::adopt) where the step turns out to be the one predicted. The cpu backend has it.
class EarlyStepAbility {
 public:
  // A second state of `of`'s tensor for its early steps, every array sized and written now: the job
  // makes it with the tensor's state, where the budget reserved it, so no early step faults its
  // memory in (made at the first early step instead, that first touch held the GPU machine's host
  // to 0.1 G elements/s on those tensors, against 2-3 for the rest).
  virtual absl::StatusOr<std::unique_ptr<TensorState>> MakeShadow(const TensorState& of) = 0;
  // Steps `from` with `step`'s slots and `scalars` (clip 1) into `into` (MakeShadow's, of `from`'s
  // tensor), and writes every format of `step.out`: the state and bytes a step of `from` with these
  // inputs gives, bit for bit; `from` is only read. step.state is ignored. Runs on the caller's
  // thread with the backend's step threads; the job runs no step of the tensor meanwhile.
  virtual absl::Status StepEarly(const TensorState& from, TensorState& into, const TensorStep& step,
                                 const StepScalars& scalars) = 0;
  // Tensors whose early state a step adopted (a test counts them).
  virtual int64_t early_steps_adopted() const = 0;

 protected:
  ~EarlyStepAbility() = default;
};

// A backend's core: its state's creation, import and export, and the step.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Creates a tensor's state from its initial FP32 weights and fills `out` (version 0's bytes);
  // `whole_amax` gives a split tensor's fp8_tensor scale the whole tensor's amax.
  virtual absl::StatusOr<std::unique_ptr<TensorState>> CreateState(const TensorInfo& info,
                                                                   std::span<const float> initial,
                                                                   ServedTensor* out,
                                                                   const WholeAmax& whole_amax) = 0;
  // One step of a job (DESIGN.md §2): the check of its gradients, a sharded job's agreement on it
  // (input.agreement), the decision (skipped where a gradient is not finite; else the clip from
  // the block sums where max_grad_norm > 0), then the step, or for a skipped one each tensor's new
  // version re-serving its previous bytes, the state left as it is. Every tensor is published
  // through input.publish; the outcome is returned once the step has run, its state final. The
  // backend chooses where the check and the decision run: on the host by default
  // (StepDecidedOnHost), `cuda:N` on the device for a job on one daemon, the host waiting for
  // nothing before it publishes the versions (pending).
  virtual absl::StatusOr<StepOutcome> Step(const StepInput& input) {
    return StepDecidedOnHost(input);
  }

  // The pieces of a step decided on the host.
  // Finiteness of the tensors' gradients (g0 * grad_scale and its square), and with `norms` their
  // per-block sums of squares. The first reader of a step's gradients, also of lent ones: its
  // reads wait for their TensorStep::ready_events on the device. A backend with the
  // LandedCheckAbility takes a tensor's share from TensorStep::landed where that answers the step,
  // without reading its gradients.
  virtual absl::StatusOr<GradientCheck> CheckGradients(std::span<TensorStep> tensors,
                                                       float grad_scale, bool norms) = 0;
  // Applies one step to the tensors, in order, after CheckGradients of the same tensors (a
  // backend may prepare the step there). `tensor_done(i)`, when set, is called once tensor i's
  // state and served bytes are final (tensors[i].out complete), so it can be published while
  // later tensors are still being stepped; every tensor is reported before ApplyStep returns OK. A
  // backend whose served bytes lie in GPU memory may report them once their writes are queued,
  // with its step event recorded after them (DeviceExports); the state is final when ApplyStep
  // returns. A tensor whose TensorStep::adopt is set takes that state instead of being stepped.
  virtual absl::Status ApplyStep(std::span<TensorStep> tensors, const StepScalars& scalars,
                                 const std::function<void(size_t)>& tensor_done = nullptr) = 0;
  // A skipped step: each tensor's new version re-serves its `previous` bytes, wherever they lie;
  // `tensor_done(i)` once tensor i's are there. This default copies the host bytes.
  virtual absl::Status ServePrevious(std::span<TensorStep> tensors,
                                     const std::function<void(size_t)>& tensor_done);
  // CheckGradients, the agreement, the decision, then ApplyStep or ServePrevious.
  absl::StatusOr<StepOutcome> StepDecidedOnHost(const StepInput& input);

  // State export and import (Control.ExportState / ImportState). The job guarantees that no step
  // of the tensor runs meanwhile.
  // Copies bytes [offset, offset + out.size()) of one array of `state` to host memory `out`.
  virtual absl::Status ReadStateArray(const TensorState& state, StateArray array, int64_t offset,
                                      std::span<uint8_t> out) = 0;
  virtual absl::StatusOr<TensorScalars> ReadStateScalars(const TensorState& state) = 0;
  // Creates a tensor's state from an imported one (taking its buffers where it can) and fills
  // every format of `out` (sized by the job) from the imported master, with the imported per-tensor
  // scales: the served bytes of the version the state was exported at.
  virtual absl::StatusOr<std::unique_ptr<TensorState>> ImportState(const TensorInfo& info,
                                                                   HostTensorState state,
                                                                   ServedTensor* out) = 0;

  // OK while the backend can step; once it cannot (a sticky CUDA error poisons the context), the
  // reason, and every job of it fails with it. Asked after a step failed.
  virtual absl::Status Health() { return absl::OkStatus(); }

  // Its abilities, each null where the backend has none (the interfaces above).
  virtual ExportedMemoryAbility* exported_memory() { return nullptr; }
  virtual HostStagingAbility* host_staging() { return nullptr; }
  virtual DeviceMemoryAbility* device_memory() { return nullptr; }
  virtual LandedCheckAbility* landed_check() { return nullptr; }
  virtual EarlyStepAbility* early_step() { return nullptr; }
};

}  // namespace paramd
