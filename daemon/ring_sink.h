// RingSink: delivers one consumer rank's batches into its shared-memory ring.
//
// The pipeline's batch thread calls Put/Finish; the sink's own thread waits for a free slot
// (the trainer's release), copies the batch in and publishes it. Between the two sits a small
// bounded mailbox, so a slow rank delays the others only once it is that far behind.
// The control thread may call Abort(), counters and ring() at any time.
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include "shm/ring.h"
#include "stages/runtime/mailbox.h"
#include "stages/runtime/pipeline.h"
#include "stages/runtime/profile.h"

namespace mmfeed {

class RingSink : public BatchSink {
 public:
  RingSink(uint32_t rank, std::unique_ptr<shm::RingWriter> ring, size_t pending);
  ~RingSink() override;

  void Put(std::unique_ptr<Batch> batch) override;
  void Finish() override;

  void Start();
  // Stop waiting for the trainer: batches not yet in the ring are counted as undelivered.
  void Abort();
  void Join();
  bool done() const { return done_.load(std::memory_order_acquire); }

  shm::RingWriter& ring() { return *ring_; }
  StageInfo info() const;
  uint64_t batches_written() const { return written_.load(); }
  uint64_t batches_undelivered() const { return undelivered_.load(); }

 private:
  void Loop();

  uint32_t rank_;
  std::string name_;
  std::unique_ptr<shm::RingWriter> ring_;
  Mailbox<std::unique_ptr<Batch>> inbox_;
  StageCounters counters_;
  StageCounters unused_;  // the batch thread's wait is counted by the pipeline
  std::thread thread_;
  std::atomic<bool> abort_{false}, done_{false};
  std::atomic<uint64_t> written_{0}, undelivered_{0};
};

}  // namespace mmfeed
