// How the daemon (and the benchmarks that stand in for it) set up glibc's allocator.
#pragma once

#include <malloc.h>

namespace mmfeed {

// Per-sample memory (decoded images, decoder work areas, 600 KB float images) is allocated
// and freed thousands of times a second on different threads: keep it on the heap instead of
// fresh mmaps, and do not hand freed heap back to the kernel, whose page faults on the next
// sample would otherwise cost as much as the work itself.
constexpr int kKeptHeapBytes = 512 << 20;
inline void KeepSampleMemoryOnTheHeap() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, kKeptHeapBytes);
}

// Runs `free_it` (which frees much memory at once: a reload dropping a stage's cache) and gives
// what it freed back to the system. malloc_trim alone does not: the memory was made by worker
// threads, whose arenas shrink at their top only when a free passes the trim threshold, so the
// threshold is lowered while `free_it` runs.
template <typename F>
void FreeAndGiveBack(F&& free_it) {
  mallopt(M_TRIM_THRESHOLD, 128 << 10);
  free_it();
  malloc_trim(0);
  mallopt(M_TRIM_THRESHOLD, kKeptHeapBytes);
}

}  // namespace mmfeed
