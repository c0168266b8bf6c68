// The shared-memory ring format: the only structures the daemon (writer) and a trainer's client
// (reader) share. The protocol is specified in shm/ring_format.md; read it before changing
// anything here. Plain data only: fixed-width fields, explicit reserved bytes, offsets instead
// of pointers. tests/shm/ring_format_test.cc pins every size and offset.
//
// A ring is two memfds. The data area (RingHeader, then the slots) is written by the daemon
// only and mapped read-only by readers. The control area (ControlHeader, then one SlotControl
// per slot) is the only memory a reader may write; the daemon makes a fresh one for every
// attach and treats everything in it as untrusted input.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mmfeed::shm {

constexpr uint64_t kRingMagic = 0x474e495244464d4dull;     // "MMFDRING" little-endian
constexpr uint64_t kControlMagic = 0x4c52544344464d4dull;  // "MMFDCTRL" little-endian
// Bump whenever a struct below, a constant, or the meaning of a field changes.
// 2: control area split from the data area; attach generations; the cursor in descriptors.
// 3: the reader's wait_ns and hold_ns in the control header (the trainers' data stall).
// 4: the slot descriptor's next_stream and next_position, in what were reserved words (given
//    their meanings under version 3 without the bump the rule asks for: now bumped).
constexpr uint32_t kRingLayoutVersion = 4;

constexpr uint32_t kMaxTensors = 16;
constexpr uint32_t kMaxDims = 6;
constexpr uint32_t kTensorNameBytes = 32;  // NUL-terminated
constexpr uint64_t kPageBytes = 4096;      // slot stride, slot payload and tensor alignment
constexpr uint32_t kMaxSlots = 496;        // the control area fits one page
constexpr size_t kMaxIdBytes = 255;        // longest sample id: a slot's ids area holds this
                                           // plus a NUL per sample

// Slot states in a control word (SlotControl::word): the state in the low 32 bits, the attach
// generation it belongs to in the high 32 bits. The reader moves READY(g) -> TAKEN(g) ->
// RELEASED(g) for its own generation g; the daemon does everything else.
constexpr uint32_t kSlotFree = 0;      // nothing for the reader
constexpr uint32_t kSlotReady = 2;     // published for generation g
constexpr uint32_t kSlotTaken = 3;     // the reader of generation g holds it
constexpr uint32_t kSlotReleased = 4;  // the reader of generation g is done with it
constexpr uint64_t ControlWord(uint32_t state, uint32_t generation) {
  return static_cast<uint64_t>(generation) << 32 | state;
}
constexpr uint32_t WordState(uint64_t word) { return static_cast<uint32_t>(word); }
constexpr uint32_t WordGeneration(uint64_t word) { return static_cast<uint32_t>(word >> 32); }

// RingHeader::closed: 0 while batches may follow.
constexpr uint32_t kClosedAtEnd = 1;    // the data ended
constexpr uint32_t kClosedStopped = 2;  // the daemon stopped before the end of the data
constexpr uint32_t kClosedMoved = 3;    // the rank goes on in a new ring: attach again

// At offset 0 of the data area; the header occupies the first kPageBytes. Written by the
// daemon only.
struct RingHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_bytes;    // sizeof(RingHeader)
  uint64_t total_bytes;     // size of the whole data area
  uint64_t slots_offset;    // offset of slot 0 from the area's start
  uint64_t slot_stride;     // bytes between slots (multiple of kPageBytes)
  uint64_t payload_offset;  // offset of the payload inside a slot (multiple of kPageBytes)
  uint32_t slot_count;
  uint32_t rank;  // consumer rank this ring feeds
  uint32_t num_ranks;
  uint32_t reserved0;
  alignas(64) std::atomic<uint32_t> publish_futex;  // bumped after each publish and on close
  std::atomic<uint32_t> closed;     // no batch will follow: kClosedAtEnd/Stopped/Moved
  std::atomic<uint64_t> published;  // batches published so far
  uint8_t reserved1[48];
};

// At offset 0 of the control area, followed at offset sizeof(ControlHeader) by slot_count
// SlotControl words. The area is kPageBytes long.
struct ControlHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t slot_count;  // equals the data area's
  uint32_t generation;  // this attach's generation: the g of the reader's control words
  uint32_t reserved0;
  uint8_t reserved1[40];
  // Written by the reader: bumped after each release (the daemon may wait on it).
  alignas(64) std::atomic<uint32_t> release_futex;
  uint32_t reserved2;
  std::atomic<uint64_t> released;  // the reader's own count; the daemon counts for itself
  // Written by the reader, for the profile only (the daemon trusts nothing else to them):
  // nanoseconds spent waiting for a batch to be published (the trainer's data stall), and the
  // sum over batches of the time from each take to its release.
  std::atomic<uint64_t> wait_ns;
  std::atomic<uint64_t> hold_ns;
  uint8_t reserved3[32];
};

struct SlotControl {
  std::atomic<uint64_t> word;  // ControlWord(state, generation)
};

struct TensorDesc {
  char name[kTensorNameBytes];
  uint32_t dtype;  // mmfeed::DType value: 1 uint8, 2 int32, 3 float32, 4 int64, 5 bfloat16
  uint32_t ndim;
  int64_t shape[kMaxDims];
  uint64_t offset;  // from the slot's start; multiple of kPageBytes
  uint64_t nbytes;  // product of shape x element size
};

// At the start of every slot of the data area. Written by the daemon before it publishes the
// slot; read-only for everyone else.
struct SlotDescriptor {
  uint64_t seq;  // batch number in this ring, from 0
  uint32_t epoch;
  uint32_t num_samples;
  uint32_t num_tensors;
  // A token-budget order's position after this batch (ring_format.md).
  uint32_t next_position;
  uint64_t ids_offset;  // sample ids: num_samples NUL-terminated strings, from the slot's start
  uint64_t ids_bytes;
  uint64_t payload_bytes;  // bytes used from payload_offset
  // The rank's stream cursor after this batch: attach with it to continue after this batch.
  uint32_t next_epoch;
  uint32_t next_stream;  // the stream's tag
  uint64_t next_batch;   // index of the next batch within next_epoch
  uint64_t next_seq;
  TensorDesc tensors[kMaxTensors];
};

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(RingHeader) == 128);
static_assert(sizeof(ControlHeader) == 128);
static_assert(sizeof(SlotControl) == 8);
static_assert(sizeof(ControlHeader) + kMaxSlots * sizeof(SlotControl) <= kPageBytes);
static_assert(sizeof(TensorDesc) == 104);
static_assert(sizeof(SlotDescriptor) == 72 + kMaxTensors * sizeof(TensorDesc));
static_assert(sizeof(SlotDescriptor) <= kPageBytes);

}  // namespace mmfeed::shm
