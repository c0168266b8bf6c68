// RingWriter (daemon side) and RingReader (client side): the process-local classes that operate
// on the shared ring described in ring_format.h / ring_format.md.
//
// A RingWriter is used by one thread (its rank's ring-sink thread), except Reclaim(), Close()
// and the counters, which the control thread may call at any time. A RingReader is used by one
// thread of the trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shm/ring_format.h"
#include "stages/runtime/status.h"

namespace mmfeed::shm {

// A tensor as written into / read out of a slot.
struct TensorView {
  std::string name;
  uint32_t dtype = 0;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  // Writer only: if not empty, the tensor is gathered from these pieces of `row_bytes` each
  // (one per sample) instead of `data`; nbytes must equal rows.size() * row_bytes.
  std::vector<const uint8_t*> rows;
  uint64_t row_bytes = 0;
};

// One batch, as seen in a slot (pointers into the mapping) or as handed to the writer.
struct BatchView {
  uint64_t seq = 0;
  uint32_t epoch = 0;
  std::vector<std::string_view> ids;
  std::vector<TensorView> tensors;
};

// Bytes one slot needs for `ids_bytes` of ids and tensors of the given sizes.
uint64_t SlotBytesFor(uint64_t ids_bytes, const std::vector<uint64_t>& tensor_bytes);

class RingWriter {
 public:
  // Creates the memfd, reserves and seals it, and maps it.
  static Result<std::unique_ptr<RingWriter>> Create(uint32_t rank, uint32_t num_ranks,
                                                    uint32_t slot_count, uint64_t slot_bytes);
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

  // Waits up to `timeout_ms` for a free slot; returns its index, or -1 on timeout.
  int AcquireFree(int timeout_ms);
  // Copies `batch` into slot `slot` (from AcquireFree) and publishes it.
  // Returns an error if it does not fit (nothing is published then).
  Status Publish(int slot, const BatchView& batch);
  // No more batches: readers drain what is published, then see the end.
  void Close();
  // After a reader died: every slot it held becomes READY again. Returns how many.
  int Reclaim();
  // Closed and every published batch released.
  bool Drained() const;
  uint64_t published() const;
  uint64_t released() const;

 private:
  RingWriter() = default;
  RingHeader* header() const { return reinterpret_cast<RingHeader*>(base_); }
  SlotDescriptor* slot(int i) const;

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

class RingReader {
 public:
  // Maps the ring behind `fd` (takes ownership) and validates its header.
  static Result<std::unique_ptr<RingReader>> Map(int fd);
  ~RingReader();
  RingReader(const RingReader&) = delete;
  RingReader& operator=(const RingReader&) = delete;

  enum class Wait { kGot, kTimeout, kEnd };
  // Takes the published batch with the smallest seq. On kGot, *slot and *batch are set and
  // stay valid until Release(*slot). A slot whose descriptor is out of bounds is an error.
  Result<Wait> Acquire(int timeout_ms, int* slot, BatchView* batch);
  void Release(int slot);

  const RingHeader& header() const { return header_copy_; }

 private:
  RingReader() = default;
  Status ParseSlot(int i, BatchView* batch) const;
  SlotDescriptor* slot(int i) const;

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  RingHeader* shared_ = nullptr;
  RingHeader header_copy_;  // validated; the geometry is read from here, never from shared_
};

// Futex helpers on a 32-bit word in a MAP_SHARED mapping (no FUTEX_PRIVATE_FLAG).
// Wait returns when *word != expected, on a wake, or after timeout_ms.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms);
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace mmfeed::shm
