#include "server/step_executor.h"

namespace paramd {

StepExecutor::StepExecutor() : thread_([this] { Loop(); }) {}

StepExecutor::~StepExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void StepExecutor::Submit(std::function<void()> step) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(step));
}

int StepExecutor::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size()) + running_;
}

void StepExecutor::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](StepExecutor* e)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return e->queue_.empty() && e->running_ == 0; },
      this));
}

void StepExecutor::Loop() {
  while (true) {
    std::function<void()> step;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](StepExecutor* e)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return e->stop_ || !e->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping, nothing left
      step = std::move(queue_.front());
      queue_.pop_front();
      running_ = 1;
    }
    step();
    absl::MutexLock lock(&mu_);
    running_ = 0;
  }
}

}  // namespace paramd
