// libFuzzer target: the daemon side of a ring reads a control area that a reader may fill with
// anything. The input is a script of reader writes (a word into any control word or header
// field) mixed with the writer's own calls; whatever the words say, the writer must neither
// crash nor hand out a slot twice, and a cut-off reader's batches must come back.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <set>

#include "shm/ring.h"

using namespace mmfeed::shm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto made = RingWriter::Create(0, 1, 4, PlanSlot(64, {4096}));
  if (!made.ok()) std::abort();
  RingWriter& w = **made;
  uint32_t generation = 1;
  auto control = w.Attach(generation);
  if (!control.ok()) std::abort();
  auto* area = static_cast<uint8_t*>(
      mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, *control, 0));
  if (area == MAP_FAILED) std::abort();
  std::set<int> claimed;  // slots the writer handed out and has not published
  uint64_t seq = 0;
  for (size_t pos = 0; pos + 10 <= size; pos += 10) {
    uint8_t op = data[pos], where = data[pos + 1];
    uint64_t value;
    std::memcpy(&value, data + pos + 2, 8);
    switch (op % 6) {
      case 0:  // the reader writes a word
        std::memcpy(area + (where % (kPageBytes / 8)) * 8, &value, 8);
        break;
      case 1: {  // the writer claims a slot
        int s = w.AcquireFree(0);
        if (s >= 4) std::abort();
        if (s >= 0 && !claimed.insert(s).second) std::abort();  // handed out twice
        break;
      }
      case 2:  // the writer publishes a claimed slot
        if (!claimed.empty()) {
          int s = *claimed.begin();
          claimed.erase(claimed.begin());
          BatchView v;
          v.seq = seq++;
          v.tensors.push_back({"t", 1, {16}, nullptr, 16});
          if (!w.Commit(s, v).ok()) std::abort();
        }
        break;
      case 3:  // a well-behaved release of a READY slot
        value = ControlWord(kSlotReleased, generation);
        std::memcpy(area + sizeof(ControlHeader) + (where % 4) * 8, &value, 8);
        break;
      case 4:
        (void)w.TakeViolation();
        (void)w.Drained();
        if (w.released() > w.published()) std::abort();
        break;
      case 5: {  // a new reader takes over
        munmap(area, kPageBytes);
        control = w.Attach(++generation);
        if (!control.ok()) std::abort();
        area = static_cast<uint8_t*>(
            mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, *control, 0));
        if (area == MAP_FAILED) std::abort();
        break;
      }
    }
  }
  munmap(area, kPageBytes);
  return 0;
}
