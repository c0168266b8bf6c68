#include "stages/runtime/pipeline.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include "tests/stage_util.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::TempDir;
using testing::WriteFile;

// A committed batch, as a MemorySink keeps it.
struct MemBatch {
  uint64_t seq = 0;
  uint32_t epoch = 0;
  std::vector<std::string> ids;
  std::vector<testing::Output> tensors;  // [n, ...] each
};

// Keeps every batch in heap memory; optionally blocks in Commit until released.
class MemorySink : public BatchSink {
 public:
  MemorySink(std::vector<TensorSpec> specs, int64_t batch_size) : specs_(std::move(specs)), batch_size_(batch_size) {}
  bool Reserve(BatchMemory* m) override {
    std::lock_guard<std::mutex> lock(mu_);
    m->handle = static_cast<int>(memory_.size());
    memory_.emplace_back();
    m->base.clear();
    for (const TensorSpec& s : specs_) {
      memory_.back().emplace_back(s.NumBytes() * batch_size_, 0xAB);  // garbage a hole would show
      m->base.push_back(memory_.back().back().data());
    }
    return true;
  }
  void Commit(const BatchMemory& m, const BatchInfo& info) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !hold_; });
    auto b = std::make_unique<MemBatch>();
    b->seq = info.seq;
    b->epoch = info.epoch;
    b->ids = info.ids;
    for (size_t k = 0; k < specs_.size(); ++k) {
      testing::Output t{specs_[k], {}};
      EXPECT_EQ(info.rows, info.ids.size());
      t.spec.shape.insert(t.spec.shape.begin(), static_cast<int64_t>(info.rows));
      t.data.assign(m.base[k], m.base[k] + specs_[k].NumBytes() * info.rows);
      b->tensors.push_back(std::move(t));
    }
    batches.push_back(std::move(b));
  }
  void Discard(const BatchMemory&) override { ++discarded; }
  void Finish() override { finished = true; }
  void Hold(bool h) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = h;
    cv_.notify_all();
  }
  std::vector<std::unique_ptr<MemBatch>> batches;
  std::atomic<int> discarded{0};
  std::atomic<bool> finished{false};

 private:
  std::vector<TensorSpec> specs_;
  int64_t batch_size_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  std::deque<std::vector<std::vector<uint8_t>>> memory_;
};

std::string Config(int consumers, int workers, int batch, const std::string& extra_source = "",
                   const std::string& on_error = "skip") {
  return "pipeline: t\n"
         "source: {type: manifest, path: manifest.jsonl, shuffle: true, seed: 7" + extra_source + "}\n"
         "consumers: " + std::to_string(consumers) + "\n"
         "on_error: " + on_error + "\n"
         "stages:\n"
         "  - {name: image, type: image, field: image, workers: " + std::to_string(workers) + ",\n"
         "     params: {crop: random_resized_crop, size: [32, 48], flip: 0.5, dtype: float32, layout: CHW,\n"
         "              mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}}\n"
         "  - {name: text, type: text, field: text, workers: " + std::to_string(workers) + ", params: {max_len: 16}}\n"
         "  - {name: batch, type: batch, inputs: [image, text], params: {batch_size: " + std::to_string(batch) + "}}\n";
}

struct PipelineRun {
  std::vector<std::unique_ptr<MemorySink>> sinks;
  std::unique_ptr<Pipeline> pipeline;
  Status create_status;
};

PipelineRun RunPipeline(const TempDir& dir, const std::string& yaml, bool wait = true) {
  PipelineRun run;
  WriteFile(dir / "p.yaml", yaml);
  Result<PipelineConfig> cfg = LoadConfigFile(dir / "p.yaml");
  EXPECT_TRUE(cfg.ok()) << cfg.status().message();
  if (!cfg.ok()) return run;
  std::vector<BatchSink*> sinks;
  for (int r = 0; r < cfg->consumers; ++r) {
    run.sinks.push_back(std::make_unique<MemorySink>(BatchSpecs(*cfg), cfg->batch_size));
    sinks.push_back(run.sinks.back().get());
  }
  auto p = Pipeline::Create(*cfg, sinks);
  if (!p.ok()) {
    run.create_status = p.status();
    return run;
  }
  run.pipeline = std::move(p.value());
  EXPECT_TRUE(run.pipeline->Start().ok());
  if (wait) run.pipeline->Wait();
  return run;
}

