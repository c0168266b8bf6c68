#include "source/shard_index.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "base/rng.h"

namespace mmfeed {

using index_file::FullPread;

struct ShardIndex::Header {
  char magic[8];
  index_file::Stamp shard;
  uint64_t count;
  uint64_t records_bytes;
  uint64_t damage_bytes;
  uint64_t reserved;
};

namespace {

constexpr char kShardIndexMagic[8] = {'M', 'M', 'F', 'T', 'A', 'R', '1', '\0'};
// Hashed at each end of a shard: its first header and its last block or two. A start reads
// this much per shard (a manifest's 64 KiB would be 5 GB for 40,000 shards); shards are
// written once, and a rewrite changes mtime or size.
constexpr size_t kShardEndBytes = 4 << 10;

uint64_t ParseOctal(const char* p, size_t n, bool* ok) {
  uint64_t v = 0;
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == 0)) ++i;
  if (i == n) {
    *ok = false;
    return 0;
  }
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) v = v * 8 + (p[i] - '0');
  for (; i < n; ++i)
    if (p[i] != ' ' && p[i] != 0) *ok = false;
  return v;
}

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The index file's bytes for one shard: header, offsets, records, damage.
std::string Encode(const index_file::Stamp& stamp, const TarReader& tar, const std::string& shard,
                   size_t max_key) {
  std::vector<uint64_t> offsets;
  std::string records, damage;
  WalkTarSamples(
      tar, shard, max_key,
      [&](const std::string& key, const std::vector<TarMember>& members) {
        offsets.push_back(records.size());
        Put<uint8_t>(&records, static_cast<uint8_t>(key.size()));
        records += key;
        const size_t n = std::min<size_t>(members.size(), UINT16_MAX);
        Put<uint16_t>(&records, static_cast<uint16_t>(n));
        for (size_t m = 0; m < n; ++m) {
          const size_t ext = std::min<size_t>(members[m].ext.size(), UINT8_MAX);
          Put<uint8_t>(&records, static_cast<uint8_t>(ext));
          records.append(members[m].ext, 0, ext);
          Put<uint64_t>(&records, members[m].offset);
          Put<uint64_t>(&records, members[m].size);
        }
      },
      [&](const std::string& origin, const std::string& reason) {
        damage += origin + '\t' + reason + '\n';
      });
  ShardIndex::Header h{};
  std::memcpy(h.magic, kShardIndexMagic, sizeof kShardIndexMagic);
  h.shard = stamp;
  h.count = offsets.size();
  h.records_bytes = records.size();
  h.damage_bytes = damage.size();
  offsets.push_back(records.size());
  std::string out;
  out.reserve(sizeof h + offsets.size() * 8 + records.size() + damage.size());
  Put(&out, h);
  out.append(reinterpret_cast<const char*>(offsets.data()), offsets.size() * 8);
  return out + records + damage;
}

// Why an index file of `n` bytes with header `h` is not an index of the shard stamped `want`
// ("" when it is).
std::string Stale(const ShardIndex::Header& h, uint64_t n, const index_file::Stamp& want) {
  if (n < sizeof h || std::memcmp(h.magic, kShardIndexMagic, sizeof kShardIndexMagic) != 0)
    return "not an index of this version";
  if (std::string why = index_file::Differs(h.shard, want); !why.empty())
    return "the shard changed: " + why;
  if (h.count > n / 8 || n != sizeof h + (h.count + 1) * 8 + h.records_bytes + h.damage_bytes)
    return "the index file is truncated or damaged";
  return "";
}

// The "origin\treason\n" lines of a damage report.
void ParseDamage(std::string_view report, std::vector<ShardIndex::Damage>* damage) {
  for (size_t at = 0; at < report.size();) {
    size_t tab = report.find('\t', at), nl = report.find('\n', at);
    if (tab == std::string_view::npos || nl == std::string_view::npos || tab > nl) break;
    damage->push_back({std::string(report.substr(at, tab - at)),
                       std::string(report.substr(tab + 1, nl - tab - 1))});
    at = nl + 1;
  }
}

// Whether the 512-byte tar header `h` has a valid checksum; its member's size in `size`.
bool ParseHeader(const char* h, uint64_t* size) {
  bool ok = true;
  const uint64_t checksum = ParseOctal(h + 148, 8, &ok);
  uint64_t sum = 0;
  for (int i = 0; i < 512; ++i)
    sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
  *size = ParseOctal(h + 124, 12, &ok);
  return ok && sum == checksum;
}

}  // namespace

