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
#include "base/status.h"

namespace mmfeed::shm {

// A tensor as read out of a slot (or, for the writer, described: data unused).
struct TensorView {
  std::string name;
  uint32_t dtype = 0;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
};

// One batch: as seen in a slot (pointers into the mapping) or as committed by the writer.
struct BatchView {
  uint64_t seq = 0;
  uint32_t epoch = 0;
  std::vector<std::string_view> ids;
  std::vector<TensorView> tensors;
};

// Where things go in every slot: ids first, then each tensor at a fixed, page-aligned offset
// with room for its largest (full-batch) size. Fixed so that workers can write samples into a
// slot before the batch is complete.
struct SlotLayout {
  uint64_t ids_capacity = 0;
  std::vector<uint64_t> tensor_offsets;  // from the slot's start
  std::vector<uint64_t> tensor_capacity;
  uint64_t slot_bytes = 0;
};
SlotLayout PlanSlot(uint64_t ids_capacity, const std::vector<uint64_t>& tensor_bytes);

class RingWriter {
 public:
  // Creates the memfd, reserves and seals it, and maps it.
  static Result<std::unique_ptr<RingWriter>> Create(uint32_t rank, uint32_t num_ranks,
                                                    uint32_t slot_count, const SlotLayout& layout);
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

  // Waits up to `timeout_ms` for a free slot and claims it for writing; returns its index,
  // or -1 on timeout.
  int AcquireFree(int timeout_ms);
  // Start of a claimed slot; tensor k lives at layout().tensor_offsets[k].
  uint8_t* slot_data(int slot) const;
  const SlotLayout& layout() const { return layout_; }
  // Publishes a claimed slot whose tensors were written in place: writes the descriptor (seq,
  // epoch, ids, the tensors' names, dtypes, shapes and sizes) and hands it to the reader.
  // An error (too many tensors, ids or a tensor larger than planned) publishes nothing and
  // leaves the slot claimed.
  Status Commit(int slot, const BatchView& batch);
  // Gives a claimed slot back unpublished.
  void Abandon(int slot);
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
  SlotLayout layout_;
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
