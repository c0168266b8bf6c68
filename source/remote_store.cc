#include "source/remote_store.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>

#include "base/clock.h"
#include "source/aws_credentials.h"
#include "source/cache_policy.h"
#include "source/index_file.h"
#include "source/shard_index.h"

namespace mmfeed {
namespace {

// A shard that failed for good is not asked for again for this long: its samples fail at once.
constexpr int64_t kFailedTtlNs = 60'000'000'000;
// Stats() lists the most recent failures (every one is logged).
constexpr size_t kMostFailedListed = 64;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

}  // namespace

struct RemoteStore::Request {
  std::string url;  // as the catalog names it (messages)
  bool head = false;
  bool probe = false;  // StoreDown's: one attempt, never waits out an outage
  bool range = false;
  uint64_t offset = 0, size = 0;  // the range, or the whole object's expected size
  int fd = -1;                    // where the body goes (GET)...
  BodySink* sink = nullptr;       // ...or to whom
  // Filled in by Perform.
  uint64_t written = 0;
  int write_errno = 0;  // writing the body to fd failed
  bool overflow = false;
  long status = 0;
  ObjectInfo info;
};

namespace {

struct Transfer {
  RemoteStore::ObjectInfo* info;
  int fd;
  RemoteStore::BodySink* sink;
  uint64_t limit, *written;
  int* write_errno;
  bool* overflow;
  CURL* curl;
  const std::atomic<bool>* stop;
  bool deadline;  // give up when the calling thread's sample deadline passes
};

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status < 200 || status >= 300) return bytes;  // an error page: not the object
  if (*t->written + bytes > t->limit) {
    *t->overflow = true;
    return 0;  // aborts the transfer
  }
  if (t->sink) {
    if (!t->sink->Add(data, bytes)) return 0;
    *t->written += bytes;
    return bytes;
  }
  if (!index_file::FullPwrite(t->fd, data, bytes, *t->written)) {
    *t->write_errno = errno;
    return 0;
  }
  *t->written += bytes;
  return bytes;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  if (line.size() > 5 && strncasecmp(line.c_str(), "etag:", 5) == 0)
    t->info->etag = Trim(line.substr(5));
  if (line.size() > 14 && strncasecmp(line.c_str(), "content-range:", 14) == 0) {
    unsigned long long first = 0, last = 0;
    if (std::sscanf(line.c_str() + 14, " bytes %llu-%llu/", &first, &last) == 2 && first <= last) {
      t->info->range_first = static_cast<int64_t>(first);
      t->info->range_last = static_cast<int64_t>(last);
    }
  }
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (redirects)
    t->info->etag.clear();
    t->info->range_first = t->info->range_last = -1;
  }
  return size * n;
}

int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->stop->load(std::memory_order_relaxed)) return 1;
  return t->deadline && SampleDeadlinePassed() ? 1 : 0;
}

std::once_flag g_curl_init;

constexpr uint64_t kTarBlock = 512;

// The member's tar header, the block at `at` of `fd` just before its data (at `data`): checked
// when there is a whole block before the data.
Status CheckHeaderAt(int fd, uint64_t at, uint64_t data, uint64_t size, const std::string& member,
                     const std::string& url) {
  if (data - at < kTarBlock) return Status::Ok();
  char h[kTarBlock];
  if (::pread(fd, h, kTarBlock, static_cast<off_t>(at)) != static_cast<ssize_t>(kTarBlock))
    return Status::Io(fmt::format("{}: cannot read the header of member {}", url, member));
  Status st = CheckMemberHeader(h, size, member);
  if (!st.ok())
    return Status::Corrupt(
        fmt::format("{}: member {} at offset {}: {} (the server answered with "
                    "other bytes, or the shard changed since it was indexed)",
                    url, member, data, st.message()));
  return Status::Ok();
}

// Sets a reset handle up for one request: the URL, protocols, redirects, timeouts, the
// callbacks (into `t`), HEAD or a range, and for S3 (`sigv4` not null) SigV4 signing with
// `userpwd` and the session `token`. Returns the header list, for curl_slist_free_all after.
curl_slist* SetOptions(CURL* curl, const std::string& url, bool head, const std::string& range,
                       double timeout_s, Transfer* t, const std::string* sigv4,
                       const std::string& userpwd, const std::string& token) {
  curl_easy_reset(curl);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout_s * 1000));
  // A transfer that moves nothing for timeout_s is given up (and retried); a slow but moving
  // one is not, however large the shard.
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                   std::max(1L, static_cast<long>(std::ceil(timeout_s))));
  curl_easy_setopt(curl, CURLOPT_FILETIME, 1L);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, t);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, t);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, t);
  if (head) curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  if (!range.empty()) curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
  curl_slist* headers = nullptr;
  if (sigv4) {
    curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4->c_str());
    curl_easy_setopt(curl, CURLOPT_USERPWD, userpwd.c_str());
    headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!token.empty())
      headers = curl_slist_append(headers, ("x-amz-security-token: " + token).c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  }
  return headers;
}

}  // namespace

