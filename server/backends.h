// The backends this build has, by name: "cpu", and "cuda:N" where the build has CUDA.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "paramd/v1/config.pb.h"
#include "server/backend.h"

namespace paramd {

// The backend `config.backend()` names, or an error saying why it cannot be had here.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const v1::DaemonConfig& config);

// server/cuda_backend.cc in builds with CUDA, server/cuda_backend_unavailable.cc without.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device,
                                                         const v1::DaemonConfig& config);

}  // namespace paramd