TEST(PipelineTest, EveryRankGetsDistinctSamplesAndEqualBatchCounts) {
  TempDir dir;
  testing::MakeImageTextDataset(dir.path(), 100);
  PipelineRun run = RunPipeline(dir, Config(3, 2, 8));
  ASSERT_TRUE(run.pipeline) << run.create_status.message();
  std::set<std::string> seen;
  for (auto& s : run.sinks) {
    EXPECT_TRUE(s->finished);
    ASSERT_EQ(s->batches.size(), 5u) << "33 samples per rank: 4 batches of 8 and one of 1";
    EXPECT_EQ(s->batches.back()->ids.size(), 1u);
    for (size_t i = 0; i < s->batches.size(); ++i) {
      const MemBatch& b = *s->batches[i];
      const std::vector<testing::Output>& tensors = b.tensors;
      EXPECT_EQ(b.seq, i);
      ASSERT_EQ(tensors.size(), 3u);
      EXPECT_EQ(tensors[0].spec.name, "image");
      EXPECT_EQ(tensors[0].spec.shape, (std::vector<int64_t>{static_cast<int64_t>(b.ids.size()), 3, 32, 48}));
      EXPECT_EQ(tensors[1].spec.shape, (std::vector<int64_t>{static_cast<int64_t>(b.ids.size()), 16}));
      EXPECT_EQ(tensors[2].spec.name, "text_lengths");
      for (size_t k = 0; k < b.ids.size(); ++k) {
        EXPECT_TRUE(seen.insert(b.ids[k]).second) << "sample " << b.ids[k] << " delivered twice";
        // The text tensor must belong to the same sample as the id (join by sequence).
        std::string want = "caption " + b.ids[k].substr(1);
        const int32_t* ids = reinterpret_cast<const int32_t*>(tensors[1].data.data()) + k * 16;
        std::string got;
        for (int j = 0; j < reinterpret_cast<const int32_t*>(tensors[2].data.data())[k]; ++j) got += static_cast<char>(ids[j]);
        EXPECT_EQ(got, want);
      }
    }
  }
  EXPECT_EQ(seen.size(), 99u);
}

// Concatenates every batch's ids and tensor bytes, per rank.
std::string Fingerprint(const PipelineRun& run) {
  std::string out;
  for (auto& s : run.sinks)
    for (auto& b : s->batches) {
      for (auto& id : b->ids) out += id + ",";
      for (auto& t : b->tensors) out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    }
  return out;
}

TEST(PipelineTest, SameBytesWhateverTheWorkerCount) {
  TempDir dir;
  testing::MakeImageTextDataset(dir.path(), 40);
  PipelineRun one = RunPipeline(dir, Config(2, 1, 4));
  PipelineRun three = RunPipeline(dir, Config(2, 3, 4));
  ASSERT_TRUE(one.pipeline && three.pipeline);
  std::string a = Fingerprint(one), b = Fingerprint(three);
  EXPECT_GT(a.size(), 40u * 32 * 48 * 3 * 4);
  EXPECT_TRUE(a == b) << "batches differ between 1 and 3 workers";
}