RemoteStore::RemoteStore(const RemoteConfig& cfg) : cfg_(cfg) {}

Result<std::unique_ptr<RemoteStore>> RemoteStore::Create(const RemoteConfig& cfg,
                                                         const std::string& path) {
  std::call_once(g_curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  std::unique_ptr<RemoteStore> s(new RemoteStore(cfg));
  if (path.rfind("s3://", 0) == 0) {
    s->s3_ = true;
    s->s3_region_ = cfg.s3_region;
    for (const char* v : {"AWS_REGION", "AWS_DEFAULT_REGION"})
      if (s->s3_region_.empty()) s->s3_region_ = Env(v);
    if (s->s3_region_.empty()) s->s3_region_ = "us-east-1";
    s->s3_endpoint_ = cfg.s3_endpoint;
    for (const char* v : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"})
      if (s->s3_endpoint_.empty()) s->s3_endpoint_ = Env(v);
    s->s3_virtual_hosts_ = s->s3_endpoint_.empty();
    while (!s->s3_endpoint_.empty() && s->s3_endpoint_.back() == '/') s->s3_endpoint_.pop_back();
    std::string profile = cfg.s3_profile.empty() ? Env("AWS_PROFILE") : cfg.s3_profile;
    if (profile.empty()) profile = "default";
    // A file named in the YAML wins; then the environment's keys; then the usual file.
    std::string file = cfg.s3_credentials_file;
    if (file.empty()) {
      s->s3_key_ = Env("AWS_ACCESS_KEY_ID");
      s->s3_secret_ = Env("AWS_SECRET_ACCESS_KEY");
      s->s3_token_ = Env("AWS_SESSION_TOKEN");
      if (s->s3_key_.empty() || s->s3_secret_.empty()) {
        s->s3_key_.clear(), s->s3_secret_.clear(), s->s3_token_.clear();
        file = Env("AWS_SHARED_CREDENTIALS_FILE");
        if (file.empty() && !Env("HOME").empty()) file = Env("HOME") + "/.aws/credentials";
        if (file.empty() || access(file.c_str(), R_OK) != 0)
          return Status::Invalid(fmt::format(
              "{}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or name "
              "a credentials file in source.s3.credentials_file",
              path));
      }
    }
    if (!file.empty()) {
      MMFEED_ASSIGN_OR_RETURN(AwsCredentials c, ReadAwsCredentials(file, profile));
      s->s3_key_ = std::move(c.key);
      s->s3_secret_ = std::move(c.secret);
      s->s3_token_ = std::move(c.token);
    }
  }
  if (!cfg.cache_dir.empty()) {
    MMFEED_ASSIGN_OR_RETURN(s->cache_, ShardCache::Open(cfg.cache_dir, cfg.cache_max_bytes));
  }
  for (int i = 0; i < cfg.concurrency; ++i)
    s->fetchers_.emplace_back([p = s.get()] { p->FetchLoop(); });
  return s;
}

RemoteStore::~RemoteStore() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    stopping_.store(true);
  }
  changed_.notify_all();
  for (std::thread& t : fetchers_) t.join();
  for (auto& [url, s] : shards_)
    if (s.fd >= 0) ::close(s.fd);
  std::lock_guard<std::mutex> l(handles_mu_);
  for (void* c : handles_) curl_easy_cleanup(c);
}

std::string RemoteStore::HttpUrl(const std::string& url) const {
  if (!s3_) return url;
  const std::string rest = url.substr(5);  // after "s3://"
  const size_t slash = rest.find('/');
  const std::string bucket = rest.substr(0, slash);
  const std::string key = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (s3_virtual_hosts_)
    return fmt::format("https://{}.s3.{}.amazonaws.com/{}", bucket, s3_region_, key);
  return fmt::format("{}/{}/{}", s3_endpoint_, bucket, key);
}

