// ShardIndex: the samples of a set of WebDataset tar shards, from one index file per shard that
// lists each sample's key and members (extension, offset, size). A shard is indexed once by
// reading its tar headers; later starts map the file after checking the shard's stamp
// (index_file.h: size, mtime, inode, a hash of its first and last 4 KiB), so a start over any
// number of samples costs a header check per shard, and the catalog costs 8 bytes per sample (the
// record's offset, in the page cache) plus the records, which are read when a sample is dealt.
//
// File (little-endian; the host's byte order, checked by the magic):
//   Header                     magic "MMFTAR1\0", the shard's stamp, the sample count, the
//                              sizes of the records and of the damage report
//   uint64 offsets[count + 1]  sample i's record is records[offsets[i], offsets[i + 1])
//   records                    per sample: uint8 key length, the key, uint16 member count, then
//                              per member: uint8 extension length, the extension, uint64
//                              offset, uint64 size (unaligned)
//   damage                     "origin\treason\n" lines: what the scan could not index (a
//                              damaged or truncated tar, an over-long key), reported at each start
// Where: index_file::IndexPath (the --state-dir, else beside the shard, else in memory).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "source/index_file.h"
#include "source/remote_store.h"

namespace mmfeed {

struct TarMember {
  std::string ext;  // the member name's part after the key's first dot ("jpg", "seg.png")
  uint64_t offset = 0, size = 0;
};

// The bytes of a tar file of `size` bytes as WalkTarSamples reads them: `read` fills `n` bytes
// from offset `off` (false if it cannot). The walker reads at increasing offsets, only headers
// and GNU long names, never a member's data.
struct TarReader {
  uint64_t size = 0;
  std::function<bool(char* buf, uint64_t n, uint64_t off)> read;
};
// A file's TarReader (pread).
TarReader TarFile(int fd);

// What WalkTarSamples reads of a tar stream (headers and GNU long names), kept as the stream
// arrives in order, the rest dropped: a remote shard is indexed with memory for its headers (512
// bytes a member), never for its data, whatever size the server claims or sends.
class TarHeaderKeeper : public RemoteStore::BodySink {
 public:
  // A longer GNU long name is not kept (the walker reports the shard damaged at its member).
  static constexpr uint64_t kMaxLongName = 64 << 10;

  void Reset() override { *this = TarHeaderKeeper(); }
  bool Add(const char* data, size_t n) override;
  // What was kept, as the tar file of `size` bytes the stream was (valid while this lives).
  TarReader Reader(uint64_t size) const;
  uint64_t kept_bytes() const { return kept_; }

 private:
  struct Block {
    uint64_t offset, want;
    bool header;  // else a GNU long name
    std::string bytes;
  };
  void Complete();  // blocks_.back() is whole: it decides what is kept next

  std::vector<Block> blocks_{{0, 512, true, {}}};  // in offset order; the last one is filling
  uint64_t pos_ = 0;                               // the stream's offset
  uint64_t next_ = 0;                              // where blocks_.back() starts
  uint64_t kept_ = 0;
  bool done_ = false;  // at the end of the archive or a damaged header: nothing more is kept
};

// Reads the headers of a tar file (named `shard`) and calls `sample` for each run of members
// sharing a key, in order; regular files only, GNU long names and ustar prefixes understood.
// Stops at the first damaged or truncated member, calling `damage` with an origin and reason; a
// sample whose key is longer than max_key bytes is reported and skipped.
void WalkTarSamples(
    const TarReader& tar, const std::string& shard, size_t max_key,
    const std::function<void(const std::string& key, const std::vector<TarMember>&)>& sample,
    const std::function<void(const std::string& origin, const std::string& reason)>& damage);

// Whether `h`, the 512 bytes before a member's data, is that member's tar header: a valid
// checksum, the member's size and (unless `name` is empty, or too long for the header's own name
// field) its name. What a remote read of a member checks before it trusts the server's bytes.
Status CheckMemberHeader(const char* h, uint64_t size, const std::string& name);

class ShardIndex {
 public:
  ~ShardIndex();
  ShardIndex(const ShardIndex&) = delete;
  ShardIndex& operator=(const ShardIndex&) = delete;

  struct Damage {
    std::string origin, reason;
  };
  // Indexes or maps every shard. A shard that cannot be opened is reported in `damage` and
  // holds no samples, like a damaged one.
  // `remote`: the shards are URLs read through it (their index files go to index_dir, or
  // stay in memory when it is empty).
  static Result<std::unique_ptr<ShardIndex>> Open(const std::vector<std::string>& shards,
                                                  const std::string& index_dir, size_t max_key,
                                                  std::vector<Damage>* damage,
                                                  RemoteStore* remote = nullptr);

  size_t size() const { return total_; }
  // The shards in catalog order: shard k holds catalog positions [first, first + count).
  struct ShardSpan {
    const std::string* path;
    uint64_t first, count, bytes;
  };
  size_t shard_count() const { return shards_.size(); }
  ShardSpan shard(size_t k) const;  // REQUIRES: k < shard_count()
  // Sample i's shard, key and members. REQUIRES: i < size().
  Status Sample(size_t i, const std::string** shard, std::string* key,
                std::vector<TarMember>* members) const;
  // Names the shards' contents (each one's stamp, in order).
  uint64_t fingerprint() const { return fingerprint_; }
  // How many shards this Open indexed (the others were mapped) and where the files went.
  size_t built() const { return built_; }
  size_t in_memory() const { return in_memory_; }

  struct Header;

 private:
  struct Shard {
    std::string path;
    uint64_t first = 0, count = 0;  // its samples' catalog positions
    uint64_t bytes = 0;             // the shard's size
    const uint64_t* offsets = nullptr;
    const char* records = nullptr;
    uint64_t records_bytes = 0;
    index_file::MappedFile map;  // the index file
    std::string memory;          // or its bytes, where it could not be written
  };
  ShardIndex() = default;
  // Maps or builds shard `s`'s index; adds what its scan could not index to `damage`. Called
  // for several shards at once.
  void OpenShard(Shard* s, const std::string& index_dir, size_t max_key, RemoteStore* remote,
                 std::vector<Damage>* damage, uint64_t* stamp_hash);

  std::vector<std::unique_ptr<Shard>> shards_;
  uint64_t total_ = 0, fingerprint_ = 0;
  std::atomic<size_t> built_{0}, in_memory_{0};  // OpenShard runs on several threads
  std::mutex swept_mu_;
  std::set<std::string> swept_;  // folders whose stale temporary index files were removed
};

}  // namespace mmfeed
