// Every byte a job may hold, counted once at Register for the daemon's memory budget
// (server/memory_budget.h): DESIGN.md §10's memory formula (JobRegistry::JobBytes: the state, the
// published and the retired served version, two gradient slot sets) plus what the daemon keeps
// around it: a third served version (for a reader that lags), the next step's slot set (trainers
// ask for its places ahead), the initial weights while they arrive, an import's staged state, and
// the bookkeeping per tensor and per (tensor, rank) slot. The daemon never holds more: the job
// caps its slot sets at kSlotSets, and a step waits for a served version's readers rather than
// allocating one past kServedVersions.
#pragma once

#include <cstdint>

#include "paramd/v1/control.pb.h"
#include "server/memory_budget.h"

namespace paramd {

// Gradient slot sets a job holds at most: the step running (or queued), the step collected, and
// the step after it, whose places trainers ask for ahead.
inline constexpr int kSlotSets = 3;
// Served versions per tensor: the published one, the one the next step writes, and one more that
// a reader may still lease (a lagging rank, an in-place view kept over a step); with all of them
// leased, a step waits for a lease to end.
inline constexpr int kServedVersions = 3;

// Where a backend keeps a job's bytes.
struct BackendPlacement {
  bool state_on_device = false;  // cuda:N: state and served formats in GPU memory
};

// The bytes a job of this (validated) description may hold, host and GPU, saturated at int64's
// maximum; with early_step, EarlyStepBytes more in host memory where the state is (the cpu
// backend).
MemoryBytes JobFootprint(const v1::RegisterRequest& spec, BackendPlacement placement);

// The second copy of the state a job with early_step keeps (each tensor's shadow: its state and
// the cpu backend's working copy); 0 without early_step.
int64_t EarlyStepBytes(const v1::RegisterRequest& spec);

// Bytes of bookkeeping per tensor, and per (tensor, rank) slot record of one slot set; what the
// footprint counts for them (their sizes in this build, with the allocator's overhead).
int64_t TensorRecordBytes(const v1::TensorSpec& tensor);
int64_t SlotRecordBytes(int64_t slot_bytes);

}  // namespace paramd