Status RemoteStore::Perform(Request* req) {
  CURL* curl = nullptr;
  {
    std::lock_guard<std::mutex> l(handles_mu_);
    if (!handles_.empty()) {
      curl = handles_.back();
      handles_.pop_back();
    }
  }
  if (!curl) curl = curl_easy_init();
  if (!curl) return Status::ResourceExhausted("curl_easy_init failed");
  struct Return {
    RemoteStore* s;
    void* c;
    ~Return() {
      std::lock_guard<std::mutex> l(s->handles_mu_);
      s->handles_.push_back(c);
    }
  } give_back{this, curl};

  const std::string http_url = HttpUrl(req->url);
  const std::string range =
      req->range ? fmt::format("{}-{}", req->offset, req->offset + req->size - 1) : "";
  const std::string sigv4 = fmt::format("aws:amz:{}:s3", s3_region_);
  const std::string userpwd = s3_key_ + ":" + s3_secret_;
  std::mt19937_64 jitter(std::hash<std::string>()(req->url) ^ NowNs());
  std::string last_error;
  // Giving up on the request needs the store to answer another (StoreDown): while it is down,
  // the request retries and its sample's time limit is paused; when it answers again, a
  // request whose failures were the store's starts its retries afresh (once).
  std::optional<SampleDeadlinePause> waiting_out;
  bool fresh_round = false;
  int attempt = 0;
  // `force`: probe even with no failure recorded (a transfer cut at its sample's deadline).
  auto give_up = [&](bool force = false) {
    if (req->probe || stopping_.load()) return true;
    bool was_out = false;
    if (StoreDown(req->url, force, &was_out)) {
      if (!waiting_out) {
        spdlog::debug("{}: {}; the store answers no request: retrying until it does", req->url,
                      last_error);
        waiting_out.emplace();
      }
      return false;
    }
    if ((waiting_out || was_out) && !fresh_round) {
      fresh_round = true;
      waiting_out.reset();  // the sample's time limit starts again in full
      attempt = 0;
      return false;
    }
    return true;
  };
  for (;; ++attempt) {
    if (attempt > 0) {
      retries_.fetch_add(1, std::memory_order_relaxed);
      // 0.2 s, 0.4 s, ... up to 5 s, times 0.75-1.25.
      const double base = std::min(5.0, 0.2 * std::pow(2.0, attempt - 1));
      const double wait = base * std::uniform_real_distribution<double>(0.75, 1.25)(jitter);
      {
        std::unique_lock<std::mutex> l(mu_);
        if (changed_.wait_for(l, std::chrono::duration<double>(wait), [&] { return stop_; }))
          return Status::Closed(req->url + ": the store is closing");
      }
      if (!req->head && SampleDeadlinePassed() && give_up(/*force=*/true))
        return Status::Timeout(
            fmt::format("{}: {}; gave up retrying at the sample's deadline", req->url, last_error));
    }
    req->written = 0;
    req->write_errno = 0;
    req->overflow = false;
    req->status = 0;
    req->info = ObjectInfo{};
    if (req->fd >= 0 && ::ftruncate(req->fd, 0) != 0)
      return Status::Io(fmt::format("{}: {}", req->url, std::strerror(errno)));
    if (req->sink) req->sink->Reset();
    Transfer t{&req->info,        req->fd,        req->sink, req->size,  &req->written,
               &req->write_errno, &req->overflow, curl,      &stopping_, !req->head};
    curl_slist* headers = SetOptions(curl, http_url, req->head, range, cfg_.timeout_s, &t,
                                     s3_ ? &sigv4 : nullptr, userpwd, s3_token_);
    requests_.fetch_add(1, std::memory_order_relaxed);
    const CURLcode rc = curl_easy_perform(curl);
    curl_slist_free_all(headers);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &req->status);
    bool retry = false;
    if (rc == CURLE_OK) {
      const long st = req->status;
      if (st < 500 && st != 408 && st != 429) NoteAnswer();
      if (st >= 200 && st < 300) {
        if (req->range && st != 206)
          return Status::Unsupported(fmt::format(
              "{}: the server answered a range request with HTTP {} (it must support ranges)",
              req->url, st));
        if (req->range &&
            (req->info.range_first != static_cast<int64_t>(req->offset) ||
             req->info.range_last != static_cast<int64_t>(req->offset + req->size - 1)))
          return Status::Corrupt(
              fmt::format("{}: asked for bytes {}-{}, the server answered with Content-Range {}-{}",
                          req->url, req->offset, req->offset + req->size - 1, req->info.range_first,
                          req->info.range_last));
        if (req->head) {
          curl_off_t len = -1, mtime = -1;
          curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
          curl_easy_getinfo(curl, CURLINFO_FILETIME_T, &mtime);
          if (len < 0) return Status::Io(req->url + ": the server gave no Content-Length");
          req->info.size = static_cast<uint64_t>(len);
          req->info.mtime_s = static_cast<int64_t>(mtime);
          return Status::Ok();
        }
        if (req->written != req->size)
          return Status::Corrupt(fmt::format(
              "{}: {} bytes where {} were expected (the object changed since it was indexed?)",
              req->url, req->written, req->size));
        bytes_.fetch_add(req->written, std::memory_order_relaxed);
        return Status::Ok();
      }
      last_error = fmt::format("HTTP {}", st);
      retry = st >= 500 || st == 408 || st == 429;
      if (retry) NoteFailure(req->url, last_error);
      if (!retry) {
        if (st == 404)
          return Status::NotFound(fmt::format("{}: HTTP 404, no such object", req->url));
        return Status::Io(fmt::format("{}: HTTP {}", req->url, st));
      }
    } else if (req->overflow) {
      return Status::Corrupt(fmt::format(
          "{}: more than the {} bytes expected (the object changed since it was indexed?)",
          req->url, req->size));
    } else if (rc == CURLE_ABORTED_BY_CALLBACK) {
      if (stopping_.load()) return Status::Closed(req->url + ": the store is closing");
      last_error = "no answer by the sample's deadline";
      if (give_up(/*force=*/true))  // a slow store that answers: the sample's time is up
        return Status::Timeout(req->url + ": gave up at the sample's deadline (sample_timeout_s)");
      NoteFailure(req->url, last_error);
      continue;
    } else {
      last_error = curl_easy_strerror(rc);
      retry = rc != CURLE_UNSUPPORTED_PROTOCOL && rc != CURLE_URL_MALFORMAT &&
              rc != CURLE_WRITE_ERROR && rc != CURLE_OUT_OF_MEMORY;
      if (!retry) return Status::Io(fmt::format("{}: {}", req->url, last_error));
      NoteFailure(req->url, last_error);
    }
    if (attempt >= (req->probe ? 0 : cfg_.retries) && give_up())
      return Status::Io(
          fmt::format("{}: {} (after {} attempts)", req->url, last_error, attempt + 1));
    spdlog::debug("{}: {}; retrying", req->url, last_error);
  }
}

