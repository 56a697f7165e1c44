// Where a job's state lives and its step runs. `cpu` keeps it in host memory; `cuda:N` (later) on a
// GPU. The coordinator hands a backend whole steps; the backend owns the state buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/fused_step.h"
#include "paramd/v1/types.pb.h"

namespace paramd {

// A serve format as a small value (recipe x direction), usable as a key.
struct FormatKey {
  v1::Recipe recipe = v1::RECIPE_FP32;
  v1::Direction direction = v1::DIRECTION_ROWWISE;
  friend bool operator==(const FormatKey&, const FormatKey&) = default;
};
std::string FormatName(const FormatKey& format);
// Bytes per element of a served recipe's data (fp32 4, bf16 2).
int64_t ServedElementBytes(v1::Recipe recipe);

// The served bytes of one version of one tensor. Immutable once published: a reader holding the
// pointer holds a lease on that version; the next step writes other buffers.
struct ServedTensor {
  int64_t version = -1;
  bool skipped = false;
  std::vector<std::pair<FormatKey, std::vector<uint8_t>>> formats;

  const std::vector<uint8_t>* Find(const FormatKey& format) const;
  int64_t bytes() const;
};

// One tensor's optimizer state on a backend.
class TensorState {
 public:
  virtual ~TensorState() = default;
  virtual int64_t elements() const = 0;
  // Bytes of master weights and moments.
  virtual int64_t state_bytes() const = 0;
};

// The inputs of one tensor's step.
struct TensorStep {
  TensorState* state = nullptr;
  std::vector<const void*> slots;  // one gradient buffer per rank, rank order
  kernels::SlotType slot_type = kernels::SlotType::kFp32;
  ServedTensor* out = nullptr;  // formats already sized; the backend fills the bytes
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Creates a tensor's state from its initial FP32 weights and fills `out` (version 0's bytes).
  virtual absl::StatusOr<std::unique_ptr<TensorState>> CreateState(std::span<const float> initial,
                                                                   ServedTensor* out) = 0;
  // Runs one step over the tensors, in order, with the job-wide scalars.
  virtual absl::Status Step(std::span<TensorStep> tensors, const kernels::AdamwScalars& scalars,
                            float grad_scale) = 0;
};

}  // namespace paramd
