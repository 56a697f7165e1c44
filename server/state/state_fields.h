// The fields of a tensor's exported state (Control.ExportState / ImportState; client/job_state.h
// documents them for users): their names, stored dtypes and shapes under a state policy and a
// job's serve formats, in export order.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "paramd/v1/types.pb.h"
#include "server/backend/backend.h"

namespace paramd {

enum class StateFieldKind {
  kMaster,
  kMasterRemainder,
  kExpAvg,
  kExpAvgScales,
  kExpAvgSq,
  kExpAvgSqScales,
  kFp8TensorScale,
  kFp8DelayedScale,
  kFp8DelayedHistory,
};

struct StateFieldSpec {
  StateFieldKind kind = StateFieldKind::kMaster;
  std::string name;  // "master", "exp_avg_scales", ... (client/job_state.h)
  v1::ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED;
  // Shape in elements. kFp8DelayedHistory: [the history's capacity]; a state holds [n] with n at
  // most that.
  std::vector<int64_t> shape;
  std::optional<StateArray> array;  // set for the fields that are arrays of the backend's state

  int64_t elements() const;
  int64_t bytes() const;
};

// The fields of a tensor's state with `info`'s policy in a job serving `formats`, in export order.
std::vector<StateFieldSpec> TensorStateFields(const TensorInfo& info,
                                              std::span<const FormatKey> formats);

}  // namespace paramd