void RemoteStore::NoteAnswer() {
  std::lock_guard<std::mutex> l(mu_);
  const int64_t now = static_cast<int64_t>(NowNs());
  last_answer_ns_ = now;
  if (!outage_) return;
  if (outage_->reported)
    spdlog::warn("storage answers again after {:.0f} s ({} failed request(s)): the job goes on",
                 (now - outage_->since_ns) / 1e9, outage_->failures);
  outage_.reset();
}

void RemoteStore::NoteFailure(const std::string& url, const std::string& why) {
  constexpr size_t kMostFailing = 8;
  std::lock_guard<std::mutex> l(mu_);
  const int64_t now = static_cast<int64_t>(NowNs());
  if (!outage_) outage_ = Outage{now};
  ++outage_->failures;
  if (!outage_->failing.count(url) && outage_->failing.size() == kMostFailing)
    outage_->failing.erase(outage_->failing.begin());
  outage_->failing[url] = why;
  LogStallOnce(now);
}

void RemoteStore::LogStallOnce(int64_t now) const {
  if (!outage_ || outage_->reported ||
      now - outage_->since_ns < static_cast<int64_t>(cfg_.stall_s * 1e9))
    return;
  outage_->reported = true;
  std::string failing;
  for (const auto& [u, w] : outage_->failing) failing += fmt::format("; {}: {}", u, w);
  spdlog::error(
      "storage stalled: no request answered for {:.0f} s ({} failed{}): samples wait for it "
      "(none is skipped) and the job goes on when it answers (source.fetch_stall_s)",
      (now - outage_->since_ns) / 1e9, outage_->failures, failing);
}

