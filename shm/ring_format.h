// The shared-memory ring format: the only structures the daemon (writer) and a trainer's client
// (reader) share. The protocol is specified in shm/ring_format.md; read it before changing
// anything here. Plain data only: fixed-width fields, explicit reserved bytes, offsets instead
// of pointers. tests/shm/ring_format_test.cc pins every size and offset.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mmfeed::shm {

constexpr uint64_t kRingMagic = 0x474e495244464d4dull;  // "MMFDRING" little-endian
// Bump whenever a struct below, a constant, or the meaning of a field changes.
constexpr uint32_t kRingLayoutVersion = 1;

constexpr uint32_t kMaxTensors = 16;
constexpr uint32_t kMaxDims = 6;
constexpr uint32_t kTensorNameBytes = 32;  // NUL-terminated
constexpr uint64_t kPageBytes = 4096;      // slot stride, slot payload and tensor alignment

// Slot states (SlotDescriptor::state).
constexpr uint32_t kSlotFree = 0;     // the writer may fill it
constexpr uint32_t kSlotWriting = 1;  // the writer is filling it
constexpr uint32_t kSlotReady = 2;    // published, waiting for its reader
constexpr uint32_t kSlotTaken = 3;    // a reader holds it; released back to kSlotFree

// At offset 0 of the mapping; the header occupies the first kPageBytes.
struct RingHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_bytes;     // sizeof(RingHeader)
  uint64_t total_bytes;      // size of the whole mapping
  uint64_t slots_offset;     // offset of slot 0 from the mapping's start
  uint64_t slot_stride;      // bytes between slots (multiple of kPageBytes)
  uint64_t payload_offset;   // offset of the payload inside a slot (multiple of kPageBytes)
  uint32_t slot_count;
  uint32_t rank;             // consumer rank this ring feeds
  uint32_t num_ranks;
  uint32_t reserved0;
  // Written by the writer, read by the reader. Each side's atomics sit on their own cache line.
  alignas(64) std::atomic<uint32_t> publish_futex;  // bumped after each publish and on close
  std::atomic<uint32_t> closed;                      // 1: no batch will be published any more
  std::atomic<uint64_t> published;                   // batches published so far
  uint8_t reserved1[48];
  // Written by the reader, read by the writer.
  alignas(64) std::atomic<uint32_t> release_futex;  // bumped after each release
  uint32_t reserved2;
  std::atomic<uint64_t> released;                    // batches released so far
  uint8_t reserved3[48];
};

struct TensorDesc {
  char name[kTensorNameBytes];
  uint32_t dtype;  // mmfeed::DType value: 1 uint8, 2 int32, 3 float32, 4 int64
  uint32_t ndim;
  int64_t shape[kMaxDims];
  uint64_t offset;  // from the slot's start; multiple of kPageBytes
  uint64_t nbytes;
};

// At the start of every slot. Written by the writer while kSlotWriting; read-only once
// published, until the reader releases it.
struct SlotDescriptor {
  std::atomic<uint32_t> state;  // kSlot*
  uint32_t reader_mask;         // readers that still hold it (bit 0: the rank's reader)
  uint64_t seq;                 // batch number in this ring, from 0
  uint32_t epoch;
  uint32_t num_samples;
  uint32_t num_tensors;
  uint32_t reserved0;
  uint64_t ids_offset;  // sample ids: num_samples NUL-terminated strings, from the slot's start
  uint64_t ids_bytes;
  uint64_t payload_bytes;  // bytes used from payload_offset
  TensorDesc tensors[kMaxTensors];
};

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(RingHeader) == 192);
static_assert(sizeof(TensorDesc) == 104);
static_assert(sizeof(SlotDescriptor) == 56 + kMaxTensors * sizeof(TensorDesc));
static_assert(sizeof(SlotDescriptor) <= kPageBytes);

}  // namespace mmfeed::shm
