// Mailbox<T>: the bounded, lock-free inbox of a stage. Any number of threads may Push and Pop
// concurrently. Push blocks while the mailbox holds `capacity` items (back-pressure); Pop blocks
// while it is empty. After Close(), Pop returns an empty item (nullptr for unique_ptr), taken as
// "no more input", once every item pushed before has been popped: the queue keeps order per
// producer only, so Close cannot simply queue a marker behind the items. Time spent blocked is
// added to the caller's counters so the profile can tell a starved stage from a blocked one.
#pragma once

#include <concurrentqueue/blockingconcurrentqueue.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace mmfeed {

inline uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

template <typename T>
class Mailbox {
 public:
  explicit Mailbox(size_t capacity)
      : capacity_(capacity), free_slots_(static_cast<ssize_t>(capacity)) {}
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // Blocks while full. Adds the time spent waiting to *blocked_ns.
  void Push(T item, std::atomic<uint64_t>* blocked_ns) {
    if (!free_slots_.tryWait()) {
      uint64_t t0 = NowNs();
      free_slots_.wait();
      blocked_ns->fetch_add(NowNs() - t0, std::memory_order_relaxed);
    }
    outstanding_.fetch_add(1, std::memory_order_acq_rel);
    queue_.enqueue(std::move(item));
  }

  // Blocks while empty. Adds the time spent waiting to *starved_ns.
  T Pop(std::atomic<uint64_t>* starved_ns) {
    uint64_t t0 = 0;
    while (true) {
      T item;
      if (queue_.try_dequeue(item) ||
          (t0 = t0 ? t0 : NowNs(), queue_.wait_dequeue_timed(item, kRecheckUs))) {
        if (item) {
          if (t0) starved_ns->fetch_add(NowNs() - t0, std::memory_order_relaxed);
          outstanding_.fetch_sub(1, std::memory_order_acq_rel);
          free_slots_.signal();
          return item;
        }
        // A wake-up from Close: fall through to the check.
      }
      if (closed_.load(std::memory_order_acquire) &&
          outstanding_.load(std::memory_order_acquire) == 0) {
        if (t0) starved_ns->fetch_add(NowNs() - t0, std::memory_order_relaxed);
        return T();
      }
    }
  }

  // No more pushes. REQUIRES: every Push has returned. Wakes `poppers` sleeping Pop calls; any
  // other waiting Pop notices within kRecheckUs.
  void Close(int poppers) {
    closed_.store(true, std::memory_order_release);
    for (int i = 0; i < poppers; ++i) queue_.enqueue(T());
  }

  size_t SizeApprox() const { return queue_.size_approx(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  moodycamel::BlockingConcurrentQueue<T> queue_;
  static constexpr int64_t kRecheckUs = 20000;
  moodycamel::LightweightSemaphore free_slots_;
  std::atomic<int64_t> outstanding_{0};  // pushed and not yet popped
  std::atomic<bool> closed_{false};
};

}  // namespace mmfeed
