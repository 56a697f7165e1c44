// Where the cpu backend's step threads run (DaemonConfig.step_cpus, step_numa_node): the CPUs as
// the kernel numbers them, checked against those this process may run on.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "paramd/v1/config.pb.h"

namespace paramd {

// The CPUs of a kernel CPU list ("0-3,8,10-11", as sysfs and taskset write them), ascending.
// INVALID_ARGUMENT for anything else.
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text);

// The CPUs this process may run on (its affinity), ascending.
std::vector<int> AllowedCpus();

// The step threads' CPUs of `config`, ascending: step_cpus, or the CPUs of NUMA node
// step_numa_node (read under `sys_node_dir`, /sys/devices/system/node by default) this process
// may run on; empty where neither is set. INVALID_ARGUMENT naming the field where both are set, a
// CPU is not one this process may run on, or the node does not exist or has none of them.
absl::StatusOr<std::vector<int>> StepCpus(
    const v1::DaemonConfig& config, const std::string& sys_node_dir = "/sys/devices/system/node");

// "0-3,8" for {0, 1, 2, 3, 8}: the form ParseCpuList reads, for messages and logs.
std::string CpuListText(const std::vector<int>& cpus);

}  // namespace paramd