TEST(PipelineTest, ShuffleDependsOnSeedAndEpoch) {
  TempDir dir;
  testing::MakeImageTextDataset(dir.path(), 40);
  auto ids = [](const PipelineRun& r) {
    std::vector<std::string> out;
    for (auto& b : r.sinks[0]->batches) out.insert(out.end(), b->ids.begin(), b->ids.end());
    return out;
  };
  PipelineRun two_epochs = RunPipeline(dir, Config(1, 2, 5, ", epochs: 2"));
  std::vector<std::string> all = ids(two_epochs);
  ASSERT_EQ(all.size(), 80u);
  std::vector<std::string> e0(all.begin(), all.begin() + 40), e1(all.begin() + 40, all.end());
  EXPECT_NE(e0, e1) << "each epoch has its own order";
  EXPECT_EQ(std::set<std::string>(e0.begin(), e0.end()).size(), 40u);
  EXPECT_EQ(two_epochs.sinks[0]->batches[8]->epoch, 1u);
  PipelineRun again = RunPipeline(dir, Config(1, 1, 5, ", epochs: 1"));
  EXPECT_EQ(ids(again), e0);
  std::string other_seed = Config(1, 1, 5);
  other_seed.replace(other_seed.find("seed: 7"), 7, "seed: 8");
  EXPECT_NE(ids(RunPipeline(dir, other_seed)), e0);
}

TEST(PipelineTest, BackPressureBoundsWorkInFlight) {
  TempDir dir;
  testing::MakeImageTextDataset(dir.path(), 2000);
  WriteFile(dir / "p.yaml", Config(1, 1, 4));
  Result<PipelineConfig> cfg = LoadConfigFile(dir / "p.yaml");
  ASSERT_TRUE(cfg.ok());
  MemorySink sink(BatchSpecs(*cfg), cfg->batch_size);
  sink.Hold(true);
  auto p = Pipeline::Create(*cfg, {&sink});
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*p)->Start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  nlohmann::json prof = (*p)->Profile();
  uint64_t dealt = prof["stages"][0]["items"];
  EXPECT_LT(dealt, 400u) << "a blocked consumer must stop the source";
  EXPECT_GT(dealt, 4u);
  (*p)->RequestStop();
  sink.Hold(false);
  (*p)->Wait();
  EXPECT_TRUE(sink.finished);
  size_t delivered = 0;
  for (auto& b : sink.batches) delivered += b->ids.size();
  EXPECT_EQ(delivered, static_cast<size_t>((*p)->Profile()["stages"][0]["items"].get<uint64_t>()))
      << "on stop, every sample dealt is delivered";
}

// Writes a dataset with one good sample per photo and every kind of bad input.
void MakeBadDataset(const TempDir& dir) {
  testing::MakeImageTextDataset(dir.path(), 10);
  std::string jpeg = testing::ReadFile(testing::TestData("photos/photo00.jpg"));
  WriteFile(dir / "truncated.jpg", jpeg.substr(0, jpeg.size() / 2));
  WriteFile(dir / "notimage.jpg", "this is not an image at all");
  WriteFile(dir / "empty.jpg", "");
  WriteFile(dir / "huge.jpg", testing::PatchJpegSize(jpeg, 60000, 60000));
  WriteFile(dir / "latin1.txt", "caf\xe9 au lait");
  std::ofstream m(dir / "manifest.jsonl", std::ios::app);
  m << "{\"id\": \"bad_missing\", \"image\": \"nope.jpg\", \"text\": \"x\"}\n"
    << "{\"id\": \"bad_truncated\", \"image\": \"truncated.jpg\", \"text\": \"x\"}\n"
    << "{\"id\": \"bad_notimage\", \"image\": \"notimage.jpg\", \"text\": \"x\"}\n"
    << "{\"id\": \"bad_empty\", \"image\": \"empty.jpg\", \"text\": \"x\"}\n"
    << "{\"id\": \"bad_huge\", \"image\": \"huge.jpg\", \"text\": \"x\"}\n"
    << "{\"id\": \"bad_text\", \"image\": \"photo00.jpg\", \"text\": {\"path\": \"latin1.txt\"}}\n"
    << "{\"id\": \"bad_line\", \"image\": \"photo00.jpg\", \"text\": \n";
}

