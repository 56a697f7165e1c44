#include "server/backends.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/cpu_backend.h"

namespace paramd {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const v1::DaemonConfig& config) {
  const std::string& name = config.backend();
  if (name == "cpu") return std::make_unique<CpuBackend>(config.step_threads());
  int device = -1;
  if (absl::StartsWith(name, "cuda:") && absl::SimpleAtoi(name.substr(5), &device) && device >= 0) {
    return MakeCudaBackend(device, config);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("backend \"", name, "\" is not \"cpu\" or \"cuda:N\""));
}

}  // namespace paramd
