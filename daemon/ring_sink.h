// RingSink: one consumer rank's batches, living in its shared-memory ring.
//
// Reserve (source thread) claims a free slot and hands out its tensor memory, so workers write
// samples straight into shared memory; Commit/Discard (batch thread) publish or return it.
// While the ring is full, Reserve reports kFull until the trainer releases a slot: that time
// is the back-pressure, and shows in the profile as this stage's "blocked" time. The control thread
// may call Abort(), info() and ring() at any time.
#pragma once

#include <atomic>
#include <memory>

#include "engine/pipeline.h"
#include "engine/profile.h"
#include "shm/ring.h"

namespace mmfeed {

class RingSink : public BatchSink {
 public:
  RingSink(uint32_t rank, std::vector<TensorSpec> specs, std::unique_ptr<shm::RingWriter> ring);

  Reservation Reserve(BatchMemory* memory, int timeout_ms) override;
  void Commit(const BatchMemory& memory, const BatchInfo& info) override;
  void Discard(const BatchMemory& memory) override;
  void Finish(bool complete) override;
  void DropPublished() override { ring_->DropReady(); }
  // The batches from now on have these tensors, laid out so (a config reload); refused when
  // they do not fit the ring's slots. REQUIRES: no pipeline feeds the sink.
  Status Reshape(std::vector<TensorSpec> specs, const shm::SlotLayout& layout);

  // Stop waiting for the trainer: Reserve returns kClosed from now on.
  void Abort() { abort_.store(true, std::memory_order_release); }
  // The ring is full and the source waits for the trainer to release a slot.
  bool WaitingForTrainer() const { return full_since_ns_.load(std::memory_order_relaxed) != 0; }
  shm::RingWriter& ring() { return *ring_; }
  StageInfo info() const { return {name_, "ring", 1, 0, &counters_}; }

 private:
  uint32_t rank_;
  std::string name_;
  std::vector<TensorSpec> specs_;
  std::unique_ptr<shm::RingWriter> ring_;
  StageCounters counters_;
  std::atomic<bool> abort_{false};
  std::atomic<uint64_t> full_since_ns_{
      0};  // last time Reserve found the ring full, 0 if it was not
};

}  // namespace mmfeed
