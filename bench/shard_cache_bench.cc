// mmfeed-bench-shard-cache: what checking a cached shard against its checksums costs, side by
// side with reading it unchecked, in one run, from a warm page cache (the worst case for the
// check: no disk time hides it).
//   mmfeed-bench-shard-cache --dir DIR [--mb 256] [--member-kb 100] [--rounds 5]
// Prints JSON: MB/s of each way of reading, and the ratios to the unchecked read:
//   whole:  the shard held whole (Find with check_all into a private memory copy, as the remote
//           store holds it, then read) against Find, then read;
//   stream: a streamed shard (each 1 MiB chunk verified, then used) against the same reads;
//   member: members of --member-kb at random offsets (CheckedCopy of their blocks, then read
//           from the copy) against the reads.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "base/rng.h"
#include "source/shard_cache.h"

namespace {

double Seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t ReadAll(int fd, uint64_t size, std::vector<char>* buf) {
  uint64_t sum = 0;
  for (uint64_t at = 0; at < size; at += buf->size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf->size(), size - at));
    if (::pread(fd, buf->data(), n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) return 0;
    sum += static_cast<unsigned char>((*buf)[n - 1]);
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  uint64_t mb = 256, member_kb = 100;
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    if (a == "--mb") mb = std::stoull(argv[i + 1]);
    if (a == "--member-kb") member_kb = std::stoull(argv[i + 1]);
    if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: mmfeed-bench-shard-cache --dir DIR [--mb 256] [--rounds 5]\n");
    return 2;
  }
  using mmfeed::ShardCache;
  auto cache = ShardCache::Open(dir, (mb + 16) << 20);
  if (!cache.ok()) {
    std::fprintf(stderr, "%s\n", cache.status().message().c_str());
    return 1;
  }
  const uint64_t size = mb << 20;
  const ShardCache::Key key{"http://bench/shard.tar", size, "etag"};
  {
    std::vector<char> chunk(1 << 20);
    std::mt19937_64 rng(1);
    const int fd = (*cache)->Begin();
    for (uint64_t at = 0; at < size; at += chunk.size()) {
      for (auto& c : chunk) c = static_cast<char>(rng());
      if (::pwrite(fd, chunk.data(), chunk.size(), static_cast<off_t>(at)) !=
          static_cast<ssize_t>(chunk.size()))
        return 1;
    }
    (*cache)->Commit(fd, key, nullptr, 0);
    ::close(fd);
  }
  std::vector<char> buf(16 * ShardCache::kBlock);
  std::vector<uint64_t> members;
  std::mt19937_64 rng(2);
  for (int i = 0; i < 2000; ++i) members.push_back(rng() % (size - (member_kb << 10)));
  double plain = 0, whole = 0, stream = 0, member_plain = 0, member_checked = 0;
  uint64_t sink = 0;
  for (int r = 0; r < rounds; ++r) {  // interleaved, so drift hits every way alike
    auto t0 = std::chrono::steady_clock::now();
    int fd = (*cache)->Find(key, false);
    sink += ReadAll(fd, size, &buf);
    ::close(fd);
    plain += Seconds(t0);

    t0 = std::chrono::steady_clock::now();
    fd = (*cache)->Find(key, true, /*private_copy=*/true);
    sink += ReadAll(fd, size, &buf);
    ::close(fd);
    whole += Seconds(t0);

    t0 = std::chrono::steady_clock::now();
    fd = (*cache)->Find(key, false);
    for (uint64_t at = 0; at < size; at += buf.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - at));
      if (::pread(fd, buf.data(), n, static_cast<off_t>(at)) != static_cast<ssize_t>(n) ||
          !(*cache)->Verify(fd, size, buf.data(), at, n).empty())
        return 1;
      sink += static_cast<unsigned char>(buf[n - 1]);
    }
    ::close(fd);
    stream += Seconds(t0);

    std::vector<char> m(member_kb << 10);
    for (bool check : {false, true}) {
      t0 = std::chrono::steady_clock::now();
      fd = (*cache)->Find(key, false);
      for (uint64_t at : members) {
        // Checked: the member's blocks copied into a private memory file as they are checked
        // (what the remote store serves), then read from there.
        const int from = check ? (*cache)->CheckedCopy(fd, key, at, m.size()) : fd;
        if (from < 0) return 1;
        if (::pread(from, m.data(), m.size(), static_cast<off_t>(at)) !=
            static_cast<ssize_t>(m.size()))
          return 1;
        if (check) ::close(from);
        sink += static_cast<unsigned char>(m[0]);
      }
      ::close(fd);
      (check ? member_checked : member_plain) += Seconds(t0);
    }
  }
  const double total_mb = static_cast<double>(size) * rounds / 1e6;
  const double member_mb = static_cast<double>(members.size() * (member_kb << 10)) * rounds / 1e6;
  std::printf(
      "{\"shard_mb\": %llu, \"rounds\": %d, \"unchecked_mb_s\": %.0f, \"whole_checked_mb_s\": "
      "%.0f, \"stream_checked_mb_s\": %.0f, \"whole_time_ratio\": %.2f, \"stream_time_ratio\": "
      "%.2f, \"member_kb\": %llu, \"member_unchecked_mb_s\": %.0f, \"member_checked_mb_s\": "
      "%.0f, \"member_time_ratio\": %.2f, \"sink\": %llu}\n",
      static_cast<unsigned long long>(mb), rounds, total_mb / plain, total_mb / whole,
      total_mb / stream, whole / plain, stream / plain, static_cast<unsigned long long>(member_kb),
      member_mb / member_plain, member_mb / member_checked, member_checked / member_plain,
      static_cast<unsigned long long>(sink % 10));
  return 0;
}