TEST(PipelineTest, BadInputsAreSkippedCountedAndBatchesRefilled) {
  TempDir dir;
  MakeBadDataset(dir);
  PipelineRun run = RunPipeline(dir, Config(1, 2, 5));
  ASSERT_TRUE(run.pipeline) << run.create_status.message();
  EXPECT_TRUE(run.pipeline->status().ok());
  std::set<std::string> got;
  ASSERT_EQ(run.sinks[0]->batches.size(), 2u) << "10 good samples refill 2 full batches";
  for (auto& b : run.sinks[0]->batches) {
    EXPECT_EQ(b->ids.size(), 5u);
    got.insert(b->ids.begin(), b->ids.end());
  }
  EXPECT_EQ(got.size(), 10u);
  for (const std::string& id : got) EXPECT_EQ(id[0], 's');
  nlohmann::json errors = run.pipeline->errors().ToJson();
  EXPECT_EQ(errors["total"], 7);
  std::map<std::string, std::string> by_origin;
  for (auto& e : errors["recent"]) by_origin[e["origin"]] = e["message"];
  auto message_for = [&](const std::string& line) {
    for (auto& [origin, msg] : by_origin)
      if (origin.size() >= line.size() && origin.compare(origin.size() - line.size(), line.size(), line) == 0) return msg;
    return std::string("<none>");
  };
  EXPECT_NE(message_for(":11").find("nope.jpg: no such file"), std::string::npos) << message_for(":11");
  EXPECT_NE(message_for(":12").find("Premature end of JPEG"), std::string::npos) << message_for(":12");
  EXPECT_NE(message_for(":13").find("not a decodable image"), std::string::npos) << message_for(":13");
  EXPECT_NE(message_for(":14").find("empty file"), std::string::npos) << message_for(":14");
  EXPECT_NE(message_for(":15").find("60000x60000"), std::string::npos) << message_for(":15");
  EXPECT_NE(message_for(":16").find("not valid UTF-8"), std::string::npos) << message_for(":16");
  EXPECT_NE(message_for(":17").find("malformed JSON"), std::string::npos) << message_for(":17");
}

TEST(PipelineTest, RefilledBatchesAreTheSameWhateverTheWorkerCount) {
  TempDir dir;
  MakeBadDataset(dir);
  PipelineRun one = RunPipeline(dir, Config(2, 1, 3));
  PipelineRun three = RunPipeline(dir, Config(2, 3, 3));
  ASSERT_TRUE(one.pipeline && three.pipeline);
  std::string a = Fingerprint(one);
  EXPECT_TRUE(a == Fingerprint(three)) << "hole filling must not depend on timing";
  // 16 usable catalog entries dealt 8 per rank; 6 of them fail.
  size_t delivered = 0;
  for (auto& s : one.sinks)
    for (auto& b : s->batches) {
      delivered += b->ids.size();
      for (auto& id : b->ids) EXPECT_EQ(id[0], 's');
      // Every row of a committed batch holds a real sample, not the sink's 0xAB filler.
      const float* img = reinterpret_cast<const float*>(b->tensors[0].data.data());
      for (size_t r = 0; r < b->ids.size(); ++r) EXPECT_NE(reinterpret_cast<const uint32_t*>(img)[r * 3 * 32 * 48], 0xABABABABu);
    }
  EXPECT_EQ(delivered, 10u);
}

TEST(PipelineTest, OnErrorFailStopsWithThePathAndReason) {
  TempDir dir;
  testing::MakeImageTextDataset(dir.path(), 10);
  std::ofstream(dir / "manifest.jsonl", std::ios::app) << "{\"id\": \"bad\", \"image\": \"nope.jpg\", \"text\": \"x\"}\n";
  PipelineRun run = RunPipeline(dir, Config(1, 1, 2, "", "fail"));
  ASSERT_TRUE(run.pipeline);
  Status st = run.pipeline->status();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("manifest.jsonl:11"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("nope.jpg: no such file"), std::string::npos) << st.message();
  EXPECT_TRUE(run.sinks[0]->finished);

  std::ofstream(dir / "manifest.jsonl", std::ios::app) << "not json\n";
  PipelineRun bad_line = RunPipeline(dir, Config(1, 1, 2, "", "fail"));
  EXPECT_FALSE(bad_line.pipeline);
  EXPECT_NE(bad_line.create_status.message().find("manifest.jsonl:12: malformed JSON"), std::string::npos)
      << bad_line.create_status.message();
}

}  // namespace
}  // namespace mmfeed
