// Mailbox<T>: the bounded, lock-free inbox of a stage. Any number of threads may Push and Pop
// concurrently. Push blocks while the mailbox holds `capacity` items (back-pressure); Pop blocks
// while it is empty. After Close(), Pop returns an empty item (nullptr for unique_ptr), taken as
// "no more input", once every item pushed before has been popped: the queue keeps order per
// producer only, so Close cannot simply queue a marker behind the items. Time spent blocked is
// added to the caller's counters so the profile can tell a starved stage from a blocked one.
#pragma once

#include <concurrentqueue/blockingconcurrentqueue.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "base/clock.h"

namespace mmfeed {

// A cache line: counters written by different threads are kept this far apart.
inline constexpr size_t kLine = 64;

// Takes one of a mailbox's free slots, waiting while there is none (back-pressure); the wait
// is added to *blocked_ns.
inline void TakeSlot(moodycamel::LightweightSemaphore& free_slots,
                     std::atomic<uint64_t>* blocked_ns) {
  if (free_slots.tryWait()) return;
  uint64_t t0 = NowNs();
  free_slots.wait();
  blocked_ns->fetch_add(NowNs() - t0, std::memory_order_relaxed);
}

template <typename T>
class Mailbox {
 public:
  explicit Mailbox(size_t capacity)
      : capacity_(capacity),
        release_every_(std::max<int64_t>(1, static_cast<int64_t>(capacity) / 2)),
        free_slots_(static_cast<ssize_t>(capacity)) {}
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // Blocks while full. Adds the time spent waiting to *blocked_ns.
  void Push(T item, std::atomic<uint64_t>* blocked_ns) {
    TakeSlot(free_slots_, blocked_ns);
    outstanding_.fetch_add(1, std::memory_order_acq_rel);
    queue_.enqueue(std::move(item));
  }

  // Blocks while empty. Adds the time spent waiting to *starved_ns.
  T Pop(std::atomic<uint64_t>* starved_ns) {
    uint64_t t0 = 0;
    while (true) {
      T item;
      bool got = queue_.try_dequeue(item);
      if (!got) {
        ReleaseFreed();  // about to wait: nothing may be held back from the producers then
        if (!t0) t0 = NowNs();
        got = queue_.wait_dequeue_timed(item, kRecheckUs);
      }
      if (got) {
        if (item) {
          if (t0) starved_ns->fetch_add(NowNs() - t0, std::memory_order_relaxed);
          outstanding_.fetch_sub(1, std::memory_order_acq_rel);
          // Slots are handed back to blocked producers half a mailbox at a time: a producer
          // woken for every pop costs a context switch per item.
          if (freed_.fetch_add(1, std::memory_order_acq_rel) + 1 >= release_every_) ReleaseFreed();
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
  void ReleaseFreed() {
    if (int64_t n = freed_.exchange(0, std::memory_order_acq_rel)) free_slots_.signal(n);
  }

  // The counters every Push and Pop write sit on cache lines of their own (kLine), away from
  // the read-mostly fields and each other (bench/mailbox_bench.sh measures it).
  size_t capacity_;
  int64_t release_every_;
  moodycamel::BlockingConcurrentQueue<T> queue_;
  static constexpr int64_t kRecheckUs = 20000;
  moodycamel::LightweightSemaphore free_slots_;
  alignas(kLine) std::atomic<int64_t> freed_{0};        // popped, not yet handed back
  alignas(kLine) std::atomic<int64_t> outstanding_{0};  // pushed and not yet popped
  alignas(kLine) std::atomic<bool> closed_{false};
};

// BulkMailbox<T>: a bounded mailbox with one consumer that is woken in bulk. A Push wakes a
// sleeping consumer only once `wake_every` items wait, for an urgent item, or at Close; other
// items are found when the consumer next looks, within kLookUs. The batch thread acts on whole
// batches: waking it for every finished sample cost a context switch per sample, about a tenth
// of two cores at 2,000 images/s. Push blocks while full, as Mailbox's does.
template <typename T>
class BulkMailbox {
 public:
  // REQUIRES: 1 <= wake_every <= capacity.
  BulkMailbox(size_t capacity, size_t wake_every)
      : capacity_(capacity),
        wake_every_(static_cast<int64_t>(wake_every)),
        free_slots_(static_cast<ssize_t>(capacity)) {}
  BulkMailbox(const BulkMailbox&) = delete;
  BulkMailbox& operator=(const BulkMailbox&) = delete;

  // Blocks while full. Adds the time spent waiting to *blocked_ns.
  void Push(T item, bool urgent, std::atomic<uint64_t>* blocked_ns) {
    TakeSlot(free_slots_, blocked_ns);
    queue_.enqueue(std::move(item));
    const int64_t waiting = waiting_.fetch_add(1, std::memory_order_seq_cst) + 1;
    if ((urgent || waiting >= wake_every_) && sleeping_.load(std::memory_order_seq_cst))
      wake_.signal();
  }

  // Blocks while empty; an empty item (nullptr) once closed and drained. Adds the time spent
  // waiting to *starved_ns. One consumer thread only.
  T Pop(std::atomic<uint64_t>* starved_ns) {
    uint64_t t0 = 0;
    while (true) {
      T item;
      if (queue_.try_dequeue(item)) {
        waiting_.fetch_sub(1, std::memory_order_seq_cst);
        free_slots_.signal();
        if (t0) starved_ns->fetch_add(NowNs() - t0, std::memory_order_relaxed);
        return item;
      }
      if (closed_.load(std::memory_order_acquire) &&
          waiting_.load(std::memory_order_seq_cst) == 0) {
        if (t0) starved_ns->fetch_add(NowNs() - t0, std::memory_order_relaxed);
        return T();
      }
      if (!t0) t0 = NowNs();
      // Say so before looking again: a Push either sees the flag or its item is seen here.
      sleeping_.store(true, std::memory_order_seq_cst);
      if (waiting_.load(std::memory_order_seq_cst) < wake_every_ &&
          !closed_.load(std::memory_order_acquire))
        wake_.wait(kLookUs);
      sleeping_.store(false, std::memory_order_seq_cst);
    }
  }

  // No more pushes. REQUIRES: every Push has returned.
  void Close() {
    closed_.store(true, std::memory_order_release);
    wake_.signal();
  }

  size_t SizeApprox() const { return queue_.size_approx(); }
  size_t capacity() const { return capacity_; }

 private:
  static constexpr int64_t kLookUs = 5000;
  size_t capacity_;
  int64_t wake_every_;
  moodycamel::ConcurrentQueue<T> queue_;
  moodycamel::LightweightSemaphore free_slots_, wake_;
  alignas(kLine) std::atomic<int64_t> waiting_{0};  // pushed and not yet popped
  alignas(kLine) std::atomic<bool> sleeping_{false};
  alignas(kLine) std::atomic<bool> closed_{false};
};

}  // namespace mmfeed
