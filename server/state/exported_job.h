// A job as the export of its state sees it: the one way server/state/ reaches a job (job/
// implements it, ExportOf in server/job/job.h). Plain C++.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "paramd/v1/control.pb.h"
#include "server/backend/backend.h"

namespace paramd {

class ExportedJob {
 public:
  struct Tensor {
    std::string name;
    TensorInfo info;
    const TensorState* state;
  };
  // What an export reads: the header, every tensor in registration order, the served formats
  // (whose scales are state) and the backend that holds the state.
  struct Snapshot {
    v1::StateHeader header;
    std::vector<Tensor> tensors;
    std::vector<FormatKey> formats;
    Backend* backend;
  };
  using Start = std::function<void(absl::StatusOr<Snapshot>)>;

  virtual ~ExportedJob() = default;
  // Starts an export once every step committed before this call ran, then holds later steps back
  // until EndExport. `start` gets the snapshot (or why there is none): at once when no committed
  // step is queued or running, else from the thread that finishes the last of them; it is called
  // without the job's lock, and nothing waits for it.
  virtual void BeginExport(Start start) = 0;
  // The export ended: the steps held meanwhile may run.
  virtual void EndExport() = 0;
};

}  // namespace paramd
