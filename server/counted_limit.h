// A count of things held at once under a cap (open streams, waiting pulls): a holder takes a
// ticket, which gives its place back when destroyed.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <utility>

namespace paramd {

class CountedLimit {
 public:
  explicit CountedLimit(int64_t limit) : limit_(limit) {}
  CountedLimit(const CountedLimit&) = delete;
  CountedLimit& operator=(const CountedLimit&) = delete;

  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept : owner_(std::exchange(other.owner_, nullptr)) {}
    Ticket& operator=(Ticket&& other) noexcept {
      if (this != &other) {
        Reset();
        owner_ = std::exchange(other.owner_, nullptr);
      }
      return *this;
    }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { Reset(); }
    void Reset() {
      if (owner_ != nullptr) owner_->count_.fetch_sub(1);
      owner_ = nullptr;
    }

   private:
    friend class CountedLimit;
    explicit Ticket(CountedLimit* owner) : owner_(owner) {}
    CountedLimit* owner_ = nullptr;
  };

  // A ticket, or none when `limit` are held.
  std::optional<Ticket> TryTake() {
    int64_t held = count_.load();
    do {
      if (held >= limit_) return std::nullopt;
    } while (!count_.compare_exchange_weak(held, held + 1));
    return Ticket(this);
  }
  int64_t count() const { return count_.load(); }
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  std::atomic<int64_t> count_{0};
};

}  // namespace paramd
