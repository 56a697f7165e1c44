#include "server/backend/backends.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "common/step_cpus.h"
#include "server/backend/cpu_backend.h"

namespace paramd {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const v1::DaemonConfig& config) {
  PARAMD_ASSIGN_OR_RETURN(const int device, BackendDevice(config.backend()));
  if (device == kCpuDevice) {
    PARAMD_ASSIGN_OR_RETURN(std::vector<int> cpus, StepCpus(config));
    if (!cpus.empty()) {
      PARAMD_LOG(INFO) << "backend " << config.backend() << ": " << config.step_threads()
                       << " step threads on CPUs " << CpuListText(cpus);
    }
    return std::make_unique<CpuBackend>(config.step_threads(), config.backend(), std::move(cpus));
  }
  return MakeCudaBackend(device, config);
}

absl::StatusOr<std::vector<std::string>> DaemonBackends(const v1::DaemonConfig& config) {
  if (config.backend() != kAllGpus) return ConfigBackends(config.backend());
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("backend \"", kAllGpus, "\": ", count.status().message()));
  }
  std::vector<std::string> names;
  for (int device = 0; device < std::min(*count, kMaxBackends); ++device) {
    names.push_back(absl::StrCat("cuda:", device));
  }
  return names;
}

v1::DaemonConfig BackendConfig(const v1::DaemonConfig& config,
                               const std::vector<std::string>& backends, size_t index,
                               int64_t host_budget) {
  v1::DaemonConfig one = config;
  const std::string& name = backends[index];
  one.set_backend(name);
  const int n = static_cast<int>(backends.size());
  if (n == 1) return one;
  one.set_memory_budget_bytes(host_budget / n);
  const int cpus =
      static_cast<int>(std::count_if(backends.begin(), backends.end(), [](const std::string& b) {
        return !absl::StartsWith(b, "cuda:");
      }));
  if (!absl::StartsWith(name, "cuda:"))
    one.set_step_threads(std::max(1, config.step_threads() / cpus));
  if (!config.checkpoint_dir().empty()) {
    std::string dir = name;
    std::replace(dir.begin(), dir.end(), ':', '_');
    one.set_checkpoint_dir((std::filesystem::path(config.checkpoint_dir()) / dir).string());
  }
  return one;
}

}  // namespace paramd
