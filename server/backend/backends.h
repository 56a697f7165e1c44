// The backends this build has, by name: "cpu", and "cuda:N" where the build has CUDA.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "paramd/v1/config.pb.h"
#include "server/backend/backend.h"

namespace paramd {

// The backend `config.backend()` names (one), or an error saying why it cannot be had here.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const v1::DaemonConfig& config);

// The backends a daemon of `config` (valid, defaults applied) holds, in order: its backend list,
// "cuda:all" as cuda:0 .. cuda:N-1 (FAILED_PRECONDITION where this process sees no GPU).
absl::StatusOr<std::vector<std::string>> DaemonBackends(const v1::DaemonConfig& config);

// The config of backend `index` of `backends` (DaemonBackends): `config` with backend set to it.
// With several backends, each takes 1 / n of the host memory budget `host_budget` (resolved), of
// step_threads the cpu ones (at least one each), and checkpoint_dir/NAME with ':' as '_'.
v1::DaemonConfig BackendConfig(const v1::DaemonConfig& config,
                               const std::vector<std::string>& backends, size_t index,
                               int64_t host_budget);

// server/backend/cuda/cuda_backend.cc in builds with CUDA,
// server/backend/cuda/cuda_backend_unavailable.cc without.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device,
                                                         const v1::DaemonConfig& config);
// The GPUs this process sees; FAILED_PRECONDITION saying why where it sees none.
absl::StatusOr<int> CudaDeviceCount();

}  // namespace paramd
