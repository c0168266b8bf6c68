// SampleCache: one stage's outputs kept in memory per sample (catalog entry), up to a byte
// budget, so that a later epoch copies them instead of decoding again (a stage's `cache:`,
// docs/design/cache.md).
//
// The order is a pure function of (seed, epoch, position), so the cache knows when each sample
// is read next (Pipeline::NextUse: the inverse of the coming epochs' orders) and evicts by
// Belady's MIN: when a new sample does not fit, the samples needed furthest ahead leave, and a
// sample needed later than all those it would displace is not kept (bypass). A rank never
// depends on it for its bytes: a miss runs the stage, and a kept row is the stage's own output.
//
// With a disk tier (SampleDisk), the disk is a second, larger MIN over the same reads: a sample
// the stage made is written to disk if the disk's MIN keeps it, whatever memory does; a memory
// miss that the disk holds is read back (checked: a bad file is a miss), served, and offered to
// memory. Memory holds the samples needed soonest, the disk those needed within its size.
//
// Thread-safe: every worker of the stage calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/sample_disk.h"
#include "source/cache_policy.h"

namespace mmfeed {

class SampleCache {
 public:
  // When `entry` is read next after its read in epoch `after`: epoch << 32 | position in that
  // epoch's order, or kNever (not within the epochs looked at, or past the run's end).
  static constexpr uint64_t kNever = kNeverRead;
  using NextUse = std::function<uint64_t(uint32_t entry, uint32_t after)>;

  // `disk`: the disk tier's files (null: memory only), holding up to `disk_max_bytes`.
  SampleCache(uint64_t max_bytes, NextUse next_use, std::unique_ptr<SampleDisk> disk = nullptr,
              uint64_t disk_max_bytes = 0);

  // The bytes kept for `entry` (read now, in `epoch`), or null (a miss). A hit is ranked anew by
  // its next read after this one; one read from disk is offered to memory.
  std::shared_ptr<const std::string> Find(uint32_t entry, uint32_t epoch);
  // Offers the bytes `entry`'s read in `epoch` made; kept in memory and written to disk as each
  // tier's MIN decides. Returns them (the copy kept before, if another worker kept the sample
  // first).
  std::shared_ptr<const std::string> Offer(uint32_t entry, uint32_t epoch, std::string bytes);

  struct Stats {
    // hits: served from either tier (disk_hits of them from disk); bytes, samples: in memory.
    uint64_t hits = 0, misses = 0, bytes = 0, max_bytes = 0, samples = 0, evicted_bytes = 0,
             not_kept = 0;
    // The disk tier: its files' payload bytes and count, bytes written, files found damaged
    // or missing (each a miss, logged), failed writes (each makes the tier step aside a minute).
    uint64_t disk_hits = 0, disk_bytes = 0, disk_max_bytes = 0, disk_samples = 0,
             disk_written_bytes = 0, disk_damaged = 0, disk_write_failures = 0;
  };
  Stats stats() const;
  bool has_disk() const { return disk_ != nullptr; }

 private:
  // Ranks again the kept samples whose next read lies before epoch `epoch` (they missed it: a
  // failed sample, one another node read). Their next reads are found with `lock` released
  // (the first lookup in a new epoch may walk its order). REQUIRES: `lock` holds mu_.
  void Advance(uint32_t epoch, std::unique_lock<std::mutex>& lock);
  // Keeps `bytes` in memory if MIN does. REQUIRES: mu_ held, entry not in memory.
  void KeepInMemory(uint32_t entry, uint64_t next, std::shared_ptr<const std::string> bytes);
  // Writes `bytes` to disk if the disk tier's MIN keeps them. REQUIRES: `lock` holds mu_ (it is
  // released while the file is written).
  void KeepOnDisk(uint32_t entry, uint64_t next, const std::string& bytes,
                  std::unique_lock<std::mutex>& lock);
  // Reads `entry`'s file `serial` from disk (mu_ not held): its bytes, or null (a file damaged
  // or deleted is counted, logged and forgotten).
  std::shared_ptr<const std::string> ReadDisk(uint32_t entry, uint64_t serial);
  // Drops `entry` from the disk tier (its file removed). REQUIRES: mu_ held.
  void ForgetFile(uint32_t entry);

  const NextUse next_use_;
  const std::unique_ptr<SampleDisk> disk_;
  mutable std::mutex mu_;
  MinSet memory_, on_disk_;
  std::unordered_map<uint32_t, std::shared_ptr<const std::string>> kept_;  // memory's bytes
  struct File {
    uint64_t serial;  // which admission wrote it
    bool named;       // written and linked (false: being written)
  };
  std::unordered_map<uint32_t, File> files_;  // the disk tier's entries
  uint64_t file_serial_ = 0;
  uint32_t epoch_ = 0;  // the latest epoch read
  Stats stats_;
};

}  // namespace mmfeed
