#include "server/state/checkpoint_progress.h"

#include <algorithm>
#include <utility>

namespace paramd {

CheckpointProgress::Tracked::Tracked(Tracked&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), id_(other.id_) {}

CheckpointProgress::Tracked::~Tracked() {
  if (owner_ == nullptr) return;
  absl::MutexLock lock(&owner_->mu_);
  owner_->entries_.erase(id_);
}

void CheckpointProgress::Tracked::Update(int64_t bytes_done) {
  absl::MutexLock lock(&owner_->mu_);
  Entry& entry = owner_->entries_.at(id_);
  entry.done = std::clamp<int64_t>(bytes_done, 0, entry.total);
}

CheckpointProgress::Tracked CheckpointProgress::Begin(const std::string& job,
                                                      v1::CheckpointOperation operation,
                                                      int64_t bytes_total) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  entries_[id] = Entry{job, operation, 0, std::max<int64_t>(bytes_total, 0), now_()};
  return Tracked(this, id);
}

std::optional<v1::CheckpointProgress> CheckpointProgress::Of(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, entry] : entries_) {
    if (entry.job != job) continue;
    v1::CheckpointProgress progress;
    progress.set_operation(entry.operation);
    progress.set_bytes_done(entry.done);
    progress.set_bytes_total(entry.total);
    progress.set_seconds(std::chrono::duration<double>(now_() - entry.start).count());
    return progress;
  }
  return std::nullopt;
}

}  // namespace paramd
