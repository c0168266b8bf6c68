// How the daemon (and the benchmarks that stand in for it) set up glibc's allocator.
#pragma once

#include <malloc.h>

namespace mmfeed {

// Per-sample memory (decoded images, decoder work areas, 600 KB float images) is allocated
// and freed thousands of times a second on different threads: keep it on the heap instead of
// fresh mmaps, and do not hand freed heap back to the kernel, whose page faults on the next
// sample would otherwise cost as much as the work itself.
inline void KeepSampleMemoryOnTheHeap() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

}  // namespace mmfeed
