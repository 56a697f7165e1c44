// A mutex that clang's thread-safety analysis checks (ABSL_GUARDED_BY and the rest) but Abseil's
// run-time lock-order detector does not: a std::mutex with absl's annotations.
//
// For a lock held while it calls back into code that takes other locks, where those locks are
// also held around calls that take it, and a protocol, not the order, keeps the two apart.
// absl::Mutex (where its detector is on, as in a library built without NDEBUG) records the order
// of every pair of locks by instance and aborts on the first inversion, even one that can never
// deadlock. Each use says why its inversion cannot.
#pragma once

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace paramd {

class ABSL_LOCKABLE UncheckedMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE UncheckedMutexLock {
 public:
  explicit UncheckedMutexLock(UncheckedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~UncheckedMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  UncheckedMutexLock(const UncheckedMutexLock&) = delete;
  UncheckedMutexLock& operator=(const UncheckedMutexLock&) = delete;

 private:
  UncheckedMutex* const mu_;
};

}  // namespace paramd
