// PackingSink: sequence packing for text-only pretraining, a transform of the engine's batches
// (PipelineConfig::packing says when: a text stage with `pack: true` as the batch's only input).
// It sits in front of a rank's real sink and turns batches of samples (each a tokenized document,
// `<name>` [max_len] padded plus
// `<name>_lengths`) into batches of full rows: documents are concatenated in the rank's order
// and cut into rows of max_len tokens, a document that does not fit continuing on the next row.
// No padding is wasted except in the last row before an epoch ends or the data stops.
//
// Packed batches (engine/batch_plan.h, PackedTextSpecs) carry `<name>` [B, max_len] int32,
// `<name>_lengths` [B] int32 (tokens used in the row) and `<name>_doc_ids` [B, max_len] int32: for
// each position the document's index within its row (0, 1, ...), -1 on padding, so attention can be
// kept within documents. A packed batch's ids are those of the documents it holds (a document cut
// across two batches is listed in both).
//
// Reserve is called from the source thread, Commit/Discard/Finish from the batch thread.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/pipeline.h"

namespace mmfeed {

class PackingSink : public BatchSink {
 public:
  PackingSink(BatchSink* inner, int64_t max_len, int64_t batch_size, int32_t pad_id);
  // The transform `cfg` asks for in front of `inner`, or null when its batches are not packed.
  // It outlives pipelines as the sink does: a reload's next pipeline fills the same open row.
  static std::unique_ptr<PackingSink> For(const PipelineConfig& cfg, BatchSink* inner);

  Reservation Reserve(BatchMemory* memory, int timeout_ms) override;
  void Commit(const BatchMemory& memory, const BatchInfo& info) override;
  void Discard(const BatchMemory& memory) override;
  void Finish(bool complete) override;

 private:
  void Append(const int32_t* tokens, int32_t n, const std::string& id, uint32_t epoch);
  void FlushRow();
  void FlushBatch();

  BatchSink* inner_;
  const int64_t max_len_, batch_size_;
  const int32_t pad_id_;

  std::mutex mu_;  // scratch_ is shared by the source and batch threads
  std::map<int, std::vector<int32_t>> scratch_;  // handle -> [batch_size][max_len + 1]
  int next_handle_ = 0;

  // Batch thread only: the full rows of the batch being filled, and the open row.
  std::vector<int32_t> tokens_, doc_ids_, lengths_;
  std::vector<int32_t> row_tokens_, row_docs_;
  int64_t fill_ = 0;         // tokens in the open row
  int32_t doc_in_row_ = -1;  // index of the current document within the open row
  uint32_t rank_ = 0;
  std::vector<std::string> ids_;
  uint32_t epoch_ = 0;
  uint64_t seq_ = 0;
  bool any_ = false;
};

}  // namespace mmfeed
