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
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.tensor == tensor && it->second.min_version <= t.newest->version) {
      wake->push_back(std::move(it->second.wake));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t ServedVersions::AddWaiter(int tensor, int64_t min_version, std::function<void()> wake) {
  const auto& newest = tensors_[static_cast<size_t>(tensor)].newest;
  if (stop_waiting_ || (newest != nullptr && newest->version >= min_version)) return 0;
  const uint64_t id = next_waiter_++;
  waiters_.emplace(id, Waiter{tensor, min_version, std::move(wake)});
  return id;
}

bool ServedVersions::RemoveWaiter(uint64_t id) { return waiters_.erase(id) > 0; }

void ServedVersions::TakeAllWaiters(std::vector<std::function<void()>>* wake) {
  for (auto& [id, waiter] : waiters_) wake->push_back(std::move(waiter.wake));
  waiters_.clear();
}

void ServedVersions::StopWaiting(std::vector<std::function<void()>>* wake) {
  stop_waiting_ = true;
  TakeAllWaiters(wake);
}

}  // namespace paramd