bool RemoteStore::StoreDown(const std::string& url, bool force, bool* was_out) {
  Request probe;
  {
    std::unique_lock<std::mutex> l(mu_);
    *was_out = outage_.has_value();
    // Answered since the caller's failure (an outage ends at an answer): the store is up.
    if (!outage_ && !force) return false;
    // Never answered in this run: no store to wait for (a wrong URL, nothing listening at the
    // start); the request fails as it always did.
    if (last_answer_ns_ == 0) return false;
    if (probing_) {  // one probe at a time: the others take its answer
      changed_.wait(l, [&] { return !probing_ || stop_; });
      return !last_probe_answered_;
    }
    const int64_t now = static_cast<int64_t>(NowNs());
    if (now - last_probe_ns_ < 1'000'000'000) return !last_probe_answered_;  // probed just now
    for (const auto& [other, stamp] : stamps_)
      if (other != url) {
        probe.url = other;
        break;
      }
    if (probe.url.empty()) probe.url = url;  // the store's only object: asked again
    last_probe_ns_ = now;
    probing_ = true;
  }
  probe.head = true;
  probe.probe = true;
  const int64_t t0 = static_cast<int64_t>(NowNs());
  (void)Perform(&probe);
  bool answered;
  {
    std::lock_guard<std::mutex> l(mu_);
    answered = last_probe_answered_ = last_answer_ns_ >= t0;
    probing_ = false;
  }
  changed_.notify_all();
  return !answered;
}

Result<RemoteStore::ObjectInfo> RemoteStore::Head(const std::string& url) {
  Request req;
  req.url = url;
  req.head = true;
  MMFEED_RETURN_IF_ERROR(Perform(&req));
  std::lock_guard<std::mutex> l(mu_);
  stamps_[url] = {req.info.size, fmt::format("{}|{}", req.info.etag, req.info.mtime_s)};
  return req.info;
}

Result<int> RemoteStore::Get(const std::string& url, bool range, uint64_t offset, uint64_t size,
                             std::atomic<uint64_t>* ns, int into, int* write_errno) {
  Request req;
  req.url = url;
  req.range = range;
  req.offset = offset;
  req.size = size;
  req.fd = into >= 0 ? into : ShardCache::MemoryFile(range ? "mmfeed-member" : "mmfeed-shard");
  if (req.fd < 0) return Status::ResourceExhausted(fmt::format("memfd: {}", std::strerror(errno)));
  const uint64_t t0 = NowNs();
  Status st = Perform(&req);
  ns->fetch_add(NowNs() - t0, std::memory_order_relaxed);
  if (write_errno) *write_errno = req.write_errno;
  if (!st.ok()) {
    ::close(req.fd);
    return st;
  }
  (range ? range_reads_ : shards_fetched_).fetch_add(1, std::memory_order_relaxed);
  return req.fd;
}

Result<int> RemoteStore::FetchAll(const std::string& url, uint64_t size) {
  return Get(url, false, 0, size, &fetch_ns_);
}

bool RemoteStore::CacheKey(const std::string& url, ShardCache::Key* key) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = stamps_.find(url);
  if (!cache_ || it == stamps_.end()) return false;
  *key = {url, it->second.first, it->second.second};
  return true;
}

Result<int> RemoteStore::Load(const std::string& url, uint64_t size, uint64_t time) {
  ShardCache::Key key;
  if (!CacheKey(url, &key) || key.size != size) return FetchAll(url, size);
  // A held shard is a private copy, never the cache's file: a descriptor of the file would see
  // any edit made to it after the check (a cached copy is checked whole as it is copied).
  if (const int fd = cache_->Find(key, /*check_all=*/true, /*private_copy=*/true); fd >= 0)
    return fd;
  const int into = cache_->Begin();
  if (into < 0) return FetchAll(url, size);
  int write_errno = 0;
  Result<int> fd = Get(url, false, 0, size, &fetch_ns_, into, &write_errno);
  if (!fd.ok()) {
    if (write_errno == 0) return fd.status();
    cache_->WriteFailed(write_errno);  // a full disk: this shard into memory
    return FetchAll(url, size);
  }
  // Copied into memory while the file is still unnamed (no one else can open it), in the same
  // pass that computes its checksums, then kept.
  const int held = ShardCache::MemoryFile("mmfeed-shard");
  if (held < 0) {
    const int e = errno;
    ::close(*fd);
    return Status::ResourceExhausted(fmt::format("memfd: {}", std::strerror(e)));
  }
  const bool copied = Keep(*fd, key, time, held);
  ::close(*fd);
  if (copied) return held;
  ::close(held);
  return Status::Io(
      fmt::format("{}: the fetched shard could not be read back or copied into "
                  "memory (see the shard cache's warning)",
                  url));
}

bool RemoteStore::Keep(int fd, const ShardCache::Key& key, uint64_t time, int copy_to) {
  std::shared_ptr<const Future> future;
  std::set<std::string> held;  // in memory: their reads within the fetch lead come from there
  uint64_t lead = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    future = future_;
    lead = order_.size();
    for (const auto& [url, s] : shards_)
      if (s.state == Shard::State::kReady || s.state == Shard::State::kFetching) held.insert(url);
  }
  if (!future || time == Future::kNever) {
    return cache_->Commit(fd, key, nullptr, 0, copy_to);
  }
  // A shard's next read from disk: a held shard's next read within the lead (the shards wanted
  // now, this one included) is served from memory (it stays held while wanted), so its disk
  // copy is next needed for the read after.
  auto next = [&](const std::string& url) {
    const uint64_t n = future->NextAfter(url, time);
    if (n != Future::kNever && future->ReadsBetween(time, n) < lead && held.count(url))
      return future->NextAfter(url, n);
    return n;
  };
  return cache_->Commit(fd, key, next, next(key.url), copy_to);
}

void RemoteStore::SetFuture(std::shared_ptr<const Future> future) {
  std::lock_guard<std::mutex> l(mu_);
  future_ = std::move(future);
}

