// RemoteStore: WebDataset shards in object storage, over HTTP(S) range requests or the S3 API
// (SigV4-signed by libcurl's CURLOPT_AWS_SIGV4), read through libcurl.
//
// Shards are fetched whole into anonymous memory files (memfd) by `concurrency` fetch threads,
// in the order the pipeline's source asks for them (SetWanted: the shards of the windows its
// ranks read now and next, docs/design/remote.md). At most `prefetch_bytes` of shards are held or
// in flight; shards no longer wanted are dropped, least recently read first, when a wanted one
// needs their room (readers keep their own descriptor of a dropped shard). A sample read
// (OpenRange) is served from its shard's memory, waits for the shard if it is being fetched or
// is wanted, and otherwise reads just the member with a range request (a refill drawn from an
// earlier window, a shard larger than the budget).
//
// With `cache: {dir, max_bytes}` (source/shard_cache.h) a shard is looked for on local disk
// before it is fetched, fetched into the cache's folder, and kept there when it earns the room:
// the pipeline tells the store when each shard is read next (SetFuture), so both the disk
// cache and the choice of which held shard to drop for a wanted one go by next use (Belady's
// MIN) rather than by recency.
//
// Every request is retried with exponential backoff and jitter on connection errors, timeouts
// (a connect or a transfer stalled for timeout_s), 5xx, 408 and 429; other answers fail at once.
// A shard whose whole fetch fails for good is logged with its URL and reason once, listed in
// Stats(), and its samples fail with that reason for a minute before it is tried again.
//
// Failing for good needs the store to answer (once it has answered at all in this run: a store
// down from the start fails the start as before): a request whose retries are spent (or whose
// sample's deadline passed) while no other request was answered asks the store about another
// object (a HEAD, one attempt). If that is not answered either, the store is down (it hangs,
// refuses, or answers 5xx to everything): the request goes on retrying (every 5 s at most) and
// the deadline of the sample waiting for it moves on by the time waited, so an outage stalls
// the job instead of skipping its samples, and the job goes on exactly when the store answers
// again. A run of failed requests with no answer between them is an outage; one older than
// stall_s is logged once and reported in Stats() (stalled_seconds, stalled_requests: the
// failing URLs and why), which status, metrics, the profile and trainers' timeouts read.
//
// Thread-safe: Head and Stream are called while the catalog is built, OpenRange from worker
// threads, Want from the source thread, Stats from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "source/sample.h"
#include "source/shard_cache.h"
#include "source/source_config.h"

namespace mmfeed {

class RemoteStore : public RemoteReader {
 public:
  // Resolves S3 credentials, region and endpoint (config.h, RemoteConfig) when `path` is an
  // s3:// URL; errors name what is missing.
  static Result<std::unique_ptr<RemoteStore>> Create(const RemoteConfig& cfg,
                                                     const std::string& path);
  ~RemoteStore() override;
  int concurrency() const { return cfg_.concurrency; }
  RemoteStore(const RemoteStore&) = delete;
  RemoteStore& operator=(const RemoteStore&) = delete;

  struct ObjectInfo {
    uint64_t size = 0;
    int64_t mtime_s = -1;  // Last-Modified, -1 when not given
    std::string etag;
    // A range answer's Content-Range: bytes first-last/total (-1: none or unparsable).
    int64_t range_first = -1, range_last = -1;
  };
  Result<ObjectInfo> Head(const std::string& url);
  // The whole object, `size` bytes as Head said, in a memfd (the caller closes it).
  Result<int> FetchAll(const std::string& url, uint64_t size);

  // Where Stream puts an object's bytes: handed over in order as they arrive, Reset() before a
  // retry starts over.
  class BodySink {
   public:
    virtual ~BodySink() = default;
    virtual void Reset() = 0;
    virtual bool Add(const char* data, size_t n) = 0;  // false aborts the transfer
  };
  // The whole object, `size` bytes as Head said, handed to `sink` as it arrives (what keeps
  // memory bounded while a shard is indexed: the sink keeps what it needs). Refused before any
  // byte is asked for when `size` is over max_shard_bytes. With a cache, read from the cached
  // copy when there is one, else written to the cache as it streams.
  Status Stream(const std::string& url, uint64_t size, BodySink* sink);

  // A member read by a range request asks for its tar header too (the 512 bytes before it) and
  // checks it (CheckMemberHeader), as it checks the answer's Content-Range: a server that
  // answers with other bytes fails the sample, named, instead of feeding it.
  Result<FieldFile> OpenRange(const std::string& url, uint64_t offset, uint64_t size,
                              const std::string& member) override;

  // When shards are read, from the pipeline's order: times grow along it. Immutable: a new one
  // is set as the order moves on.
  class Future {
   public:
    static constexpr uint64_t kNever = UINT64_MAX;
    virtual ~Future() = default;
    // The time of `url`'s first read after time t (kNever: none foreseen).
    virtual uint64_t NextAfter(const std::string& url, uint64_t t) const = 0;
    // How many shard reads come after time a up to time b (kNever when not known).
    virtual uint64_t ReadsBetween(uint64_t a, uint64_t b) const = 0;
  };
  struct Want {
    std::string url;
    uint64_t size;
    uint64_t time = Future::kNever;  // of the read it is wanted for, on the future's clock
  };
  void SetFuture(std::shared_ptr<const Future> future);
  // The shards wanted next, most urgent first: those that fit prefetch_bytes are fetched (in
  // that order) and kept; the others held may be dropped to make room.
  void SetWanted(const std::vector<Want>& shards);

