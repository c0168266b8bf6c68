// libFuzzer target: a reader must validate a ring it maps (header and slot descriptors) and
// refuse a damaged one, never read outside the mapping.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "shm/ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  int fd = memfd_create("fuzz-ring", MFD_CLOEXEC);
  size_t bytes = (size + 4095) / 4096 * 4096 + 4096;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    close(fd);
    return 0;
  }
  auto reader = mmfeed::shm::RingReader::Map(fd);  // owns fd
  if (!reader.ok()) return 0;
  for (int i = 0; i < 4; ++i) {
    int slot;
    mmfeed::shm::BatchView view;
    auto got = (*reader)->Acquire(0, &slot, &view);
    if (!got.ok() || *got != mmfeed::shm::RingReader::Wait::kGot) break;
    for (const auto& t : view.tensors)
      if (t.nbytes) {
        volatile uint8_t last = t.data[t.nbytes - 1];
        (void)last;
      }
    (*reader)->Release(slot);
  }
  return 0;
}
