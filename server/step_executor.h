// Runs steps one after another on a thread of its own, in the order they were taken, so steps of a
// job never overlap and a commit never waits for arithmetic.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace paramd {

class StepExecutor {
 public:
  StepExecutor();
  ~StepExecutor();  // runs what is queued, then stops

  void Submit(std::function<void()> step);
  // Steps queued or running.
  int pending() const;
  // Blocks until nothing is queued or running.
  void WaitIdle();

 private:
  void Loop();

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace paramd
