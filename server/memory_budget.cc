#include "server/memory_budget.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"

namespace paramd {
namespace {

// The first number of a one-line file; nullopt where it is missing or says "max".
std::optional<int64_t> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    return std::stoll(word);
  } catch (...) {
    return std::nullopt;
  }
}

std::string Text(const MemoryBytes& b, bool device) {
  return device ? absl::StrCat(b.device, " bytes of GPU memory")
                : absl::StrCat(b.host, " bytes of host memory");
}

}  // namespace

MemoryBudget::Reservation& MemoryBudget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr) budget_->Give(bytes_);
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, MemoryBytes{});
  }
  return *this;
}

MemoryBudget::Reservation::~Reservation() {
  if (budget_ != nullptr) budget_->Give(bytes_);
}

absl::StatusOr<MemoryBudget::Reservation> MemoryBudget::Reserve(const std::string& job,
                                                                MemoryBytes bytes) {
  absl::MutexLock lock(&mu_);
  for (const bool device : {false, true}) {
    const int64_t asked = device ? bytes.device : bytes.host;
    const int64_t limit = device ? limit_.device : limit_.host;
    const int64_t used = device ? used_.device : used_.host;
    if (asked <= limit - used) continue;
    const char* knob = device ? "device_memory_budget_bytes" : "memory_budget_bytes";
    const char* source = device ? "the GPU's free memory" : "the memory available";
    return WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            "job ", job, " needs up to ", Text(bytes, device),
            " (state, served formats, gradient slots of every rank, bookkeeping); this daemon's ",
            knob, " is ", limit, " and ", limit - used, " of it are free (", used,
            " held by its other jobs); delete a job (paramctl delete), raise ", knob,
            " (default: ", static_cast<int>(kDefaultBudgetShare * 100), "% of ", source,
            " at start), or run the job on another daemon")),
        v1::ERROR_REASON_MEMORY_BUDGET);
  }
  used_.host += bytes.host;
  used_.device += bytes.device;
  Reservation r;
  r.budget_ = this;
  r.bytes_ = bytes;
  return r;
}

MemoryBytes MemoryBudget::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

void MemoryBudget::Give(const MemoryBytes& bytes) {
  absl::MutexLock lock(&mu_);
  used_.host -= bytes.host;
  used_.device -= bytes.device;
}

absl::StatusOr<int64_t> HostMemoryAvailable() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  int64_t available = -1;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") available = kib * 1024;
  }
  if (available < 0) {
    return absl::UnavailableError(
        "cannot read MemAvailable from /proc/meminfo; set memory_budget_bytes");
  }
  // cgroup v2, then v1 (whose "no limit" is a huge number, which the min below ignores).
  std::optional<int64_t> limit = ReadNumber("/sys/fs/cgroup/memory.max");
  std::optional<int64_t> usage = ReadNumber("/sys/fs/cgroup/memory.current");
  if (!limit.has_value()) {
    limit = ReadNumber("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    usage = ReadNumber("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  if (limit.has_value()) available = std::min(available, *limit - usage.value_or(0));
  return std::max<int64_t>(available, 0);
}

absl::StatusOr<int64_t> HostBudget(int64_t configured) {
  if (configured != 0) return configured;
  absl::StatusOr<int64_t> available = HostMemoryAvailable();
  if (!available.ok()) return available.status();
  return static_cast<int64_t>(kDefaultBudgetShare * static_cast<double>(*available));
}

}  // namespace paramd
