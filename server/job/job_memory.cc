#include "server/job/job_memory.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "server/backend/backend.h"
#include "server/job/chunk_buffer.h"
#include "server/registration.h"

namespace paramd {
namespace {

using Wide = unsigned __int128;

int64_t Saturated(Wide bytes) {
  constexpr auto kMax = static_cast<Wide>(std::numeric_limits<int64_t>::max());
  return static_cast<int64_t>(bytes > kMax ? kMax : bytes);
}

// What the heap adds to an allocation of `bytes` (64-byte aligned, as HostBuffer's are): the
// rounding, the alignment slack and the allocator's header.
int64_t HeapOverhead(int64_t bytes) { return (64 - bytes % 64) % 64 + 64 + 16; }

}  // namespace

int64_t TensorRecordBytes(const v1::TensorSpec& tensor) {
  // The tensor's entry in the job (state object, served versions' format records, upload chunk
  // map) and its name, kept in the job's spec, the tensor's own spec and the name index.
  return 4096 + 4 * static_cast<int64_t>(tensor.name().size());
}

int64_t SlotRecordBytes(int64_t slot_bytes) {
  // The ChunkBuffer, its buffer's heap overhead, one chunk record (a map node), and the device
  // slot record a rank writing into exported GPU memory gets.
  return static_cast<int64_t>(sizeof(ChunkBuffer)) + HeapOverhead(slot_bytes) + 64 + 48;
}

int64_t EarlyStepBytes(const v1::RegisterRequest& raw) {
  if (!raw.early_step()) return 0;
  const v1::RegisterRequest spec = NormalizedSpec(raw);
  const std::vector<FormatKey> formats = ServedFormats(spec);
  Wide bytes = 0;
  for (int i = 0; i < spec.tensors_size(); ++i) {
    const TensorInfo info = TensorInfoOf(spec, i);
    bytes += static_cast<Wide>(PolicyStateBytes(info).total()) +
             static_cast<Wide>(CpuWorkingBytes(info, formats));
  }
  return Saturated(bytes);
}

MemoryBytes JobFootprint(const v1::RegisterRequest& raw, BackendPlacement placement) {
  const v1::RegisterRequest spec = NormalizedSpec(raw);
  const std::vector<FormatKey> formats = ServedFormats(spec);
  const bool serves_fp32 =
      std::find(formats.begin(), formats.end(),
                FormatKey{v1::RECIPE_FP32, v1::DIRECTION_ROWWISE}) != formats.end();
  const Wide world = static_cast<Wide>(spec.world_size());
  Wide host = 0;
  Wide device = 0;
  for (int i = 0; i < spec.tensors_size(); ++i) {
    const v1::TensorSpec& t = spec.tensors(i);
    const Wide elements = static_cast<Wide>(t.rows()) * static_cast<Wide>(t.cols());
    const TensorInfo info = TensorInfoOf(spec, i);
    const Wide state = static_cast<Wide>(PolicyStateBytes(info).total());
    Wide served = 0;
    for (const FormatKey& f : formats) {
      const kernels::ServeBufferLayout layout = kernels::ServeLayout(
          KernelRecipe(f.recipe), KernelDirection(f.direction), t.rows(), t.cols());
      served += static_cast<Wide>(layout.data_bytes + layout.scale_bytes) +
                static_cast<Wide>(HeapOverhead(layout.data_bytes + layout.scale_bytes));
    }
    const int64_t slot_bytes = t.rows() * t.cols() * ElementBytes(t.grad_type());
    const Wide slots = kSlotSets * world * static_cast<Wide>(slot_bytes);
    const Wide records = kSlotSets * world * static_cast<Wide>(SlotRecordBytes(slot_bytes));
    // The initial weights (FP32) until the first step, and an import's staged copy of the state;
    // a 16-bit master of a job that does not serve FP32 has its FP32 values in a scratch copy
    // while version 0 (or an import's version) is made.
    const bool scratch = !serves_fp32 && info.policy.master != kernels::MasterType::kFp32;
    const Wide transient = 4 * elements + state + (scratch ? 4 * elements : 0);
    host += kServedVersions * served + slots + records + transient +
            static_cast<Wide>(TensorRecordBytes(t));
    if (placement.state_on_device) {
      // State, served versions in exported memory and the backend's own outputs, the device
      // copies of the host slots and the slots ranks write in GPU memory, the step's descriptors.
      device += state + (kServedVersions + 1) * served + world * static_cast<Wide>(slot_bytes) +
                slots + 4096 + 8 * world;
    } else {
      host += state + static_cast<Wide>(CpuWorkingBytes(info, formats));
    }
  }
  // A backend that keeps the state on the device has no early step (it ignores the option).
  if (!placement.state_on_device) host += static_cast<Wide>(EarlyStepBytes(spec));
  return MemoryBytes{Saturated(host), Saturated(device)};
}

}  // namespace paramd