bool TarHeaderKeeper::Add(const char* data, size_t n) {
  while (n > 0 && !done_) {
    if (pos_ < next_) {  // a member's data, or the padding after a long name: skipped
      const uint64_t skip = std::min<uint64_t>(n, next_ - pos_);
      pos_ += skip, data += skip, n -= skip;
      continue;
    }
    Block& b = blocks_.back();
    const uint64_t take = std::min<uint64_t>(n, b.want - b.bytes.size());
    b.bytes.append(data, take);
    kept_ += take;
    pos_ += take, data += take, n -= take;
    if (b.bytes.size() == b.want) Complete();
  }
  return true;
}

void TarHeaderKeeper::Complete() {
  const Block& b = blocks_.back();
  if (!b.header) {  // a long name: the next header follows its padding
    next_ = b.offset + (b.want + 511) / 512 * 512;
    blocks_.push_back({next_, 512, true, {}});
    return;
  }
  uint64_t size = 0;
  if (std::all_of(b.bytes.begin(), b.bytes.end(), [](char c) { return c == 0; }) ||
      !ParseHeader(b.bytes.data(), &size)) {
    done_ = true;  // the end of the archive, or damage the walker reports from this block
    return;
  }
  const uint64_t data = b.offset + 512;
  if (b.bytes[156] == 'L' && size > 0) {
    if (size > kMaxLongName) {
      done_ = true;  // the walker cannot read the name: it reports the shard damaged here
      return;
    }
    blocks_.push_back({data, size, false, {}});
    next_ = data;
    return;
  }
  next_ = data + (size + 511) / 512 * 512;
  blocks_.push_back({next_, 512, true, {}});
}

TarReader TarHeaderKeeper::Reader(uint64_t size) const {
  return {size, [this](char* buf, uint64_t n, uint64_t off) {
            auto it = std::upper_bound(blocks_.begin(), blocks_.end(), off,
                                       [](uint64_t o, const Block& b) { return o < b.offset; });
            if (it == blocks_.begin()) return false;
            const Block& b = *(it - 1);
            if (off + n > b.offset + b.bytes.size()) return false;
            std::memcpy(buf, b.bytes.data() + (off - b.offset), n);
            return true;
          }};
}

TarReader TarFile(int fd) {
  struct stat st;
  return {::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0,
          [fd](char* buf, uint64_t n, uint64_t off) { return FullPread(fd, buf, n, off); }};
}

Status CheckMemberHeader(const char* h, uint64_t size, const std::string& name) {
  uint64_t got = 0;
  if (!ParseHeader(h, &got)) return Status::Corrupt("no valid tar header before the member");
  if (got != size)
    return Status::Corrupt(
        fmt::format("the tar header before the member says {} bytes, the index {}", got, size));
  if (name.empty() || name.size() >= 100) return Status::Ok();  // a long name lives elsewhere
  std::string in(h, strnlen(h, 100));
  if (std::memcmp(h + 257, "ustar", 5) == 0 && h[345])
    in = std::string(h + 345, strnlen(h + 345, 155)) + "/" + in;
  if (in != name)
    return Status::Corrupt(fmt::format("the tar header names '{}', not '{}'", in, name));
  return Status::Ok();
}

void WalkTarSamples(
    const TarReader& tar, const std::string& shard, size_t max_key,
    const std::function<void(const std::string& key, const std::vector<TarMember>&)>& sample,
    const std::function<void(const std::string& origin, const std::string& reason)>& damage) {
  const uint64_t file_size = tar.size;
  std::string key, skipped_key;
  std::vector<TarMember> members;
  auto flush = [&] {
    if (!key.empty()) sample(key, members);
    key.clear();
    members.clear();
  };
  uint64_t off = 0;
  std::string long_name;
  char h[512];
  while (true) {
    if (off + 512 > file_size) {
      if (off != file_size || off == 0)
        damage(shard, fmt::format("tar truncated at offset {} (no end-of-archive marker)", off));
      break;
    }
    if (!tar.read(h, 512, off)) {
      damage(shard, fmt::format("read failed at offset {}", off));
      break;
    }
    if (std::all_of(h, h + 512, [](char c) { return c == 0; })) break;  // end of archive
    uint64_t size = 0;
    if (!ParseHeader(h, &size)) {
      damage(shard, fmt::format("damaged tar header at offset {}", off));
      break;
    }
    const uint64_t data_off = off + 512;
    const uint64_t next = data_off + (size + 511) / 512 * 512;
    const char type = h[156];
    std::string name;
    if (!long_name.empty()) {
      name = std::move(long_name);
      long_name.clear();
    } else {
      name.assign(h, strnlen(h, 100));
      if (std::memcmp(h + 257, "ustar", 5) == 0 && h[345])
        name = std::string(h + 345, strnlen(h + 345, 155)) + "/" + name;
    }
    if (data_off + size > file_size) {
      damage(shard + ":" + name,
             fmt::format("tar truncated: member needs {} bytes at offset {}, file ends at {}", size,
                         data_off, file_size));
      break;
    }
    if (type == 'L') {  // GNU long name: the name is the member's data
      long_name.resize(size);
      if (!tar.read(long_name.data(), size, data_off)) {
        damage(shard, fmt::format("read failed at offset {}", data_off));
        break;
      }
      long_name.resize(strnlen(long_name.c_str(), size));
    } else if (type == '0' || type == 0) {
      const size_t slash = name.rfind('/');
      const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
      std::string k = dot == std::string::npos ? name : name.substr(0, dot);
      if (k != key) {
        flush();
        if (k.size() > max_key) {
          if (k != skipped_key)
            damage(shard + ":" + k.substr(0, 64) + "...",
                   fmt::format("sample key is longer than {} bytes", max_key));
          skipped_key = std::move(k);
          off = next;
          continue;
        }
        key = std::move(k);
      }
      members.push_back({dot == std::string::npos ? "" : name.substr(dot + 1), data_off, size});
    }
    off = next;
  }
  flush();
}

