#include "server/job/slot_sets.h"

#include <utility>

#include "common/logging.h"
#include "server/job/job_memory.h"

namespace paramd {

void SlotSet::Clear() {
  PARAMD_CHECK(landed_running == 0) << "a slot set cleared while a landed check reads it";
  landed.assign(host.size(), LandedCheck{});
  for (auto& per_tensor : host) {
    for (ChunkBuffer& slot : per_tensor) slot.Clear();
  }
  for (auto& per_tensor : device) {
    for (DeviceSlot& slot : per_tensor) {
      slot.written = false;
      slot.lent_this_step = false;
      slot.ready = nullptr;
    }
  }
}

DeviceSlot* SlotSet::FindDevice(size_t tensor, int32_t rank) {
  if (tensor >= device.size()) return nullptr;
  std::vector<DeviceSlot>& per_rank = device[tensor];
  if (rank < 0 || static_cast<size_t>(rank) >= per_rank.size()) return nullptr;
  DeviceSlot& slot = per_rank[static_cast<size_t>(rank)];
  return slot.bytes.empty() ? nullptr : &slot;
}

DeviceSlot& SlotSet::Device(size_t tensor, int32_t rank) {
  PARAMD_CHECK(made()) << "device slots of a slot set that is not made";
  if (device.size() != host.size()) device.resize(host.size());
  std::vector<DeviceSlot>& per_rank = device[tensor];
  if (per_rank.size() != host[tensor].size()) per_rank.resize(host[tensor].size());
  return per_rank[static_cast<size_t>(rank)];
}

int64_t SlotSet::bytes() const {
  int64_t total = 0;
  for (const auto& per_tensor : host) {
    for (const ChunkBuffer& slot : per_tensor) {
      if (slot.holds_memory()) total += slot.size();
    }
  }
  for (const auto& per_tensor : device) {
    for (const DeviceSlot& slot : per_tensor) total += slot.bytes.size();
  }
  return total;
}

SlotSets::SlotSets(size_t tensors, int world_size) : tensors_(tensors), world_size_(world_size) {}

std::optional<SlotSet> SlotSets::Next() {
  if (!spare_.empty()) {
    SlotSet set = std::move(spare_.back());
    spare_.pop_back();
    return set;
  }
  if (held() >= static_cast<size_t>(kSlotSets)) return std::nullopt;
  SlotSet set;
  set.host.resize(tensors_);
  for (auto& per_tensor : set.host) per_tensor.resize(static_cast<size_t>(world_size_));
  return set;
}

bool SlotSets::MakeCollecting() {
  if (collecting_.made()) return true;
  std::optional<SlotSet> set = Next();
  if (!set.has_value()) return false;
  collecting_ = *std::move(set);
  collecting_.Clear();
  return true;
}

SlotSet* SlotSets::Lookahead() {
  if (!MakeCollecting()) return nullptr;  // the set before it comes first
  if (!lookahead_.has_value()) {
    std::optional<SlotSet> set = Next();
    if (!set.has_value()) return nullptr;
    lookahead_ = *std::move(set);
  }
  return &*lookahead_;
}

void SlotSets::Take(int64_t step) {
  taken_.emplace(step, std::move(collecting_));
  if (lookahead_.has_value()) {
    collecting_ = *std::move(lookahead_);
    lookahead_.reset();
  } else {
    std::optional<SlotSet> next = Next();
    collecting_ = next.has_value() ? *std::move(next) : SlotSet();
  }
  collecting_.Clear();
}

void SlotSets::Return(int64_t step) {
  spare_.push_back(std::move(taken_.at(step)));
  taken_.erase(step);
}

size_t SlotSets::held() const {
  return (collecting_.made() ? 1 : 0) + (lookahead_.has_value() ? 1 : 0) + taken_.size();
}

int64_t SlotSets::bytes() const {
  int64_t total = collecting_.bytes();
  if (lookahead_.has_value()) total += lookahead_->bytes();
  for (const auto& [step, set] : taken_) total += set.bytes();
  for (const SlotSet& set : spare_) total += set.bytes();
  return total;
}

}  // namespace paramd
