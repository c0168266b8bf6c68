#include "engine/text_packing.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

namespace mmfeed {

PackingSink::PackingSink(BatchSink* inner, int64_t max_len, int64_t batch_size, int32_t pad_id)
    : inner_(inner), max_len_(max_len), batch_size_(batch_size), pad_id_(pad_id) {}

std::unique_ptr<PackingSink> PackingSink::For(const PipelineConfig& cfg, BatchSink* inner) {
  if (cfg.packed_stage < 0) return nullptr;
  return std::make_unique<PackingSink>(inner, cfg.packing.max_len, cfg.batch_size,
                                       cfg.packing.pad_id);
}

Reservation PackingSink::Reserve(BatchMemory* memory, int /*timeout_ms*/) {
  std::lock_guard<std::mutex> lock(mu_);
  memory->handle = next_handle_++;
  std::vector<int32_t>& s = scratch_[memory->handle];
  s.resize(batch_size_ * (max_len_ + 1));
  memory->base = {reinterpret_cast<uint8_t*>(s.data()),
                  reinterpret_cast<uint8_t*>(s.data() + batch_size_ * max_len_)};
  return Reservation::kReserved;
}

void PackingSink::Discard(const BatchMemory& memory) {
  std::lock_guard<std::mutex> lock(mu_);
  scratch_.erase(memory.handle);
}

void PackingSink::Commit(const BatchMemory& memory, const BatchInfo& info) {
  rank_ = info.rank;
  const auto* tokens = reinterpret_cast<const int32_t*>(memory.base[0]);
  const auto* lengths = reinterpret_cast<const int32_t*>(memory.base[1]);
  for (size_t i = 0; i < info.rows; ++i)
    Append(tokens + i * max_len_, std::min<int32_t>(lengths[i], static_cast<int32_t>(max_len_)),
           info.ids[i], info.epoch);
  Discard(memory);
}

void PackingSink::Finish(bool complete) {
  FlushRow();
  FlushBatch();
  inner_->Finish(complete);
}

void PackingSink::Append(const int32_t* tokens, int32_t n, const std::string& id, uint32_t epoch) {
  if (n <= 0) return;
  if (any_ && epoch != epoch_) {  // rows do not mix epochs
    FlushRow();
    FlushBatch();
  }
  epoch_ = epoch;
  any_ = true;
  ++doc_in_row_;
  for (int32_t i = 0; i < n;) {
    if (ids_.empty() || ids_.back() != id) ids_.push_back(id);
    const int64_t take = std::min<int64_t>(n - i, max_len_ - fill_);
    row_tokens_.insert(row_tokens_.end(), tokens + i, tokens + i + take);
    row_docs_.insert(row_docs_.end(), take, doc_in_row_);
    fill_ += take;
    i += static_cast<int32_t>(take);
    if (fill_ == max_len_) {
      FlushRow();
      doc_in_row_ = 0;  // the rest of this document opens the next row
    }
  }
  if (fill_ == 0) doc_in_row_ = -1;
}

void PackingSink::FlushRow() {
  if (fill_ == 0) return;
  row_tokens_.resize(max_len_, pad_id_);
  row_docs_.resize(max_len_, -1);
  tokens_.insert(tokens_.end(), row_tokens_.begin(), row_tokens_.end());
  doc_ids_.insert(doc_ids_.end(), row_docs_.begin(), row_docs_.end());
  lengths_.push_back(static_cast<int32_t>(fill_));
  row_tokens_.clear();
  row_docs_.clear();
  fill_ = 0;
  doc_in_row_ = -1;
  if (static_cast<int64_t>(lengths_.size()) == batch_size_) FlushBatch();
}

void PackingSink::FlushBatch() {
  if (lengths_.empty()) return;
  BatchMemory m;
  Reservation r;
  while ((r = inner_->Reserve(&m, 100)) == Reservation::kFull) {
  }
  if (r == Reservation::kReserved) {
    const size_t rows = lengths_.size();
    std::memcpy(m.base[0], tokens_.data(), tokens_.size() * 4);
    std::memcpy(m.base[1], lengths_.data(), rows * 4);
    std::memcpy(m.base[2], doc_ids_.data(), doc_ids_.size() * 4);
    BatchInfo info;
    info.rank = rank_;
    info.seq = seq_++;
    info.epoch = epoch_;
    info.rows = static_cast<uint32_t>(rows);
    info.ids = std::move(ids_);
    inner_->Commit(m, info);
  } else {
    spdlog::warn("rank {}: packed batch of {} rows dropped: the sink no longer takes batches",
                 rank_, lengths_.size());
  }
  tokens_.clear();
  doc_ids_.clear();
  lengths_.clear();
  ids_.clear();
  // A document still open in the current row belongs to the next batch too.
}

}  // namespace mmfeed
