// libFuzzer target: a reader must validate a ring it maps (header and slot descriptors) and
// refuse a damaged one, never read outside the mapping. The input is the data area; the
// control area offers every slot as READY.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "shm/ring.h"

using namespace mmfeed::shm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  int fd = memfd_create("fuzz-ring", MFD_CLOEXEC);
  size_t bytes = (size + 4095) / 4096 * 4096 + 4096;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    close(fd);
    return 0;
  }
  uint32_t slots = 0;
  if (size >= 52) std::memcpy(&slots, data + 48, 4);  // RingHeader::slot_count
  int control = memfd_create("fuzz-control", MFD_CLOEXEC);
  if (ftruncate(control, kPageBytes) != 0) return close(fd), close(control), 0;
  ControlHeader ch{};
  ch.magic = kControlMagic;
  ch.layout_version = kRingLayoutVersion;
  ch.slot_count = slots;
  ch.generation = 1;
  (void)!pwrite(control, &ch, sizeof(ch), 0);
  for (uint32_t i = 0; i < slots && i < kMaxSlots; ++i) {
    uint64_t w = ControlWord(kSlotReady, 1);
    (void)!pwrite(control, &w, 8, sizeof(ControlHeader) + 8 * i);
  }
  auto reader = RingReader::Map(fd, control);  // owns both
  if (!reader.ok()) return 0;
  for (int i = 0; i < 4; ++i) {
    int slot;
    BatchView view;
    auto got = (*reader)->Acquire(0, &slot, &view);
    if (!got.ok() || *got != RingReader::Wait::kGot) break;
    for (const auto& t : view.tensors)
      if (t.nbytes) {
        volatile uint8_t last = t.data[t.nbytes - 1];
        (void)last;
      }
    (void)(*reader)->Release(slot);
  }
  return 0;
}
