#include "server/job/served_versions.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "server/job/job_memory.h"

namespace paramd {

ServedVersions::ServedVersions(size_t tensors) : tensors_(tensors) {}

int64_t ServedVersions::published() const {
  int64_t version = std::numeric_limits<int64_t>::max();
  for (const Tensor& t : tensors_) version = std::min(version, t.newest ? t.newest->version : -1);
  return version;
}

int64_t ServedVersions::bytes() const {
  int64_t total = 0;
  for (const Tensor& t : tensors_) {
    for (const auto& version : t.versions) total += version->bytes();
  }
  return total;
}

absl::StatusOr<std::shared_ptr<ServedTensor>> ServedVersions::Fresh(int tensor, const Make& make) {
  Tensor& t = tensors_[static_cast<size_t>(tensor)];
  std::shared_ptr<ServedTensor> served;
  // A retired version is free once no reader holds it (the reference kept here is the last one).
  for (const std::shared_ptr<ServedTensor>& version : t.versions) {
    if (version.use_count() == 1) served = version;
  }
  if (served == nullptr && t.versions.size() >= static_cast<size_t>(kServedVersions)) {
    return std::shared_ptr<ServedTensor>();  // all leased: one more would pass the budget
  }
  if (served == nullptr) {
    absl::StatusOr<std::shared_ptr<ServedTensor>> made = make();
    if (!made.ok()) return made.status();
    served = *std::move(made);
    t.versions.push_back(served);
  }
  served->skipped = false;
  return served;
}

bool ServedVersions::AnyFree(int tensor) const {
  const Tensor& t = tensors_[static_cast<size_t>(tensor)];
  return std::any_of(t.versions.begin(), t.versions.end(),
                     [](const auto& version) { return version.use_count() == 1; });
}

void ServedVersions::Publish(int tensor, std::shared_ptr<const ServedTensor> served,
                             std::vector<std::function<void()>>* wake) {
  Tensor& t = tensors_[static_cast<size_t>(tensor)];
  t.newest = std::move(served);
  for (auto it = t.waiters.begin(); it != t.waiters.end();) {
    if (it->second.min_version <= t.newest->version) {
      wake->push_back(std::move(it->second.wake));
      waiting_.erase(it->first);
      it = t.waiters.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t ServedVersions::AddWaiter(int tensor, int64_t min_version, std::function<void()> wake) {
  Tensor& t = tensors_[static_cast<size_t>(tensor)];
  if (stop_waiting_ || (t.newest != nullptr && t.newest->version >= min_version)) return 0;
  const uint64_t id = next_waiter_++;
  t.waiters.emplace(id, Waiter{min_version, std::move(wake)});
  waiting_.emplace(id, tensor);
  return id;
}

bool ServedVersions::RemoveWaiter(uint64_t id) {
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return false;
  tensors_[static_cast<size_t>(it->second)].waiters.erase(id);
  waiting_.erase(it);
  return true;
}

void ServedVersions::TakeAllWaiters(std::vector<std::function<void()>>* wake) {
  for (Tensor& t : tensors_) {
    for (auto& [id, waiter] : t.waiters) wake->push_back(std::move(waiter.wake));
    t.waiters.clear();
  }
  waiting_.clear();
}

void ServedVersions::StopWaiting(std::vector<std::function<void()>>* wake) {
  stop_waiting_ = true;
  TakeAllWaiters(wake);
}

}  // namespace paramd