Status RemoteStore::Stream(const std::string& url, uint64_t size, BodySink* sink) {
  if (size > cfg_.max_shard_bytes)
    return Status::ResourceExhausted(
        fmt::format("the server says the shard is {} bytes, over source.max_shard_bytes ({}): "
                    "raise it if the shard really is that large",
                    size, cfg_.max_shard_bytes));
  // A cached copy is read instead; a fetched one is written to the cache as it streams.
  ShardCache::Key key;
  const bool cached = CacheKey(url, &key) && key.size == size;
  // Each chunk is checked against its checksums before the sink sees it; a damaged copy is
  // dropped and the shard fetched (the sink is Reset first).
  if (const int fd = cached ? cache_->Find(key, /*check_all=*/false) : -1; fd >= 0) {
    std::vector<char> buf(16 * ShardCache::kBlock);
    bool ok = true;
    sink->Reset();
    for (uint64_t at = 0; ok && at < size; at += buf.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - at));
      ok = index_file::FullPread(fd, buf.data(), n, at);
      if (const std::string why = ok ? cache_->Verify(fd, size, buf.data(), at, n) : "";
          !why.empty()) {
        cache_->Damaged(fd, key, why);
        ok = false;
      }
      ok = ok && sink->Add(buf.data(), n);
    }
    ::close(fd);
    if (ok) return Status::Ok();
  }
  struct Tee : BodySink {
    BodySink* sink;
    int fd;
    uint64_t at = 0;
    int write_errno = 0;
    void Reset() override {
      sink->Reset();
      at = 0;
      write_errno = ::ftruncate(fd, 0) == 0 ? 0 : errno;
    }
    bool Add(const char* data, size_t n) override {
      if (write_errno == 0 && !index_file::FullPwrite(fd, data, n, at)) write_errno = errno;
      at += n;
      return sink->Add(data, n);
    }
  } tee;
  tee.sink = sink;
  tee.fd = cached ? cache_->Begin() : -1;
  Request req;
  req.url = url;
  req.size = size;
  req.sink = tee.fd >= 0 ? &tee : sink;
  const uint64_t t0 = NowNs();
  Status st = Perform(&req);
  fetch_ns_.fetch_add(NowNs() - t0, std::memory_order_relaxed);
  if (st.ok()) shards_fetched_.fetch_add(1, std::memory_order_relaxed);
  if (tee.fd >= 0) {
    if (tee.write_errno != 0)
      cache_->WriteFailed(tee.write_errno);
    else if (st.ok())
      (void)Keep(tee.fd, key, Future::kNever);
    ::close(tee.fd);
  }
  return st;
}

Result<FieldFile> RemoteStore::OpenRange(const std::string& url, uint64_t offset, uint64_t size,
                                         const std::string& member) {
  const std::string identity = fmt::format("{}@{}+{}", url, offset, size);
  // The member in a whole shard's copy (`fd`, taken over), its header checked.
  auto from_shard = [&](int fd, uint64_t shard_size) -> Result<FieldFile> {
    Status st = offset + size > shard_size
                    ? Status::Corrupt(fmt::format(
                          "{}: member at offset {} runs past the end of the shard", url, offset))
                    : CheckHeaderAt(fd, offset - std::min<uint64_t>(offset, kTarBlock), offset,
                                    size, member, url);
    if (!st.ok()) {
      ::close(fd);
      return st;
    }
    return FieldFile::Adopt(fd, offset, size, identity);
  };
  {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t t0 = NowNs();
    auto busy = [&](const Shard& s) {
      return s.state == Shard::State::kFetching || (s.wanted && s.state == Shard::State::kIdle);
    };
    auto it = shards_.find(url);
    // The store answering no one is not the sample's fault: its time limit pauses while the
    // store is down, and starts again in full (once) when a wait that an outage overlapped
    // runs past it.
    std::optional<SampleDeadlinePause> outage;
    bool overlapped = false, restarted = false;
    while (it != shards_.end() && busy(it->second) && !stop_) {
      overlapped = overlapped || outage_.has_value();
      if (SampleDeadlinePassed()) {
        l.unlock();
        bool was_out = false;
        const bool down = StoreDown(url, /*force=*/true, &was_out);
        l.lock();
        if (down) {
          outage.emplace();
        } else if ((overlapped || was_out) && !restarted) {
          restarted = true;
          SampleDeadlinePause{};  // restarts the limit in full
        } else {
          return Status::Timeout(url + ": waited for the shard past sample_timeout_s");
        }
        it = shards_.find(url);
        continue;
      }
      changed_.wait_for(l, std::chrono::milliseconds(100));
      it = shards_.find(url);
    }
    wait_ns_.fetch_add(NowNs() - t0, std::memory_order_relaxed);
    if (it != shards_.end() && it->second.state == Shard::State::kReady) {
      it->second.last_use_ns = NowNs();
      const int fd = ::fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
      if (fd < 0)
        return Status::ResourceExhausted(fmt::format("{}: {}", url, std::strerror(errno)));
      return from_shard(fd, it->second.size);
    }
    if (it != shards_.end() && it->second.state == Shard::State::kFailed)
      return Status::Io(it->second.reason);
  }
  // Not held and not coming: the cached copy's member, else just this member (an empty one needs
  // no request).
  if (ShardCache::Key key; size > 0 && CacheKey(url, &key)) {
    if (const int fd = cache_->Find(key, /*check_all=*/false); fd >= 0) {
      // The member and its header block, checked against their checksums as they are copied:
      // what was checked is what the stage reads, whatever is done to the file meanwhile.
      const uint64_t from = offset - std::min<uint64_t>(offset, kTarBlock);
      const int copy =
          offset + size <= key.size ? cache_->CheckedCopy(fd, key, from, offset + size - from) : -1;
      ::close(fd);
      if (copy >= 0) return from_shard(copy, key.size);
      // damaged (removed and counted): the member from the store
    }
  }
  if (size == 0) {
    const int fd = ShardCache::MemoryFile("mmfeed-member");
    if (fd < 0) return Status::ResourceExhausted(fmt::format("memfd: {}", std::strerror(errno)));
    return FieldFile::Adopt(fd, 0, 0, identity);
  }
  // With the member's tar header (the block before its data) when there is one.
  const uint64_t before = std::min<uint64_t>(offset, kTarBlock);
  MMFEED_ASSIGN_OR_RETURN(int fd, Get(url, true, offset - before, size + before, &wait_ns_));
  Status header = CheckHeaderAt(fd, 0, before, size, member, url);
  if (!header.ok()) {
    ::close(fd);
    return header;
  }
  return FieldFile::Adopt(fd, before, size, identity);
}

