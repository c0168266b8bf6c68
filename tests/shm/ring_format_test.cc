// Pins the shared-memory layout: if this test needs changing, kRingLayoutVersion must change too.
#include "shm/ring_format.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

namespace mmfeed::shm {
namespace {

TEST(RingFormatTest, VersionAndMagic) {
  EXPECT_EQ(kRingLayoutVersion, 4u);
  EXPECT_EQ(kRingMagic, 0x474e495244464d4dull);
  EXPECT_EQ(std::memcmp(&kRingMagic, "MMFDRING", 8), 0);
  EXPECT_EQ(std::memcmp(&kControlMagic, "MMFDCTRL", 8), 0);
  EXPECT_EQ(kMaxSlots, 496u);
  EXPECT_EQ(kClosedAtEnd, 1u);
  EXPECT_EQ(kClosedStopped, 2u);
}

TEST(RingFormatTest, HeaderLayout) {
  EXPECT_EQ(sizeof(RingHeader), 128u);
  EXPECT_EQ(alignof(RingHeader), 64u);
  EXPECT_EQ(offsetof(RingHeader, magic), 0u);
  EXPECT_EQ(offsetof(RingHeader, layout_version), 8u);
  EXPECT_EQ(offsetof(RingHeader, header_bytes), 12u);
  EXPECT_EQ(offsetof(RingHeader, total_bytes), 16u);
  EXPECT_EQ(offsetof(RingHeader, slots_offset), 24u);
  EXPECT_EQ(offsetof(RingHeader, slot_stride), 32u);
  EXPECT_EQ(offsetof(RingHeader, payload_offset), 40u);
  EXPECT_EQ(offsetof(RingHeader, slot_count), 48u);
  EXPECT_EQ(offsetof(RingHeader, rank), 52u);
  EXPECT_EQ(offsetof(RingHeader, num_ranks), 56u);
  EXPECT_EQ(offsetof(RingHeader, reserved0), 60u);
  EXPECT_EQ(offsetof(RingHeader, publish_futex), 64u);
  EXPECT_EQ(offsetof(RingHeader, closed), 68u);
  EXPECT_EQ(offsetof(RingHeader, published), 72u);
  EXPECT_EQ(offsetof(RingHeader, reserved1), 80u);
}

TEST(RingFormatTest, ControlLayout) {
  EXPECT_EQ(sizeof(ControlHeader), 128u);
  EXPECT_EQ(alignof(ControlHeader), 64u);
  EXPECT_EQ(offsetof(ControlHeader, magic), 0u);
  EXPECT_EQ(offsetof(ControlHeader, layout_version), 8u);
  EXPECT_EQ(offsetof(ControlHeader, slot_count), 12u);
  EXPECT_EQ(offsetof(ControlHeader, generation), 16u);
  EXPECT_EQ(offsetof(ControlHeader, reserved0), 20u);
  EXPECT_EQ(offsetof(ControlHeader, reserved1), 24u);
  EXPECT_EQ(offsetof(ControlHeader, release_futex), 64u);
  EXPECT_EQ(offsetof(ControlHeader, reserved2), 68u);
  EXPECT_EQ(offsetof(ControlHeader, released), 72u);
  EXPECT_EQ(offsetof(ControlHeader, wait_ns), 80u);
  EXPECT_EQ(offsetof(ControlHeader, hold_ns), 88u);
  EXPECT_EQ(offsetof(ControlHeader, reserved3), 96u);
  EXPECT_EQ(sizeof(SlotControl), 8u);
  EXPECT_EQ(kSlotFree, 0u);
  EXPECT_EQ(kSlotReady, 2u);
  EXPECT_EQ(kSlotTaken, 3u);
  EXPECT_EQ(kSlotReleased, 4u);
  EXPECT_EQ(ControlWord(kSlotTaken, 7), 0x0000000700000003ull);
  EXPECT_EQ(WordState(0x0000000700000003ull), kSlotTaken);
  EXPECT_EQ(WordGeneration(0x0000000700000003ull), 7u);
}

TEST(RingFormatTest, SlotLayout) {
  EXPECT_EQ(sizeof(TensorDesc), 104u);
  EXPECT_EQ(offsetof(TensorDesc, name), 0u);
  EXPECT_EQ(offsetof(TensorDesc, dtype), 32u);
  EXPECT_EQ(offsetof(TensorDesc, ndim), 36u);
  EXPECT_EQ(offsetof(TensorDesc, shape), 40u);
  EXPECT_EQ(offsetof(TensorDesc, offset), 88u);
  EXPECT_EQ(offsetof(TensorDesc, nbytes), 96u);
  EXPECT_EQ(sizeof(SlotDescriptor), 72u + 16 * 104);
  EXPECT_EQ(alignof(SlotDescriptor), 8u);
  EXPECT_EQ(offsetof(SlotDescriptor, seq), 0u);
  EXPECT_EQ(offsetof(SlotDescriptor, epoch), 8u);
  EXPECT_EQ(offsetof(SlotDescriptor, num_samples), 12u);
  EXPECT_EQ(offsetof(SlotDescriptor, num_tensors), 16u);
  EXPECT_EQ(offsetof(SlotDescriptor, next_position), 20u);
  EXPECT_EQ(offsetof(SlotDescriptor, ids_offset), 24u);
  EXPECT_EQ(offsetof(SlotDescriptor, ids_bytes), 32u);
  EXPECT_EQ(offsetof(SlotDescriptor, payload_bytes), 40u);
  EXPECT_EQ(offsetof(SlotDescriptor, next_epoch), 48u);
  EXPECT_EQ(offsetof(SlotDescriptor, next_stream), 52u);
  EXPECT_EQ(offsetof(SlotDescriptor, next_batch), 56u);
  EXPECT_EQ(offsetof(SlotDescriptor, next_seq), 64u);
  EXPECT_EQ(offsetof(SlotDescriptor, tensors), 72u);
}

}  // namespace
}  // namespace mmfeed::shm
