// A pull's tensors on their way out: the job's waiters of those whose version is not published
// yet, and those published and not begun, in the order they were published. Plain bookkeeping,
// with no lock of its own: the Pull reactor's lock guards it (server/rpc/pull_stream.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <map>
#include <optional>

namespace paramd {

class PullQueue {
 public:
  // `tensors`: how many tensors the pull asks for; each is named by its index among them.
  explicit PullQueue(size_t tensors) : tensors_(tensors) {}

  // Tensor `i` waits for its version: `waiter` is the job's (Job::AddWaiter).
  void Wait(size_t i, uint64_t waiter) { waiters_.emplace(i, waiter); }
  // Tensor `i`'s waiter fired: the job calls it no more.
  void Fired(size_t i) { waiters_.erase(i); }
  // Tensor `i` is published: it is begun after those published before it.
  void Ready(size_t i) { ready_.push_back(i); }
  // Whether a tensor waits for its version.
  bool waiting() const { return !waiters_.empty(); }

  // The next tensor published and not begun, and whether it is the pull's last to begin.
  struct Next {
    size_t index;
    bool last;
  };
  std::optional<Next> Take() {
    if (ready_.empty()) return std::nullopt;
    const size_t i = ready_.front();
    ready_.pop_front();
    return Next{i, ++begun_ == tensors_};
  }
  // Whether every tensor was begun.
  bool all_begun() const { return begun_ == tensors_; }

  // Removes the waiters not fired yet with `remove` (Job::RemoveWaiter's rule: false for a waiter
  // that fired, whose callback is on its way, and calls Fired). True when none is left.
  template <typename Remove>
  bool RemoveWaiters(Remove&& remove) {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      it = remove(it->second) ? waiters_.erase(it) : std::next(it);
    }
    return waiters_.empty();
  }

 private:
  size_t tensors_;
  std::map<size_t, uint64_t> waiters_;  // tensor index -> the job's waiter, not fired yet
  std::deque<size_t> ready_;            // published, not begun
  size_t begun_ = 0;
};

}  // namespace paramd
