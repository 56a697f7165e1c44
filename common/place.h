// Where bytes lie in memory a transport exposes to trainers: a region (a shared-memory segment, an
// exported GPU allocation: whatever the transport hands out by index) and an offset into it. The
// daemon's buffers and a transport's slot and pull places all speak of it the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paramd {

// The memory a place lies in: the daemon's host memory (mapped by trainers on its node), or the
// GPU memory its backend exports.
enum class Memory { kHost, kDevice };

struct Place {
  int32_t region = -1;  // index of the region in the transport's list; -1: none (private memory)
  int64_t offset = 0;   // bytes from the region's start
  bool exposed() const { return region >= 0; }
};

// A rank's gradient slot places for one step, per tensor in registration order, with the bytes
// already received in each (Job::SlotsForStep).
struct SlotPlaces {
  std::vector<Place> places;
  std::vector<int64_t> bytes;
  std::vector<int64_t> received;
  std::vector<std::string> tensors;
  bool committed = false;  // the rank committed the step (its slots are final)
};

}  // namespace paramd