ShardIndex::~ShardIndex() = default;

Result<std::unique_ptr<ShardIndex>> ShardIndex::Open(const std::vector<std::string>& shards,
                                                     const std::string& index_dir, size_t max_key,
                                                     std::vector<Damage>* damage,
                                                     RemoteStore* remote) {
  std::unique_ptr<ShardIndex> idx(new ShardIndex());
  const auto t0 = std::chrono::steady_clock::now();
  // Remote shards are looked at (a HEAD each, and a whole fetch where an index is built) by as
  // many threads as the store fetches with; local ones in order, on this thread.
  const size_t n = shards.size();
  std::vector<std::unique_ptr<Shard>> opened(n);
  std::vector<std::vector<Damage>> damages(n);
  std::vector<uint64_t> stamps(n);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      opened[i] = std::make_unique<Shard>();
      opened[i]->path = shards[i];
      idx->OpenShard(opened[i].get(), index_dir, max_key, remote, &damages[i], &stamps[i]);
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; remote && t < std::min<size_t>(n, remote->concurrency()); ++t)
    pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  uint64_t h = HashString("shards");
  for (size_t i = 0; i < n; ++i) {
    opened[i]->first = idx->total_;
    h = HashString(fmt::format("{}|{:016x}", opened[i]->count, stamps[i]), h);
    idx->total_ += opened[i]->count;
    idx->shards_.push_back(std::move(opened[i]));
    for (Damage& d : damages[i]) damage->push_back(std::move(d));
  }
  idx->fingerprint_ = h;
  if (idx->built_ > 0)
    spdlog::info("indexed {} of {} shards ({} samples in all) in {:.1f} s{}", idx->built_.load(),
                 shards.size(), idx->total_,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                 idx->in_memory_ ? fmt::format("; {} kept in memory", idx->in_memory_.load()) : "");
  return idx;
}