  // bytes, shards fetched, range reads, retries, seconds fetching and readers' seconds waiting,
  // held bytes, the shards' total size (data_bytes), failed shard fetches and the latest of them
  // (url, reason); with a cache, its ShardCache::Stats() prefixed "cache_".
  nlohmann::json Stats() const;

 private:
  struct Shard {
    enum class State { kIdle, kFetching, kReady, kFailed };
    State state = State::kIdle;
    uint64_t size = 0;
    int fd = -1;  // kReady
    bool wanted = false;
    std::string reason;                   // kFailed
    int64_t failed_ns = 0;                // kFailed: when
    uint64_t last_use_ns = 0;             // kReady: when it was last read (or arrived)
    uint64_t read_time = Future::kNever;  // wanted: of the read it is wanted for
  };
  struct Request;

  explicit RemoteStore(const RemoteConfig& cfg);
  // The http(s) URL a request for `url` goes to (s3:// mapped to the endpoint).
  std::string HttpUrl(const std::string& url) const;
  // GETs `size` bytes of `url` (from `offset` when `range`, else the whole object) into `into`
  // (-1: a new memfd), adding the time taken to *ns. *write_errno: why writing `into` failed.
  Result<int> Get(const std::string& url, bool range, uint64_t offset, uint64_t size,
                  std::atomic<uint64_t>* ns, int into = -1, int* write_errno = nullptr);
  // A whole shard for its read at `time`: from the cache when it holds it, else fetched (into the
  // cache when it can take it, then kept there if it earns the room, else into memory).
  Result<int> Load(const std::string& url, uint64_t size, uint64_t time);
  // The cache's key of `url` as its HEAD described it (false: no cache, or not HEADed).
  bool CacheKey(const std::string& url, ShardCache::Key* key) const;
  // Commits `fd` (from ShardCache::Begin, holding `key`'s bytes, read at `time`) to the cache,
  // ranked by the future when there is one and the time is known; its bytes copied into
  // `copy_to` as they are read (ShardCache::Commit: false when they could not all be).
  bool Keep(int fd, const ShardCache::Key& key, uint64_t time, int copy_to = -1);
  // Performs `req` with retries; the body goes to `fd` at `fd_offset` (none for HEAD).
  Status Perform(Request* req);
  // An outage's bookkeeping (above): a request answered (any HTTP answer but 5xx, 408, 429),
  // or one that failed with `why`.
  void NoteAnswer();
  void NoteFailure(const std::string& url, const std::string& why);
  // Logs the outage once it is older than stall_s (once per outage). REQUIRES: mu_ held.
  void LogStallOnce(int64_t now) const;
  // Whether the store is down for a request about to give up on `url`: it answered before in
  // this run (a store that never did is not waited for), no request was answered since the
  // caller's failure (unless `force`: a wait with no failure of its own), and a probe of another
  // object is not answered either (at most one probe a second). *was_out: an outage
  // was in progress (a failure since the last answer).
  bool StoreDown(const std::string& url, bool force, bool* was_out);
  void FetchLoop();

  RemoteConfig cfg_;
  bool s3_ = false;
  std::string s3_endpoint_, s3_region_, s3_key_, s3_secret_, s3_token_;
  bool s3_virtual_hosts_ = false;  // AWS's own endpoint: https://bucket.s3.region.amazonaws.com

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Shard> shards_;
  std::vector<std::string> order_;                           // wanted, most urgent first
  uint64_t held_bytes_ = 0;                                  // kReady and kFetching shards
  std::vector<std::pair<std::string, std::string>> failed_;  // the latest that failed for good
  uint64_t failed_total_ = 0;
  bool stop_ = false;
  std::atomic<bool> stopping_{false};  // stop_, for transfers to check without the lock
  std::vector<std::thread> fetchers_;
  std::unique_ptr<ShardCache> cache_;
  // url -> its HEAD's size, and its ETag and Last-Modified (the cache's stamp)
  std::map<std::string, std::pair<uint64_t, std::string>> stamps_;
  std::shared_ptr<const Future> future_;
  std::mutex handles_mu_;
  std::vector<void*> handles_;  // idle curl easy handles (each keeps its connections open)
  // The outage in progress (under mu_): since when no request was answered, how many failed,
  // the latest failing URLs and why; when the store last answered and was last probed.
  struct Outage {
    int64_t since_ns = 0;
    uint64_t failures = 0;
    std::map<std::string, std::string> failing;  // url -> why (the latest kMostFailing)
    bool reported = false;                       // logged once past stall_s
  };
  mutable std::optional<Outage> outage_;  // mutable: Stats() logs a stall once (LogStallOnce)
  int64_t last_answer_ns_ = 0;
  int64_t last_probe_ns_ = 0;
  bool last_probe_answered_ = true;
  bool probing_ = false;  // a probe is under way (StoreDown): others wait for its answer

  std::atomic<uint64_t> bytes_{0}, shards_fetched_{0}, range_reads_{0}, retries_{0}, fetch_ns_{0},
      wait_ns_{0}, requests_{0};
};

// Stores' Stats() added up (a mixture's remote sources): the counts summed, the failed shards
// listed together. Null when `stats` is empty.
nlohmann::json SumStorageStats(const std::vector<nlohmann::json>& stats);
// For the profile: (name, value) pairs of a Stats() (or a sum of them).
std::vector<std::pair<std::string, double>> StorageMetrics(const nlohmann::json& stats);

}  // namespace mmfeed
