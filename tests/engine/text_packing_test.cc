#include "engine/text_packing.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <deque>

#include "engine/config.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

// The inner sink: keeps what it is given.
class Keep : public BatchSink {
 public:
  explicit Keep(int64_t rows, int64_t len) : rows_(rows), len_(len) {}
  Reservation Reserve(BatchMemory* m, int) override {
    mem_.emplace_back(rows_ * (2 * len_ + 1), 0);
    int32_t* d = mem_.back().data();
    m->base = {reinterpret_cast<uint8_t*>(d), reinterpret_cast<uint8_t*>(d + rows_ * len_),
               reinterpret_cast<uint8_t*>(d + rows_ * len_ + rows_)};
    return Reservation::kReserved;
  }
  void Commit(const BatchMemory& m, const BatchInfo& info) override {
    const auto* d = reinterpret_cast<const int32_t*>(m.base[0]);
    const auto* l = reinterpret_cast<const int32_t*>(m.base[1]);
    const auto* doc = reinterpret_cast<const int32_t*>(m.base[2]);
    for (uint32_t r = 0; r < info.rows; ++r) {
      rows.push_back(std::vector<int32_t>(d + r * len_, d + (r + 1) * len_));
      docs.push_back(std::vector<int32_t>(doc + r * len_, doc + (r + 1) * len_));
      lengths.push_back(l[r]);
    }
    ids.push_back(info.ids);
    seqs.push_back(info.seq);
  }
  void Discard(const BatchMemory&) override {}
  void Finish(bool) override { finished = true; }
  std::vector<std::vector<int32_t>> rows, docs;
  std::vector<std::vector<std::string>> ids;
  std::vector<int32_t> lengths;
  std::vector<uint64_t> seqs;
  bool finished = false;

 private:
  int64_t rows_, len_;
  std::deque<std::vector<int32_t>> mem_;
};

// Feeds documents of the given lengths (tokens 1000*doc + i) through a PackingSink.
void Feed(PackingSink& sink, const std::vector<int>& lengths, int64_t max_len, int64_t batch,
          uint32_t epoch = 0, int first = 0) {
  for (size_t b = 0; b < lengths.size(); b += batch) {
    BatchMemory m;
    ASSERT_EQ(sink.Reserve(&m, 0), Reservation::kReserved);
    BatchInfo info;
    info.epoch = epoch;
    info.rows = static_cast<uint32_t>(std::min(lengths.size(), b + batch) - b);
    for (size_t i = b; i < std::min(lengths.size(), b + batch); ++i) {
      size_t row = i - b;
      int32_t* t = reinterpret_cast<int32_t*>(m.base[0]) + row * max_len;
      for (int k = 0; k < lengths[i]; ++k) t[k] = 1000 * static_cast<int>(first + i) + k;
      reinterpret_cast<int32_t*>(m.base[1])[row] = lengths[i];
      info.ids.push_back(fmt::format("d{}", first + i));
    }
    sink.Commit(m, info);
  }
}

TEST(PackingSinkTest, ConcatenatesDocumentsIntoFullRowsWithDocumentIds) {
  const int64_t L = 8, B = 2;
  Keep inner(B, L);
  PackingSink sink(&inner, L, B, -1);
  Feed(sink, {3, 7, 2, 4, 5}, L, B);  // 21 tokens: rows of 8, 8, 5
  sink.Finish(true);
  ASSERT_EQ(inner.rows.size(), 3u);
  EXPECT_EQ(inner.rows[0], (std::vector<int32_t>{0, 1, 2, 1000, 1001, 1002, 1003, 1004}));
  EXPECT_EQ(inner.docs[0], (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(inner.rows[1], (std::vector<int32_t>{1005, 1006, 2000, 2001, 3000, 3001, 3002, 3003}));
  EXPECT_EQ(inner.docs[1], (std::vector<int32_t>{0, 0, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(inner.rows[2], (std::vector<int32_t>{4000, 4001, 4002, 4003, 4004, -1, -1, -1}));
  EXPECT_EQ(inner.docs[2], (std::vector<int32_t>{0, 0, 0, 0, 0, -1, -1, -1}));
  EXPECT_EQ(inner.lengths, (std::vector<int32_t>{8, 8, 5}));
  ASSERT_EQ(inner.ids.size(), 2u);  // batches of 2 rows: [row0, row1], [row2]
  EXPECT_EQ(inner.ids[0], (std::vector<std::string>{"d0", "d1", "d2", "d3"}));
  EXPECT_EQ(inner.ids[1], (std::vector<std::string>{"d4"}));
  EXPECT_EQ(inner.seqs, (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(inner.finished);
}

TEST(PackingSinkTest, DocumentSpansBatchesAndEpochsDoNotMix) {
  const int64_t L = 4, B = 1;
  Keep inner(B, L);
  PackingSink sink(&inner, L, B, 0);
  Feed(sink, {3, 4}, L, B, 0);  // rows [d0 d0 d0 d1] [d1 d1 d1 pad]
  Feed(sink, {1}, L, B, 1, 2);  // a new epoch starts a new row
  sink.Finish(true);
  ASSERT_EQ(inner.rows.size(), 3u);
  EXPECT_EQ(inner.rows[0], (std::vector<int32_t>{0, 1, 2, 1000}));
  EXPECT_EQ(inner.docs[0], (std::vector<int32_t>{0, 0, 0, 1}));
  EXPECT_EQ(inner.rows[1], (std::vector<int32_t>{1001, 1002, 1003, 0}));
  EXPECT_EQ(inner.docs[1], (std::vector<int32_t>{0, 0, 0, -1}));
  EXPECT_EQ(inner.lengths, (std::vector<int32_t>{4, 3, 1}));
  EXPECT_EQ(inner.ids[0], (std::vector<std::string>{"d0", "d1"}));
  EXPECT_EQ(inner.ids[1], std::vector<std::string>{"d1"})
      << "a document cut across batches is listed in both";
  EXPECT_EQ(inner.ids[2], std::vector<std::string>{"d2"});
}

TEST(PackingSinkTest, PackRequiresTextToBeTheOnlyBatchInput) {
  testing::TempDir dir;
  testing::WriteFile(dir / "m.jsonl", "{\"id\": \"a\", \"image\": \"x.jpg\", \"text\": \"t\"}\n");
  std::string yaml =
      "source: {type: manifest, path: m.jsonl}\n"
      "stages:\n"
      "  - {name: image, type: image, field: image, params: {size: [8, 8]}}\n"
      "  - {name: text, type: text, field: text, params: {max_len: 16, pack: true}}\n"
      "  - {name: batch, type: batch, inputs: [image, text], params: {batch_size: 2}}\n";
  Result<PipelineConfig> r = ParseConfig(yaml, dir / "p.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("p.yaml:4:5: stage 'text' packs its samples into rows (pack: "
                                      "true), so it must be the only input"),
            std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace mmfeed
