// A job's optimizer state as the daemon stores it, for Client::ExportState / Client::ImportState
// (a PyTorch optimizer's state_dict() / load_state_dict()). Every field keeps its stored dtype and
// its scales, so export -> import -> continue training is bit-identical to uninterrupted training.
//
// Fields of one tensor (`StateField::field`), present as the job's state policy and serve formats
// say; shapes are [rows, cols] of the tensor unless noted, bytes little-endian and row-major:
//
//   "master"              the master weights: FP32 (MASTER_TYPE_FP32), FP16 (MASTER_TYPE_FP16), or
//                         BF16 (MASTER_TYPE_BF16_REMAINDER: the served high half, rounded as
//                         DESIGN.md §3 says, not truncated)
//   "master_remainder"    INT16, MASTER_TYPE_BF16_REMAINDER only: the low 16 bits of the FP32
//                         master; FP32 bits = (master - (remainder < 0)) << 16 | (uint16)remainder
//   "exp_avg"             FP32, BF16, FP16 or FP8_E4M3 codes, as the policy's exp_avg type
//   "exp_avg_scales"      FP32 [ceil(rows * cols / 128)], FP16 and FP8 exp_avg only: per
//   128-element
//                         chunk of the flattened tensor the value 1 / s (a power of two), so
//                         moment = code * value
//   "exp_avg_sq"          as "exp_avg", for the policy's exp_avg_sq type
//   "exp_avg_sq_scales"   as "exp_avg_scales", for exp_avg_sq
//   "fp8_tensor_scale"    FP32 [1], jobs serving RECIPE_FP8_TENSOR only: the scale (not its
//                         inverse) the served version was cast with; the next step keeps it when
//                         the new weights' amax is 0 or not finite
//   "fp8_delayed_scale"   FP32 [1], jobs serving RECIPE_FP8_DELAYED only: likewise, the scale of
//                         the served version (the next step's fallback)
//   "fp8_delayed_history" FP32 [n], RECIPE_FP8_DELAYED only: the amax history, oldest first,
//                         0 <= n <= the job's amax_history (n grows by one per applied step)
//
// An export lists the fields tensor by tensor in registration order, in the order above. An import
// takes them in any order; each one must be present exactly once with the type and shape the job
// expects, or the import is refused (INVALID_ARGUMENT naming the tensor and field) and changes
// nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/element_type.h"  // ElementTypeBytes: bytes per element of a field's type
#include "paramd/v1/types.pb.h"

namespace paramd {

// One stored array (or scalar) of one tensor's state.
struct StateField {
  std::string tensor;  // the tensor's name in the job
  std::string field;   // one of the names above
  v1::ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED;
  std::vector<int64_t> shape;    // elements = the product; bytes = elements * size of `type`
  std::vector<std::byte> bytes;  // little-endian, row-major
};

// The whole state of a job on one daemon at a step boundary.
struct JobState {
  std::string job;
  // The step whose gradients the state consumes next; also the version it serves (step t
  // publishes version t + 1, version 0 = initial weights). After an import the job collects this
  // step and serves this version, recomputed from the imported master.
  int64_t next_step = 0;
  // Applied steps: the bias-correction counter k of the last applied step (skipped steps do not
  // count). The next applied step uses k = applied_steps + 1.
  int64_t applied_steps = 0;
  // Steps skipped for a non-finite gradient (next_step = applied_steps + skipped_steps).
  int64_t skipped_steps = 0;
  // The job's seed (stochastic rounding's key). An import must carry the job's registered seed.
  uint64_t seed = 0;
  // The job's current hyper-parameters (lr and weight_decay as SetHyperparams left them). An
  // import replaces lr and weight_decay; beta1, beta2 and eps must equal the registered ones.
  v1::AdamwHyperparams hyperparams;
  // The job's state policy with defaults filled in; an import must carry the job's.
  v1::StatePolicy state_policy;
  std::vector<StateField> fields;
};

}  // namespace paramd