void ShardIndex::OpenShard(Shard* s, const std::string& index_dir, size_t max_key,
                           RemoteStore* remote, std::vector<Damage>* damage, uint64_t* stamp_hash) {
  // A local shard is stamped from its file; a remote one from its HEAD (size, Last-Modified,
  // ETag), and fetched whole only when its index has to be built.
  int fd = -1;
  index_file::Stamp stamp{};
  const index_file::Stamp* want = &stamp;
  if (remote) {
    Result<RemoteStore::ObjectInfo> info = remote->Head(s->path);
    if (!info.ok()) {
      damage->push_back({s->path, info.status().message()});
      return;
    }
    index_file::Stamp st{};
    st.size = info->size;
    st.mtime_ns = info->mtime_s * 1000000000;
    st.ends_hash = HashString(info->etag, HashString(std::to_string(info->size)));
    // A server that sends neither Last-Modified nor an ETag leaves the size alone to tell
    // shards apart: two shard sets of equal sizes would look like one (and a reload from one to
    // the other would not switch at an epoch boundary). The URL then stands in.
    if (info->etag.empty() && info->mtime_s < 0) st.ends_hash = HashString(s->path, st.ends_hash);
    stamp = st;
  } else {
    fd = ::open(s->path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      damage->push_back({s->path, std::string("cannot open: ") + std::strerror(errno)});
      return;
    }
    Result<index_file::Stamp> described = index_file::Describe(fd, s->path, kShardEndBytes);
    if (!described.ok()) {
      ::close(fd);
      damage->push_back({s->path, described.status().message()});
      return;
    }
    stamp = *described;
  }
  struct Closer {
    int* fd;
    ~Closer() {
      if (*fd >= 0) ::close(*fd);
    }
  } closer{&fd};
  *stamp_hash = index_file::Hash(*want);
  s->bytes = want->size;
  // Remote shards' indexes go to the state dir, or stay in memory.
  const std::string path =
      remote && index_dir.empty() ? "" : index_file::IndexPath(s->path, index_dir);
  // Maps the index file if it describes the shard. Its header and damage report are read, not
  // touched through the mapping, so that a start maps no page of it: records become resident
  // as samples are dealt.
  Header h{};
  std::string report;
  auto map = [&]() -> std::string {
    if (path.empty()) return "none kept";
    const int ifd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ifd < 0) return "none yet";
    struct stat st;
    std::string why = "the index file is truncated or damaged";
    if (::fstat(ifd, &st) == 0 && FullPread(ifd, &h, sizeof h, 0))
      why = Stale(h, static_cast<uint64_t>(st.st_size), *want);
    if (why.empty()) {
      report.resize(h.damage_bytes);
      if (!FullPread(ifd, report.data(), report.size(), st.st_size - h.damage_bytes) ||
          !s->map.Map(ifd))
        why = fmt::format("cannot read it: {}", std::strerror(errno));
    }
    ::close(ifd);
    return why;
  };
  const char* bytes = nullptr;
  if (std::string why = map(); why.empty()) {
    bytes = s->map.data();
  } else {
    TarHeaderKeeper headers;
    TarReader tar;
    if (remote) {
      if (Status st = remote->Stream(s->path, want->size, &headers); !st.ok()) {
        damage->push_back({s->path, st.message()});
        return;
      }
      tar = headers.Reader(want->size);
    } else {
      tar = TarFile(fd);
    }
    std::string encoded = Encode(*want, tar, s->path, max_key);
    ++built_;
    spdlog::debug("{}: indexing (previous index: {})", s->path, why);
    bool written = false;
    if (!path.empty()) {
      const std::string folder = std::filesystem::path(path).parent_path().string();
      bool sweep;
      {
        std::lock_guard<std::mutex> lock(swept_mu_);
        sweep = swept_.insert(folder).second;
      }
      if (sweep) index_file::RemoveStaleTemps(folder);
      written = index_file::WriteAtomically(path, encoded) && map().empty();
      if (!written && in_memory_ == 0)
        spdlog::warn("{}: cannot write its index at {} ({}): keeping it in memory", s->path, path,
                     std::strerror(errno));
    }
    if (written) {
      bytes = s->map.data();
    } else {
      ++in_memory_;
      s->memory = std::move(encoded);
      bytes = s->memory.data();
      std::memcpy(&h, bytes, sizeof h);
      report = s->memory.substr(s->memory.size() - h.damage_bytes);
    }
  }
  s->count = h.count;
  s->offsets = reinterpret_cast<const uint64_t*>(bytes + sizeof h);
  s->records = bytes + sizeof h + (h.count + 1) * 8;
  s->records_bytes = h.records_bytes;
  ParseDamage(report, damage);
}

ShardIndex::ShardSpan ShardIndex::shard(size_t k) const {
  const Shard& s = *shards_[k];
  return {&s.path, s.first, s.count, s.bytes};
}

Status ShardIndex::Sample(size_t i, const std::string** shard, std::string* key,
                          std::vector<TarMember>* members) const {
  auto it =
      std::upper_bound(shards_.begin(), shards_.end(), static_cast<uint64_t>(i),
                       [](uint64_t v, const std::unique_ptr<Shard>& s) { return v < s->first; });
  const Shard& s = **(it - 1);
  const uint64_t j = i - s.first;
  *shard = &s.path;
  members->clear();
  const uint64_t begin = s.offsets[j], end = s.offsets[j + 1];
  auto damaged = [&] {
    return Status::Corrupt(fmt::format("the index of {} is damaged at sample {}", s.path, j));
  };
  if (begin > end || end > s.records_bytes) return damaged();
  const char* p = s.records + begin;
  const char* e = s.records + end;
  if (e - p < 3) return damaged();
  const uint8_t key_len = static_cast<uint8_t>(p[0]);
  if (e - p < 1 + key_len + 2) return damaged();
  key->assign(p + 1, key_len);
  p += 1 + key_len;
  const uint16_t count = Get<uint16_t>(p);
  p += 2;
  for (uint16_t m = 0; m < count; ++m) {
    if (e - p < 1) return damaged();
    const uint8_t ext_len = static_cast<uint8_t>(p[0]);
    if (e - p < 1 + ext_len + 16) return damaged();
    TarMember t;
    t.ext.assign(p + 1, ext_len);
    p += 1 + ext_len;
    t.offset = Get<uint64_t>(p);
    t.size = Get<uint64_t>(p + 8);
    p += 16;
    members->push_back(std::move(t));
  }
  return Status::Ok();
}

}  // namespace mmfeed
