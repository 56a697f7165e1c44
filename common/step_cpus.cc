#include "common/step_cpus.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace paramd {

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text) {
  std::set<int> cpus;
  const std::string trimmed(absl::StripAsciiWhitespace(text));
  if (trimmed.empty()) return std::vector<int>();
  for (const absl::string_view part : absl::StrSplit(trimmed, ',')) {
    const std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    int first = 0, last = 0;
    if (ends.size() > 2 || !absl::SimpleAtoi(ends[0], &first) ||
        !absl::SimpleAtoi(ends.back(), &last) || first < 0 || last < first || last >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", trimmed, "\" is not a CPU list (\"0-3,8\": numbers below ",
                       CPU_SETSIZE, " and ascending ranges)"));
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
  }
  return std::vector<int>(cpus.begin(), cpus.end());
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

std::string CpuListText(const std::vector<int>& cpus) {
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    absl::StrAppend(&text, text.empty() ? "" : ",", cpus[i]);
    if (j > i) absl::StrAppend(&text, "-", cpus[j]);
    i = j + 1;
  }
  return text;
}

absl::StatusOr<std::vector<int>> StepCpus(const v1::DaemonConfig& config,
                                          const std::string& sys_node_dir) {
  const std::vector<int> allowed = AllowedCpus();
  const auto may_run_on = [&](int cpu) {
    return std::binary_search(allowed.begin(), allowed.end(), cpu);
  };
  if (config.step_cpus_size() > 0 && config.has_step_numa_node()) {
    return absl::InvalidArgumentError(
        "config fields step_cpus and step_numa_node are both set; set one of them");
  }
  if (config.has_step_numa_node()) {
    const int node = config.step_numa_node();
    const std::string path = absl::StrCat(sys_node_dir, "/node", node, "/cpulist");
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    if (node < 0 || !in) {
      return absl::InvalidArgumentError(absl::StrCat("config field step_numa_node = ", node,
                                                     " names no NUMA node of this machine (no ",
                                                     path, ")"));
    }
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(text.str());
    if (!cpus.ok()) return cpus.status();
    std::vector<int> usable;
    std::copy_if(cpus->begin(), cpus->end(), std::back_inserter(usable), may_run_on);
    if (usable.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config field step_numa_node = ", node, ": none of its CPUs (", CpuListText(*cpus),
          ") is one this process may run on (", CpuListText(allowed), ")"));
    }
    return usable;
  }
  std::set<int> cpus;
  for (int cpu : config.step_cpus()) {
    if (!may_run_on(cpu)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config field step_cpus names CPU ", cpu, ", which this process may not run on (it may ",
          "run on ", CpuListText(allowed),
          ": its affinity, as taskset or a cgroup's cpuset set it)"));
    }
    cpus.insert(cpu);
  }
  return std::vector<int>(cpus.begin(), cpus.end());
}

}  // namespace paramd