void RemoteStore::SetWanted(const std::vector<Want>& shards) {
  std::lock_guard<std::mutex> l(mu_);
  const int64_t now = static_cast<int64_t>(NowNs());
  std::set<std::string> wanted;
  order_.clear();
  uint64_t total = 0;
  for (const Want& w : shards) {
    if (wanted.count(w.url)) continue;
    if (total + w.size > cfg_.prefetch_bytes) break;
    total += w.size;
    wanted.insert(w.url);
    order_.push_back(w.url);
    Shard& s = shards_[w.url];
    s.size = w.size;
    s.read_time = w.time;
  }
  for (auto it = shards_.begin(); it != shards_.end();) {
    Shard& s = it->second;
    s.wanted = wanted.count(it->first) > 0;
    if (s.state == Shard::State::kFailed && now - s.failed_ns > kFailedTtlNs)
      s.state = Shard::State::kIdle;
    if (!s.wanted && s.state == Shard::State::kIdle)
      it = shards_.erase(it);
    else
      ++it;
  }
  changed_.notify_all();
}

void RemoteStore::FetchLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    std::string url;
    for (const std::string& u : order_) {
      auto it = shards_.find(u);
      if (it == shards_.end() || !it->second.wanted || it->second.state != Shard::State::kIdle)
        continue;
      // Room is made by dropping the shards no longer wanted, by the caches' one rule
      // (source/cache_policy.h): the one read next furthest in the future first, or without a
      // future the least recently read (workers may still read the last window's shards while
      // the source deals the next). No bypass: the wanted shard must be held.
      const uint64_t now = it->second.read_time;
      std::vector<Shard*> held;
      std::vector<EvictionCandidate> candidates;
      for (auto& [vu, v] : shards_) {
        if (v.wanted || v.state != Shard::State::kReady) continue;
        held.push_back(&v);
        candidates.push_back(
            {future_ && now != Future::kNever ? future_->NextAfter(vu, now) : kNeverRead, v.size,
             v.last_use_ns});
      }
      const Eviction plan = PlanEviction(candidates, held_bytes_, it->second.size, kNeverRead,
                                         cfg_.prefetch_bytes, /*bypass=*/false);
      if (plan.keep) {
        for (size_t v : plan.victims) {
          ::close(held[v]->fd);
          held[v]->fd = -1;
          held[v]->state = Shard::State::kIdle;
          held_bytes_ -= held[v]->size;
        }
        url = u;
      }
      break;  // in order: a later shard never overtakes one waiting for room
    }
    if (url.empty()) {
      changed_.wait(l);
      continue;
    }
    Shard& s = shards_[url];
    s.state = Shard::State::kFetching;
    const uint64_t size = s.size, time = s.read_time;
    held_bytes_ += size;
    l.unlock();
    Result<int> fd = Load(url, size, time);
    l.lock();
    Shard& done = shards_[url];  // still there: a fetching shard is never erased
    if (fd.ok() && done.wanted) {
      done.fd = *fd;
      done.state = Shard::State::kReady;
      done.last_use_ns = NowNs();
    } else {
      held_bytes_ -= size;
      if (fd.ok()) {
        ::close(*fd);
        done.state = Shard::State::kIdle;
      } else if (fd.status().code() != Status::Code::kClosed) {
        done.state = Shard::State::kFailed;
        done.reason = fd.status().message();
        done.failed_ns = static_cast<int64_t>(NowNs());
        spdlog::error("shard {} failed: {}; its samples fail for the next {} s", url, done.reason,
                      kFailedTtlNs / 1000000000);
        if (failed_.size() == kMostFailedListed) failed_.erase(failed_.begin());
        failed_.emplace_back(url, done.reason);
        ++failed_total_;
      } else {
        done.state = Shard::State::kIdle;
      }
    }
    changed_.notify_all();
  }
}

