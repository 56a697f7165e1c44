// The gradient slot sets of a job's steps (DESIGN.md §2): the set that collects the step being
// collected, the one set aside early for the step after it, the sets of steps taken and waiting to
// run, and spare sets whose step ran, reused so a steady job allocates its slots once. At most
// kSlotSets are held for steps (server/job/job_memory.h). It keeps the sets; the Job sizes their
// slots and allocates their memory. No lock of its own: the Job calls it under the job's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/device_bytes.h"
#include "server/backend/backend.h"
#include "server/job/chunk_buffer.h"

namespace paramd {

// A rank's gradient in GPU memory: a slot in the backend's exported memory, allocated when the rank
// asks for device places, or the trainer's own memory it lent for the step (`lent`, mapped by the
// backend; kept, with the IPC handle and offset it came from, until the rank lends again).
// `written` once an in-place device push marked it this step (its ChunkBuffer then only counts the
// bytes); the step reads the lent memory where the mark lent it, else the slot.
struct DeviceSlot {
  DeviceBytes bytes;
  std::shared_ptr<const void> lent;
  std::string lent_from;
  bool lent_this_step = false;
  // The event the lent gradient's reads wait for (ExportedMemoryAbility::LentReadyEvent), or null.
  const void* ready = nullptr;
  bool written = false;
  const void* gradient() const {
    if (!written) return nullptr;
    return lent_this_step ? lent.get() : bytes.get();
  }
};

// A tensor's gradient check computed when its last slot landed (DESIGN.md §2; the Job runs it
// through the backend's LandedCheckAbility, outside the job's lock).
struct LandedCheck {
  enum class State {
    kNone,     // not every slot landed, or the backend checks at the step only
    kRunning,  // being computed: the set's slots are read, and stay until it ends
    kDone,     // `check` holds it
    kStale,    // the slots' bytes may have changed since (an in-place range marked again), or the
               // check failed: the step checks them itself
  };
  State state = State::kNone;
  TensorCheck check;
};

// The gradient slots of one step: a host buffer per tensor and rank, and device slots for the
// ranks that write their gradients into exported GPU memory. A set is made when a step's first
// push or slot place needs it, so registering costs no per-rank records.
struct SlotSet {
  std::vector<std::vector<ChunkBuffer>> host;   // [tensor][rank]; empty until made
  std::vector<std::vector<DeviceSlot>> device;  // [tensor][rank], empty until asked for
  std::vector<LandedCheck> landed;              // [tensor]; sized when made
  // Landed checks running (kRunning) and early steps queued or running (Job::EarlyStep): the set
  // is neither cleared nor given up until none is.
  int landed_running = 0;
  bool made() const { return !host.empty(); }
  // Forgets every chunk received, every device mark and every landed check, keeping the memory.
  void Clear();
  // The device slot of (tensor, rank), or null when none was allocated.
  DeviceSlot* FindDevice(size_t tensor, int32_t rank);
  // The device slot record of (tensor, rank) in a made set, added (without memory) where missing.
  DeviceSlot& Device(size_t tensor, int32_t rank);
  // Bytes of every slot, host and device.
  int64_t bytes() const;
  std::vector<ChunkBuffer>& operator[](size_t i) { return host[i]; }
  const std::vector<ChunkBuffer>& operator[](size_t i) const { return host[i]; }
};

class SlotSets {
 public:
  // Sets of `tensors` x `world_size` slots.
  SlotSets(size_t tensors, int world_size);

  // The set that collects the step being collected; not made until MakeCollecting.
  SlotSet& collecting() { return collecting_; }
  const SlotSet& collecting() const { return collecting_; }
  // Makes the collecting set where it is not made yet; false when kSlotSets are held already.
  bool MakeCollecting();
  // The set for the step after the one collected, set aside now where it is not (after making the
  // collecting set): a trainer may write it before its commit. Null when kSlotSets are held.
  SlotSet* Lookahead();
  // The last rank committed the step collected, `step`: its set is taken until the step ran, and
  // the next step collects in the set set aside for it, else a spare or a new one within kSlotSets
  // (else the next step's first push makes it, once a step ran).
  void Take(int64_t step);
  // The set of a taken step, which the step reads while it runs.
  bool IsTaken(int64_t step) const { return taken_.contains(step); }
  SlotSet& Taken(int64_t step) { return taken_.at(step); }
  bool any_taken() const { return !taken_.empty(); }
  // `step` ran: its set is spare, for a later step.
  void Return(int64_t step);
  // `step` will not run (the job failed): its set goes.
  void Drop(int64_t step) { taken_.erase(step); }
  // Sets held for steps: the collecting one once made, the lookahead, the taken ones.
  size_t held() const;
  // Bytes of every slot of every set, spare ones included.
  int64_t bytes() const;

 private:
  // A spare set, else a new (made) one while fewer than kSlotSets are held; else none.
  std::optional<SlotSet> Next();

  const size_t tensors_;
  const int world_size_;
  SlotSet collecting_;
  // The set that collects the step after, set aside early when a trainer asked for its places.
  std::optional<SlotSet> lookahead_;
  std::map<int64_t, SlotSet> taken_;  // by step
  std::vector<SlotSet> spare_;
};

}  // namespace paramd
