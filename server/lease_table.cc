#include "server/lease_table.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace paramd {

LeaseTable::LeaseTable(int64_t max_leases) : max_leases_(max_leases), reaper_([this] { Reap(); }) {}

LeaseTable::~LeaseTable() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  reaper_.join();
}

absl::StatusOr<uint64_t> LeaseTable::Take(const std::string& job,
                                          std::shared_ptr<const ServedTensor> served,
                                          Clock::time_point expires) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(leases_.size()) >= max_leases_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(leases_.size(),
                     " leases are held, this daemon's max_leases; release in-place views "
                     "(Release, or the next pull's `release`) or pull copies"));
  }
  const uint64_t id = next_id_++;
  leases_.emplace(id, Lease{job, std::move(served), expires});
  return id;
}

int LeaseTable::Release(std::span<const uint64_t> ids,
                        const std::function<bool(const std::string&)>& may) {
  std::vector<std::shared_ptr<const ServedTensor>> ended;  // dropped outside the lock
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    auto it = leases_.find(id);
    if (it == leases_.end() || (may && !may(it->second.job))) continue;
    ended.push_back(std::move(it->second.served));
    leases_.erase(it);
  }
  return static_cast<int>(ended.size());
}

int LeaseTable::ReleaseJob(const std::string& job) {
  std::vector<std::shared_ptr<const ServedTensor>> ended;  // dropped outside the lock
  absl::MutexLock lock(&mu_);
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.job == job) {
      ended.push_back(std::move(it->second.served));
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  return static_cast<int>(ended.size());
}

int64_t LeaseTable::held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(leases_.size());
}

int64_t LeaseTable::Held(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  return std::count_if(leases_.begin(), leases_.end(),
                       [&job](const auto& entry) { return entry.second.job == job; });
}

int64_t LeaseTable::expired() const {
  absl::MutexLock lock(&mu_);
  return expired_;
}

void LeaseTable::Reap() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = now + std::chrono::seconds(1);
    std::vector<std::shared_ptr<const ServedTensor>> dropped;
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.expires <= now) {
        dropped.push_back(std::move(it->second.served));
        it = leases_.erase(it);
        ++expired_;
      } else {
        next = std::min(next, it->second.expires);
        ++it;
      }
    }
    if (!dropped.empty()) {
      // The last reference may free the buffers (page-locked ones synchronize the device): not
      // under the lock every Take and Release needs.
      mu_.Unlock();
      dropped.clear();
      mu_.Lock();
      continue;
    }
    // Wakes at the next expiry (or within a second, to notice new leases and the stop flag).
    mu_.AwaitWithDeadline(absl::Condition(&stop_), absl::FromChrono(next));
  }
}

}  // namespace paramd