nlohmann::json RemoteStore::Stats() const {
  nlohmann::json j;
  j["bytes"] = bytes_.load();
  j["requests"] = requests_.load();
  j["shards_fetched"] = shards_fetched_.load();
  j["range_reads"] = range_reads_.load();
  j["retries"] = retries_.load();
  j["fetch_seconds"] = fetch_ns_.load() / 1e9;
  j["wait_seconds"] = wait_ns_.load() / 1e9;
  std::lock_guard<std::mutex> l(mu_);
  j["held_bytes"] = held_bytes_;
  uint64_t data = 0;
  for (const auto& [url, stamp] : stamps_) data += stamp.first;
  j["data_bytes"] = data;
  j["prefetch_bytes"] = cfg_.prefetch_bytes;
  j["failed_shard_fetches"] = failed_total_;
  // An outage older than stall_s: how long, and the requests failing (url, why).
  j["stalled_seconds"] = 0.0;
  j["stalled_requests"] = nlohmann::json::array();
  if (outage_) {
    // Logged here too: a stall with requests hung in long transfers may see no new failure.
    LogStallOnce(static_cast<int64_t>(NowNs()));
    const double age = (static_cast<int64_t>(NowNs()) - outage_->since_ns) / 1e9;
    if (age >= cfg_.stall_s) {
      j["stalled_seconds"] = age;
      for (const auto& [url, why] : outage_->failing)
        j["stalled_requests"].push_back({{"url", url}, {"error", why}});
    }
  }
  j["failed_shards"] = nlohmann::json::array();  // the most recent
  for (const auto& [url, reason] : failed_)
    j["failed_shards"].push_back({{"url", url}, {"reason", reason}});
  if (cache_) {
    const nlohmann::json cache = cache_->Stats();
    for (const auto& [key, value] : cache.items()) j["cache_" + key] = value;
  }
  return j;
}

nlohmann::json SumStorageStats(const std::vector<nlohmann::json>& stats) {
  if (stats.empty()) return nullptr;
  nlohmann::json sum = stats[0];
  for (size_t k = 1; k < stats.size(); ++k)
    for (const auto& [key, value] : stats[k].items()) {
      nlohmann::json& into = sum[key];
      if (key == "stalled_seconds")  // the longest outage
        into = std::max(into.get<double>(), value.get<double>());
      else if (value.is_number_unsigned())
        into = into.get<uint64_t>() + value.get<uint64_t>();
      else if (value.is_number())
        into = into.get<double>() + value.get<double>();
      else if (value.is_array())
        into.insert(into.end(), value.begin(), value.end());
    }
  return sum;
}

std::vector<std::pair<std::string, double>> StorageMetrics(const nlohmann::json& stats) {
  const double fetch_s = stats["fetch_seconds"].get<double>();
  const double mb = stats["bytes"].get<double>() / 1e6;
  std::vector<std::pair<std::string, double>> m = {
      {"storage_mb", mb},
      {"storage_mb_per_fetch_s", fetch_s > 0 ? mb / fetch_s : 0},
      {"storage_shards_fetched", stats["shards_fetched"].get<double>()},
      {"storage_range_reads", stats["range_reads"].get<double>()},
      {"storage_retries", stats["retries"].get<double>()},
      {"storage_wait_s", stats["wait_seconds"].get<double>()},
      {"storage_failed_shards", stats["failed_shard_fetches"].get<double>()},
      {"storage_stalled_s", stats.value("stalled_seconds", 0.0)}};
  if (stats.contains("cache_hits"))
    for (const char* k : {"hits", "misses", "evicted_bytes", "not_kept", "damaged"})
      m.emplace_back(std::string("storage_cache_") + k,
                     stats[std::string("cache_") + k].get<double>());
  return m;
}

}  // namespace mmfeed
