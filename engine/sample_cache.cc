#include "engine/sample_cache.h"

#include <spdlog/spdlog.h>

#include <iterator>
#include <utility>

namespace mmfeed {

SampleCache::SampleCache(uint64_t max_bytes, NextUse next_use, std::unique_ptr<SampleDisk> disk,
                         uint64_t disk_max_bytes)
    : next_use_(std::move(next_use)),
      disk_(std::move(disk)),
      memory_(max_bytes),
      on_disk_(disk_ ? disk_max_bytes : 0) {
  stats_.max_bytes = max_bytes;
  stats_.disk_max_bytes = disk_ ? disk_max_bytes : 0;
}

void SampleCache::Advance(uint32_t epoch, std::unique_lock<std::mutex>& lock) {
  if (epoch <= epoch_) return;
  epoch_ = epoch;
  const uint64_t now = uint64_t{epoch} << 32;
  std::vector<std::pair<uint64_t, uint32_t>> stale = memory_.Before(now);  // (missed, entry)
  for (const auto& s : on_disk_.Before(now))
    if (memory_.NextOf(s.second) != s.first) stale.push_back(s);  // not looked up twice
  if (stale.empty()) return;
  lock.unlock();
  std::vector<uint64_t> next(stale.size());
  for (size_t i = 0; i < stale.size(); ++i) next[i] = next_use_(stale[i].second, epoch - 1);
  lock.lock();
  for (size_t i = 0; i < stale.size(); ++i) {
    const auto [missed, entry] = stale[i];
    for (MinSet* tier : {&memory_, &on_disk_})  // unless evicted or ranked meanwhile
      if (tier->NextOf(entry) == missed) tier->Rank(entry, next[i]);
  }
}

void SampleCache::KeepInMemory(uint32_t entry, uint64_t next,
                               std::shared_ptr<const std::string> bytes) {
  std::vector<uint32_t> out;
  if (!memory_.Admit(entry, next, bytes->size(), &out)) {
    ++stats_.not_kept;
    return;
  }
  for (uint32_t e : out) {
    stats_.evicted_bytes += kept_[e]->size();
    kept_.erase(e);
  }
  kept_[entry] = std::move(bytes);
  stats_.bytes = memory_.bytes();
  stats_.samples = memory_.size();
}

void SampleCache::KeepOnDisk(uint32_t entry, uint64_t next, const std::string& bytes,
                             std::unique_lock<std::mutex>& lock) {
  std::vector<uint32_t> out;
  if (on_disk_.contains(entry) || !on_disk_.Admit(entry, next, bytes.size(), &out)) return;
  for (uint32_t e : out) ForgetFile(e);  // a file still being written is dropped when it is
  const uint64_t serial = ++file_serial_;
  files_[entry] = {serial, false};
  lock.unlock();
  const int fd = disk_->Write(entry, bytes);
  lock.lock();
  auto it = files_.find(entry);
  if (it == files_.end() || it->second.serial != serial) {  // evicted meanwhile
    disk_->Discard(fd);
  } else if (fd >= 0 && disk_->Link(fd, entry)) {
    it->second.named = true;
    ++stats_.disk_samples;
    stats_.disk_written_bytes += bytes.size();
  } else {
    files_.erase(it);
    on_disk_.Erase(entry);
  }
  stats_.disk_bytes = on_disk_.bytes();
  stats_.disk_write_failures = disk_->write_failures();
}

void SampleCache::ForgetFile(uint32_t entry) {
  auto it = files_.find(entry);
  if (it == files_.end()) return;
  if (it->second.named) {
    disk_->Remove(entry);
    --stats_.disk_samples;
  }
  files_.erase(it);
  on_disk_.Erase(entry);
  stats_.disk_bytes = on_disk_.bytes();
}

std::shared_ptr<const std::string> SampleCache::ReadDisk(uint32_t entry, uint64_t serial) {
  Result<std::string> read = disk_->Read(entry);
  if (read.ok()) return std::make_shared<const std::string>(std::move(read.value()));
  if (read.status().code() == Status::Code::kResourceExhausted) return nullptr;  // kept for later
  std::lock_guard<std::mutex> lock(mu_);
  // A file evicted (or written again) while it was opened is a plain miss; one the tier still
  // counts on was damaged or deleted under it.
  auto it = files_.find(entry);
  if (it != files_.end() && it->second.serial == serial) {
    ForgetFile(entry);
    if (++stats_.disk_damaged <= 10)
      spdlog::warn("stage cache disk tier: {}; the stage makes the sample again{}",
                   read.status().message(), stats_.disk_damaged == 10 ? " (logged 10 times)" : "");
  }
  return nullptr;
}

std::shared_ptr<const std::string> SampleCache::Find(uint32_t entry, uint32_t epoch) {
  std::shared_ptr<const std::string> bytes;
  uint64_t serial = 0;  // the disk file's, when memory misses
  {
    std::unique_lock<std::mutex> lock(mu_);
    Advance(epoch, lock);
    if (auto it = kept_.find(entry); it != kept_.end()) {
      bytes = it->second;
    } else if (auto f = files_.find(entry); f != files_.end() && f->second.named) {
      serial = f->second.serial;
    } else {
      ++stats_.misses;
      return nullptr;
    }
  }
  if (serial && !(bytes = ReadDisk(entry, serial))) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.misses;
    return nullptr;
  }
  const uint64_t next = next_use_(entry, epoch);  // outside the lock: it may walk an order
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.hits;
  on_disk_.Rank(entry, next);
  if (!serial) {
    auto it = kept_.find(entry);
    if (it != kept_.end() && it->second == bytes) memory_.Rank(entry, next);
    return bytes;
  }
  ++stats_.disk_hits;
  if (!memory_.contains(entry)) KeepInMemory(entry, next, bytes);
  return bytes;
}

std::shared_ptr<const std::string> SampleCache::Offer(uint32_t entry, uint32_t epoch,
                                                      std::string bytes) {
  auto offered = std::make_shared<const std::string>(std::move(bytes));
  const uint64_t next = next_use_(entry, epoch);
  std::unique_lock<std::mutex> lock(mu_);
  Advance(epoch, lock);
  // Another worker's copy of the same sample (a refill) was kept first.
  if (auto it = kept_.find(entry); it != kept_.end()) return it->second;
  KeepInMemory(entry, next, offered);
  if (disk_) KeepOnDisk(entry, next, *offered, lock);
  return offered;
}

SampleCache::Stats SampleCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace mmfeed
