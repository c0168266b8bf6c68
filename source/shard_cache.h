// ShardCache: whole remote shards kept in a local folder (`source.cache: {dir, max_bytes}`,
// docs/design/remote.md "Disk cache"), so that a shard fetched once is read from disk in later
// epochs and after restarts, by every daemon of the node that reads the same store.
//
// A cached shard is one file, `<dir>/<16 hex digits of a hash of its URL>.shard`: the shard's
// bytes, a checksum (Checksum, XXH3, as the stage cache's disk tier) of each kBlock bytes, then a
// trailer (JSON {url, size, stamp, block}, its length, a magic). It is written unnamed
// (O_TMPFILE), synced, and linked under its name only when whole, so a reader never sees a
// partial file; on use it is checked against the URL, size and stamp (ETag and Last-Modified)
// of the HEAD the store made at start, and the bytes served against their checksums (every
// block before a whole shard is held; the blocks a member covers before it is read; block by
// block as a shard is streamed): a truncated, damaged, tampered or stale file is removed,
// counted (`damaged`) and the shard fetched again, never served.
//
// Eviction keeps the folder under max_bytes. With a Rank (the order's future: larger = needed
// later) it is Belady's MIN: room for a new shard is made by removing the shards needed furthest
// in the future, and a shard needed later than every one it would displace is not kept.
// Without one, the least recently used go first (file mtimes; a hit touches its file).
//
// The folder is opened once and used through its descriptor (base/dir_fd.h): a folder that is
// a symlink or belongs to another user is refused at the start, and one swapped for a symlink
// later redirects no write.
//
// Several daemons may share a folder: commits and removals hold an flock on `<dir>/.lock` and
// take the folder's listing as the truth. A file removed while a reader has it open stays
// readable through its descriptor. A write that fails (a full disk, the folder deleted) makes
// the cache step aside for a minute, logged once, and shards are fetched into memory: a full
// disk slows the job, it never fails it.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "base/dir_fd.h"
#include "base/status.h"

namespace mmfeed {

class ShardCache {
 public:
  struct Key {
    std::string url;
    uint64_t size = 0;
    std::string stamp;  // what the HEAD said about the object (ETag, Last-Modified)
  };
  // When a shard is needed next, larger is later (UINT64_MAX: not in the foreseen order).
  using Rank = std::function<uint64_t(const std::string& url)>;

  // Creates `dir` when missing; an error names it when it cannot be created or written.
  static Result<std::unique_ptr<ShardCache>> Open(const std::string& dir, uint64_t max_bytes);
  ShardCache(const ShardCache&) = delete;
  ShardCache& operator=(const ShardCache&) = delete;

  static constexpr uint64_t kBlock = 64 * 1024;  // bytes per checksum

  // A read-only descriptor of `key`'s cached copy (the shard's bytes from offset 0), or -1 when
  // there is none (a damaged or stale copy is removed). Counts a hit or a miss. `check_all`:
  // every byte is checked against its checksum first; else the caller checks what it reads
  // (CheckedCopy, Verify) before using it. `check_all` with `private_copy`: the bytes are
  // checked as they are copied into a private in-memory file, which is returned instead of the
  // cache's file: a copy held for a while stays what was checked, whatever is done to the file
  // (a descriptor of the file itself sees any later edit of it).
  int Find(const Key& key, bool check_all, bool private_copy = false);
  // The bytes of `fd` (from Find) that hold [offset, offset + n), whole blocks, checked against
  // their checksums as they are copied into a private in-memory file at the same offsets (the
  // rest of it a hole): what was checked is what is read from it. -1 when they differ (the copy
  // was removed and counted damaged) or no memory file can be made.
  int CheckedCopy(int fd, const Key& key, uint64_t offset, uint64_t n);
  // "" when `data`, the n bytes at `offset` of `fd` (from Find; `offset` a multiple of kBlock,
  // n one too or reaching the shard's end), match their checksums; else what differs.
  std::string Verify(int fd, uint64_t size, const char* data, uint64_t offset, uint64_t n) const;
  // Reads the bytes [from, to) of `fd` (block-aligned `from`) and Verifies them chunk by chunk,
  // writing each verified chunk at its offset of `copy_to` when one is given: "" or what differs
  // (or cannot be read or written: "copy: ..." when `copy_to` could not be written).
  std::string ReadAndVerify(int fd, uint64_t size, uint64_t from, uint64_t to,
                            int copy_to = -1) const;
  // A new private in-memory file (the held copies' and members' kind), or -1 (errno set).
  static int MemoryFile(const char* name);
  // The copy `fd` of `key` is damaged (`why`): removed (if still the file under its name) and
  // counted.
  void Damaged(int fd, const Key& key, const std::string& why);
  // An unnamed file in the folder to fetch a shard into, or -1 when the cache steps aside (the
  // disk was full or the folder unwritable within the last minute).
  int Begin();
  // `fd` (from Begin) holds `key`'s bytes: keeps it under its name when its rank earns the room
  // (see above; `next` ranks the shards, `self` is this shard's own next use after the read it
  // was fetched for). The descriptor stays the caller's and readable either way. The bytes are
  // read once, for their checksums, and copied as they are read into `copy_to` when one is
  // given: false when they could not all be read or copied (the shard is then not kept).
  bool Commit(int fd, const Key& key, const Rank& next, uint64_t self, int copy_to = -1);
  // A fetch into a file from Begin failed writing it (errno `err`): the cache steps aside.
  void WriteFailed(int err);

  // hits, misses, bytes and files held, bytes and files evicted, shards not kept (needed later
  // than all they would displace), damaged or stale copies removed, write failures.
  nlohmann::json Stats() const;

 private:
  ShardCache(std::string dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}
  // A cached file's name in the folder.
  std::string NameOf(const std::string& url) const;
  // The folder, opened once (base/dir_fd.h: a symlink or another user's folder is refused, and
  // one swapped later redirects nothing); made again, where it was, when it was deleted
  // (`create`).
  std::shared_ptr<const DirFd> Dir(bool create);
  // The URL a cached file's trailer names, "" when it has none readable.
  std::string UrlOf(int fd) const;
  // Reads the bytes [from, to) of `fd` in chunks, hands each to `each` (its offset, bytes and
  // length; a non-empty answer stops the pass) and, when `copy_to` >= 0, writes it at its offset
  // there: "" or why the pass stopped ("copy: ..." when `copy_to` could not be written).
  using ChunkFn = std::function<std::string(uint64_t at, const char* data, uint64_t len)>;
  std::string ReadChunks(int fd, uint64_t from, uint64_t to, const ChunkFn& each,
                         int copy_to) const;
  bool Usable();  // false while stepping aside

  const std::string dir_;
  const uint64_t max_bytes_;
  std::mutex dir_mu_;
  std::shared_ptr<const DirFd> dir_fd_;  // guarded by dir_mu_
  mutable std::mutex mu_;
  int64_t aside_until_ns_ = 0;
  std::map<std::string, std::pair<uint64_t, std::string>> urls_;  // name -> (inode, URL) seen
  uint64_t hits_ = 0, misses_ = 0, held_bytes_ = 0, held_files_ = 0, evicted_bytes_ = 0,
           evicted_files_ = 0, not_kept_ = 0, damaged_ = 0, write_failures_ = 0;
};

}  // namespace mmfeed
