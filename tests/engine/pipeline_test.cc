#include "engine/pipeline.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <thread>

#include "base/rng.h"
#include "engine/numa.h"
#include "engine/registry.h"
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

// Keeps every batch in heap memory; optionally blocks in Commit until released. With `slots`,
// behaves like a ring of that many slots whose trainer takes each batch at once: at most
// `slots` batches reserved and not yet committed or discarded.
class MemorySink : public BatchSink {
 public:
  MemorySink(std::vector<TensorSpec> specs, int64_t batch_size, int slots = 0)
      : specs_(std::move(specs)), batch_size_(batch_size), slots_(slots) {}
  Reservation Reserve(BatchMemory* m, int) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_ && open_ >= slots_) return Reservation::kFull;
    ++open_;
    m->handle = static_cast<int>(memory_.size());
    memory_.emplace_back();
    m->base.clear();
    for (const TensorSpec& s : specs_) {
      memory_.back().emplace_back(s.NumBytes() * batch_size_, 0xAB);  // garbage a hole would show
      m->base.push_back(memory_.back().back().data());
    }
    return Reservation::kReserved;
  }
  void Commit(const BatchMemory& m, const BatchInfo& info) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !hold_; });
    auto b = std::make_unique<MemBatch>();
    b->seq = info.seq;
    b->epoch = info.epoch;
    b->ids = info.ids;
    for (size_t k = 0; k < specs_.size(); ++k) {
      testing::Output t{CommittedTensor(specs_[k], info, k), {}};
      EXPECT_EQ(info.rows, info.ids.size());
      t.data.assign(m.base[k], m.base[k] + t.spec.NumBytes());
      b->tensors.push_back(std::move(t));
    }
    batches.push_back(std::move(b));
    --open_;
  }
  void Discard(const BatchMemory&) override {
    std::lock_guard<std::mutex> lock(mu_);
    --open_;
    ++discarded;
  }
  void Finish(bool) override { finished = true; }
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
  int slots_, open_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  std::deque<std::vector<std::vector<uint8_t>>> memory_;
};

std::string Config(int consumers, int workers, int batch, const std::string& extra_source = "",
                   const std::string& on_error = "skip") {
  return "pipeline: t\n"
         "source: {type: manifest, path: manifest.jsonl, shuffle: true, seed: 7" +
         extra_source +
         "}\n"
         "consumers: " +
         std::to_string(consumers) +
         "\n"
         "on_error: " +
         on_error +
         "\n"
         "stages:\n"
         "  - {name: image, type: image, field: image, workers: " +
         std::to_string(workers) +
         ",\n"
         "     params: {crop: random_resized_crop, size: [32, 48], flip: 0.5, dtype: float32, "
         "layout: CHW,\n"
         "              mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}}\n"
         "  - {name: text, type: text, field: text, workers: " +
         std::to_string(workers) +
         ", params: {max_len: 16}}\n"
         "  - {name: batch, type: batch, inputs: [image, text], params: {batch_size: " +
         std::to_string(batch) + "}}\n";
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
      EXPECT_EQ(tensors[0].spec.shape,
                (std::vector<int64_t>{static_cast<int64_t>(b.ids.size()), 3, 32, 48}));
      EXPECT_EQ(tensors[1].spec.shape,
                (std::vector<int64_t>{static_cast<int64_t>(b.ids.size()), 16}));
      EXPECT_EQ(tensors[2].spec.name, "text_lengths");
      for (size_t k = 0; k < b.ids.size(); ++k) {
        EXPECT_TRUE(seen.insert(b.ids[k]).second) << "sample " << b.ids[k] << " delivered twice";
        // The text tensor must belong to the same sample as the id (join by sequence).
        std::string want = "caption " + b.ids[k].substr(1);
        const int32_t* ids = reinterpret_cast<const int32_t*>(tensors[1].data.data()) + k * 16;
        std::string got;
        for (int j = 0; j < reinterpret_cast<const int32_t*>(tensors[2].data.data())[k]; ++j)
          got += static_cast<char>(ids[j]);
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
      for (auto& t : b->tensors)
        out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
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

std::string AllReplaced(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

TEST(PipelineTest, WorkersAutoMovesThreadsWithoutChangingBytes) {
  TempDir dir;
  testing::MakeImageTextDataset(dir.path(), 40);
  PipelineRun fixed = RunPipeline(dir, Config(2, 1, 4, ", epochs: 3"));
  const std::string yaml =
      AllReplaced(Config(2, 1, 4, ", epochs: 3"), "workers: 1", "workers: auto") +
      "cpu_budget: 5\n";
  PipelineRun tuned = RunPipeline(dir, yaml, /*wait=*/false);
  ASSERT_TRUE(fixed.pipeline && tuned.pipeline) << tuned.create_status.message();
  Pipeline& p = *tuned.pipeline;
  EXPECT_EQ(p.cpu_budget(), 5);
  std::vector<StageSample> stages = p.SampleStages();
  ASSERT_EQ(stages[1].name, "image");
  EXPECT_TRUE(stages[1].auto_workers);
  EXPECT_EQ(stages[1].workers, 3) << "the budget split evenly, the odd one to the first";
  EXPECT_EQ(stages[2].workers, 2);
  EXPECT_EQ(stages[1].threads, 4) << "all of the budget but one for the other auto stage";
  EXPECT_FALSE(p.SetWorkers("image", 0).ok());
  EXPECT_FALSE(p.SetWorkers("image", 5).ok());
  EXPECT_FALSE(p.SetWorkers("nope", 1).ok());
  // Move threads back and forth while it runs.
  for (int i = 0; !p.Finished(); ++i) {
    ASSERT_TRUE(p.SetWorkers("image", 1 + i % 4).ok());
    ASSERT_TRUE(p.SetWorkers("text", 1 + (i + 2) % 4).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  p.Wait();
  EXPECT_TRUE(p.status().ok()) << p.status().message();
  EXPECT_TRUE(Fingerprint(fixed) == Fingerprint(tuned)) << "worker counts changed the batches";
  EXPECT_EQ(tuned.sinks[0]->batches.size(), fixed.sinks[0]->batches.size());

  // A stage with a fixed count keeps it.
  PipelineRun plain = RunPipeline(dir, Config(1, 2, 4), /*wait=*/false);
  ASSERT_TRUE(plain.pipeline);
  EXPECT_EQ(plain.pipeline->cpu_budget(), 0);
  EXPECT_FALSE(plain.pipeline->SetWorkers("image", 1).ok());
  plain.pipeline->Wait();
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
  // 16 usable catalog entries (the malformed line is not one): 4 batches of 5, 5, 5 and 1 rows
  // whatever fails; the 6 rows of failed samples are refilled with draws of good ones.
  ASSERT_EQ(run.sinks[0]->batches.size(), 4u);
  std::set<std::string> got;
  size_t rows = 0;
  for (auto& b : run.sinks[0]->batches) {
    got.insert(b->ids.begin(), b->ids.end());
    rows += b->ids.size();
  }
  EXPECT_EQ(run.sinks[0]->batches.back()->ids.size(), 1u);
  EXPECT_EQ(rows, 16u);
  EXPECT_EQ(got.size(), 10u) << "every good sample is delivered";
  for (const std::string& id : got) EXPECT_EQ(id[0], 's');
  nlohmann::json samples = run.pipeline->Profile()["samples"];
  EXPECT_EQ(samples["dealt"], 16);
  EXPECT_EQ(samples["failed"], 6);
  EXPECT_EQ(samples["refilled"], 6);
  nlohmann::json errors = run.pipeline->errors().ToJson();
  EXPECT_EQ(errors["total"], 7);
  std::map<std::string, std::string> by_origin;
  for (auto& e : errors["recent"]) by_origin[e["origin"]] = e["message"];
  auto message_for = [&](const std::string& line) {
    for (auto& [origin, msg] : by_origin)
      if (origin.size() >= line.size() &&
          origin.compare(origin.size() - line.size(), line.size(), line) == 0)
        return msg;
    return std::string("<none>");
  };
  EXPECT_NE(message_for(":11").find("nope.jpg: no such file"), std::string::npos)
      << message_for(":11");
  EXPECT_NE(message_for(":12").find("Premature end of JPEG"), std::string::npos)
      << message_for(":12");
  EXPECT_NE(message_for(":13").find("not a decodable image"), std::string::npos)
      << message_for(":13");
  EXPECT_NE(message_for(":14").find("empty file"), std::string::npos) << message_for(":14");
  EXPECT_NE(message_for(":15").find("60000x60000"), std::string::npos) << message_for(":15");
  EXPECT_NE(message_for(":16").find("not valid UTF-8"), std::string::npos) << message_for(":16");
  EXPECT_NE(message_for(":17").find("malformed JSON"), std::string::npos) << message_for(":17");
}

// Qwen vision + chat: the chat stage reads the vision stage's grid of the same sample, so it
// runs after it; a batch packs its images' patches (a ragged tensor).
std::string QwenConfig(int workers, bool pack = false) {
  const std::string w = std::to_string(workers);
  return "pipeline: t\n"
         "source: {type: manifest, path: manifest.jsonl, shuffle: true, seed: 7}\n"
         "on_error: skip\n"
         "stages:\n"
         "  - {name: chat, type: qwen_chat, field: text, workers: " +
         w +
         ",\n"
         "     params: {tokenizer: " +
         testing::TestData("tokenizer/qwen3-tokenizer.json.gz") +
         ", template: \"<|im_start|>{image}{text}<|im_end|>\", max_len: 512, pack: " +
         (pack ? "true" : "false") +
         "}}\n"
         "  - {name: pixel_values, type: qwen_vision, field: image, workers: " +
         w +
         ",\n"
         "     params: {min_pixels: 0, max_pixels: 65536}}\n"
         "  - {name: batch, type: batch, inputs: [chat, pixel_values], params: {batch_size: 5}}\n";
}

TEST(PipelineTest, AStageReadsAnotherStagesOutputsOfTheSameSample) {
  TempDir dir;
  MakeBadDataset(dir);
  PipelineRun run = RunPipeline(dir, QwenConfig(2));
  ASSERT_TRUE(run.pipeline) << run.create_status.message();
  ASSERT_EQ(run.sinks[0]->batches.size(), 4u) << "16 usable entries, batches of 5";
  for (auto& b : run.sinks[0]->batches) {
    // chat, chat_lengths, labels, pixel_values, image_grid_thw, image_grid_thw_count
    const auto& t = b->tensors;
    ASSERT_EQ(t.size(), 6u);
    EXPECT_EQ(t[4].spec.shape, (std::vector<int64_t>{static_cast<int64_t>(b->ids.size()), 3}));
    ASSERT_EQ(t[3].spec.name, "pixel_values");
    const int32_t* grids = reinterpret_cast<const int32_t*>(t[4].data.data());
    int64_t patches = 0;
    for (size_t k = 0; k < b->ids.size(); ++k) {
      const int32_t* g = grids + 3 * k;
      patches += int64_t{g[0]} * g[1] * g[2];
      const int32_t* ids = reinterpret_cast<const int32_t*>(t[0].data.data()) + k * 512;
      const int32_t n = reinterpret_cast<const int32_t*>(t[1].data.data())[k];
      EXPECT_EQ(std::count(ids, ids + n, 151655), g[0] * g[1] * g[2] / 4)
          << b->ids[k] << ": one <|image_pad|> per merged patch of its own image";
    }
    EXPECT_EQ(t[3].spec.shape, (std::vector<int64_t>{patches, 1536})) << "patches packed";
    EXPECT_EQ(t[3].data.size(), static_cast<size_t>(patches) * 1536 * 4);
  }
  // A failed image is reported once, by the vision stage; the chat stage never ran on it.
  nlohmann::json errors = run.pipeline->errors().ToJson();
  EXPECT_EQ(errors["total"], 6) << errors.dump();
  int vision = 0;
  for (auto& e : errors["recent"]) vision += e["stage"] == "pixel_values";
  EXPECT_EQ(vision, 5) << errors.dump();
  // Same bytes whatever the thread counts.
  PipelineRun one = RunPipeline(dir, QwenConfig(1));
  PipelineRun three = RunPipeline(dir, QwenConfig(3));
  EXPECT_EQ(Fingerprint(one), Fingerprint(run));
  EXPECT_EQ(Fingerprint(three), Fingerprint(run));
}

TEST(PipelineTest, PackedChatIsOneRowPerBatchWithCuSeqlens) {
  TempDir dir;
  testing::MakeImageTextDataset(dir.path(), 12);
  PipelineRun padded = RunPipeline(dir, QwenConfig(2));
  PipelineRun packed = RunPipeline(dir, QwenConfig(2, true));
  ASSERT_TRUE(padded.pipeline && packed.pipeline);
  ASSERT_EQ(packed.sinks[0]->batches.size(), padded.sinks[0]->batches.size());
  for (size_t i = 0; i < packed.sinks[0]->batches.size(); ++i) {
    const MemBatch& a = *padded.sinks[0]->batches[i];
    const MemBatch& b = *packed.sinks[0]->batches[i];
    ASSERT_EQ(a.ids, b.ids);
    // chat, chat_lengths, labels, cu_seqlens, then the vision stage's three
    ASSERT_EQ(b.tensors.size(), 7u);
    ASSERT_EQ(b.tensors[3].spec.name, "cu_seqlens");
    const int32_t* lengths = reinterpret_cast<const int32_t*>(a.tensors[1].data.data());
    std::vector<int32_t> want_ids, want_labels, want_cu = {0};
    for (size_t k = 0; k < a.ids.size(); ++k) {
      const auto* ids = reinterpret_cast<const int32_t*>(a.tensors[0].data.data()) + k * 512;
      const auto* labels = reinterpret_cast<const int32_t*>(a.tensors[2].data.data()) + k * 512;
      want_ids.insert(want_ids.end(), ids, ids + lengths[k]);
      want_labels.insert(want_labels.end(), labels, labels + lengths[k]);
      want_cu.push_back(want_cu.back() + lengths[k]);
    }
    const int64_t n = static_cast<int64_t>(want_ids.size());
    EXPECT_EQ(b.tensors[0].spec.shape, (std::vector<int64_t>{1, n}));
    EXPECT_EQ(b.tensors[2].spec.shape, (std::vector<int64_t>{1, n}));
    EXPECT_EQ(b.tensors[3].spec.shape,
              (std::vector<int64_t>{static_cast<int64_t>(a.ids.size()) + 1}));
    auto as_ints = [](const testing::Output& t) {
      const auto* p = reinterpret_cast<const int32_t*>(t.data.data());
      return std::vector<int32_t>(p, p + t.data.size() / 4);
    };
    EXPECT_EQ(as_ints(b.tensors[0]), want_ids) << "the samples' tokens, one after another";
    EXPECT_EQ(as_ints(b.tensors[2]), want_labels);
    EXPECT_EQ(as_ints(b.tensors[3]), want_cu);
    EXPECT_EQ(b.tensors[4].data, a.tensors[3].data) << "the same patches";
  }
}

// A dataset that mixes text-only samples ("images": []) with samples of one or two images:
// the text-only ones have no patches, no grid rows and no vision tokens, and a batch of text
// only holds zero-row patch and grid tensors.
TEST(PipelineTest, TextOnlySamplesOfAMixedDatasetHaveNoPatchesAndNoVisionTokens) {
  TempDir dir;
  testing::MakeImageTextDataset(dir.path(), 1);
  const std::string photo = testing::PhotoNames()[0];
  WriteFile(dir / "manifest.jsonl",
            "{\"id\": \"t0\", \"images\": [], \"text\": \"only text\"}\n"
            "{\"id\": \"t1\", \"images\": [], \"text\": \"more text\"}\n"
            "{\"id\": \"i1\", \"images\": [\"" +
                photo +
                "\"], \"text\": \"one\"}\n"
                "{\"id\": \"i2\", \"images\": [\"" +
                photo + "\", \"" + photo +
                "\"], \"text\": \"two\"}\n"
                "{\"id\": \"t2\", \"images\": [], \"text\": \"last\"}\n");
  std::string yaml = QwenConfig(2);
  for (auto [from, to] :
       {std::pair<std::string, std::string>{"shuffle: true", "shuffle: false"},
        {"field: image", "field: images"},
        {"max_pixels: 65536}", "max_pixels: 65536, max_images: 2, cu_seqlens: vision_cu_seqlens}"},
        {"batch_size: 5", "batch_size: 2"}}) {
    ASSERT_NE(yaml.find(from), std::string::npos) << from;
    yaml.replace(yaml.find(from), from.size(), to);
  }
  PipelineRun run = RunPipeline(dir, yaml);
  ASSERT_TRUE(run.pipeline) << run.create_status.message();
  EXPECT_EQ(run.pipeline->errors().ToJson()["total"], 0) << run.pipeline->errors().ToJson().dump();
  const auto& batches = run.sinks[0]->batches;
  ASSERT_EQ(batches.size(), 3u);
  auto ints = [](const testing::Output& t) {
    const auto* p = reinterpret_cast<const int32_t*>(t.data.data());
    return std::vector<int32_t>(p, p + t.data.size() / 4);
  };
  // chat, chat_lengths, labels, pixel_values, image_grid_thw, image_grid_thw_count
  const MemBatch& text = *batches[0];
  EXPECT_EQ(text.ids, (std::vector<std::string>{"t0", "t1"}));
  EXPECT_EQ(text.tensors[3].spec.shape, (std::vector<int64_t>{0, 1536})) << "no patches at all";
  EXPECT_EQ(text.tensors[4].spec.shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(ints(text.tensors[5]), (std::vector<int32_t>{0, 0}));
  const MemBatch& mixed = *batches[1];
  EXPECT_EQ(mixed.ids, (std::vector<std::string>{"i1", "i2"}));
  EXPECT_EQ(ints(mixed.tensors[5]), (std::vector<int32_t>{1, 2}));
  const std::vector<int32_t> grids = ints(mixed.tensors[4]);
  ASSERT_EQ(grids.size(), 9u) << "three images' grids";
  const int32_t pads = grids[0] * grids[1] * grids[2] / 4;
  EXPECT_EQ(mixed.tensors[3].spec.shape, (std::vector<int64_t>{12 * pads, 1536}));
  // The vision encoder's cu_seqlens: where each image's patches start, then the total.
  ASSERT_EQ(mixed.tensors[6].spec.name, "vision_cu_seqlens");
  EXPECT_EQ(ints(mixed.tensors[6]), (std::vector<int32_t>{0, 4 * pads, 8 * pads, 12 * pads}));
  EXPECT_EQ(ints(text.tensors[6]), (std::vector<int32_t>{0})) << "no image: no sequence";
  for (const MemBatch* b : {&text, &mixed}) {
    const std::vector<int32_t> ids = ints(b->tensors[0]), lengths = ints(b->tensors[1]);
    for (size_t k = 0; k < b->ids.size(); ++k) {
      const auto row = ids.begin() + k * 512;
      const int64_t vision_starts = std::count(row, row + lengths[k], 151652);
      const int64_t image_pads = std::count(row, row + lengths[k], 151655);
      const int images = ints(b->tensors[5])[k];
      EXPECT_EQ(vision_starts, images) << b->ids[k];
      EXPECT_EQ(image_pads, images * pads) << b->ids[k];
    }
  }
  EXPECT_EQ(batches[2]->tensors[3].spec.shape, (std::vector<int64_t>{0, 1536}));
}

TEST(PipelineTest, ReadingAnOutputNoStageMakesIsAnError) {
  TempDir dir;
  testing::MakeImageTextDataset(dir.path(), 4);
  std::string yaml = QwenConfig(1);
  yaml.replace(yaml.find("max_len: 512"), 12, "max_len: 512, image_grid: grid");
  WriteFile(dir / "p.yaml", yaml);
  Result<PipelineConfig> cfg = LoadConfigFile(dir / "p.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  MemorySink sink(BatchSpecs(*cfg), cfg->batch_size);
  auto p = Pipeline::Create(*cfg, {&sink});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("stage 'chat' reads 'grid', which no input"),
            std::string::npos)
      << p.status().message();
}

TEST(PipelineTest, RefilledBatchesAreTheSameWhateverTheWorkerCount) {
  TempDir dir;
  MakeBadDataset(dir);
  PipelineRun one = RunPipeline(dir, Config(2, 1, 3));
  PipelineRun three = RunPipeline(dir, Config(2, 3, 3));
  ASSERT_TRUE(one.pipeline && three.pipeline);
  std::string a = Fingerprint(one);
  EXPECT_TRUE(a == Fingerprint(three)) << "hole filling must not depend on timing";
  // 16 usable catalog entries dealt 8 per rank (3 batches: 3, 3, 2 rows); 6 of them fail and
  // are refilled.
  size_t delivered = 0;
  for (auto& s : one.sinks)
    for (auto& b : s->batches) {
      delivered += b->ids.size();
      for (auto& id : b->ids) EXPECT_EQ(id[0], 's');
      // Every row of a committed batch holds a real sample, not the sink's 0xAB filler.
      const float* img = reinterpret_cast<const float*>(b->tensors[0].data.data());
      for (size_t r = 0; r < b->ids.size(); ++r)
        EXPECT_NE(reinterpret_cast<const uint32_t*>(img)[r * 3 * 32 * 48], 0xABABABABu);
    }
  EXPECT_EQ(delivered, 16u);
}

TEST(PipelineTest, OnErrorFailStopsWithThePathAndReason) {
  TempDir dir;
  testing::MakeImageTextDataset(dir.path(), 10);
  std::ofstream(dir / "manifest.jsonl", std::ios::app)
      << "{\"id\": \"bad\", \"image\": \"nope.jpg\", \"text\": \"x\"}\n";
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
  EXPECT_NE(bad_line.create_status.message().find("manifest.jsonl:12: malformed JSON"),
            std::string::npos)
      << bad_line.create_status.message();
}

// A text-only dataset of `n` samples; sample i is bad (its text file is missing) when bad(i).
template <typename Bad>
std::set<std::string> MakeTextDataset(const TempDir& dir, int n, Bad bad) {
  std::set<std::string> good;
  std::ofstream m(dir / "manifest.jsonl");
  for (int i = 0; i < n; ++i) {
    if (bad(i)) {
      m << "{\"id\": \"b" << i << "\", \"text\": {\"path\": \"missing" << i << ".txt\"}}\n";
    } else {
      m << "{\"id\": \"s" << i << "\", \"text\": \"caption " << i << "\"}\n";
      good.insert(fmt::format("s{}", i));
    }
  }
  return good;
}

std::string TextConfig(int workers, int batch, const std::string& source_extra = "",
                       const std::string& top = "") {
  return std::string("pipeline: t\n") + "source: {type: manifest, path: manifest.jsonl" +
         (source_extra.find("seed:") == std::string::npos ? ", seed: 3" : "") + source_extra +
         "}\n"
         "consumers: 2\n" +
         top +
         "stages:\n"
         "  - {name: text, type: text, field: text, workers: " +
         std::to_string(workers) +
         ", params: {max_len: 16}}\n"
         "  - {name: batch, type: batch, inputs: [text], params: {batch_size: " +
         std::to_string(batch) + "}}\n";
}

// Decodes a text row back to the caption it holds.
std::string RowText(const MemBatch& b, size_t row, int max_len = 16) {
  const int32_t* tokens =
      reinterpret_cast<const int32_t*>(b.tensors[0].data.data()) + row * max_len;
  int32_t len = reinterpret_cast<const int32_t*>(b.tensors[1].data.data())[row];
  std::string out;
  for (int32_t j = 0; j < len; ++j) out += static_cast<char>(tokens[j]);
  return out;
}

struct FailureMix {
  const char* name;
  std::function<bool(int)> bad;
};

// Issue: skipped samples used to hold ring slots until the pipeline deadlocked. Every mix of
// failures must complete every epoch, with the same batch count for every rank, in a sink of
// 2 or 8 slots.
TEST(PipelineTest, AnyFailureMixCompletesTheEpochWithEqualBatchCounts) {
  const int n = 2048;
  std::vector<FailureMix> mixes = {
      {"none", [](int) { return false; }},
      {"every 10th", [](int i) { return i % 10 == 9; }},
      {"half at random", [](int i) { return HashString(std::to_string(i)) % 2 == 0; }},
      {"95% at random", [](int i) { return HashString(std::to_string(i)) % 20 != 0; }},
      {"600 in a row", [](int i) { return i >= 300 && i < 900; }},
  };
  for (const FailureMix& mix : mixes) {
    for (int slots : {2, 8}) {
      SCOPED_TRACE(std::string(mix.name) + ", slots " + std::to_string(slots));
      TempDir dir;
      std::set<std::string> good = MakeTextDataset(dir, n, mix.bad);
      WriteFile(dir / "p.yaml", TextConfig(2, 32, ", epochs: 2"));
      Result<PipelineConfig> cfg = LoadConfigFile(dir / "p.yaml");
      ASSERT_TRUE(cfg.ok()) << cfg.status().message();
      std::vector<std::unique_ptr<MemorySink>> sinks;
      std::vector<BatchSink*> raw;
      for (int r = 0; r < 2; ++r) {
        sinks.push_back(std::make_unique<MemorySink>(BatchSpecs(*cfg), cfg->batch_size, slots));
        raw.push_back(sinks.back().get());
      }
      auto p = Pipeline::Create(*cfg, raw);
      ASSERT_TRUE(p.ok()) << p.status().message();
      ASSERT_TRUE((*p)->Start().ok());
      (*p)->Wait();
      ASSERT_TRUE((*p)->status().ok()) << (*p)->status().message();
      const size_t bad = n - good.size();
      for (uint32_t epoch = 0; epoch < 2; ++epoch) {
        std::set<std::string> seen;
        size_t rows = 0;
        for (int r = 0; r < 2; ++r) {
          ASSERT_EQ(sinks[r]->batches.size(), 64u)
              << "32 batches per epoch per rank, whatever fails";
          for (uint64_t i = 0; i < 32; ++i) {
            const MemBatch& b = *sinks[r]->batches[epoch * 32 + i];
            EXPECT_EQ(b.seq, epoch * 32 + i);
            EXPECT_EQ(b.epoch, epoch);
            ASSERT_EQ(b.ids.size(), 32u);
            rows += b.ids.size();
            for (size_t k = 0; k < b.ids.size(); ++k) {
              ASSERT_EQ(b.ids[k][0], 's') << "a bad sample was delivered";
              ASSERT_EQ(RowText(b, k), "caption " + b.ids[k].substr(1))
                  << "row " << k << " holds another sample";
              seen.insert(b.ids[k]);
            }
          }
        }
        EXPECT_EQ(rows, static_cast<size_t>(n));
        EXPECT_EQ(seen, good) << "every good sample is delivered in every epoch";
      }
      nlohmann::json samples = (*p)->Profile()["samples"];
      EXPECT_EQ(samples["dealt"].get<size_t>(), 2u * n);
      EXPECT_EQ(samples["failed"].get<size_t>(), 2 * bad)
          << "every bad sample is counted once per epoch";
      EXPECT_EQ(samples["refilled"].get<size_t>(), 2 * bad) << "and its row refilled";
      EXPECT_EQ((*p)->errors().ToJson()["total"].get<size_t>(), 2 * bad);
    }
  }
}

// A test stage (tests only): one int32 output, the field's length, after `before` ran on the
// sample. Registered as `type` with no parameters.
using SampleHook = void (*)(const SampleContext& ctx);
class HookStage : public Stage {
 public:
  explicit HookStage(SampleHook before) : before_(before) {}
  std::vector<TensorSpec> OutputSpecs() const override { return {{"v", DType::kInt32, {}}}; }
  std::unique_ptr<StageWorker> NewWorker() const override {
    struct Worker : StageWorker {
      explicit Worker(SampleHook before) : before(before) {}
      Status Process(const SampleContext& ctx, const FieldValue& in,
                     const OutputRow& out) override {
        before(ctx);
        *out.As<int32_t>(0) = static_cast<int32_t>(in.data.size());
        return Status::Ok();
      }
      SampleHook before;
    };
    return std::make_unique<Worker>(before_);
  }

 private:
  SampleHook before_;
};

bool RegisterHookStage(const char* type, const char* doc, SampleHook before) {
  return Registry::Get().Add(
      StageSchema{type,
                  doc,
                  StageKind::kField,
                  /*field_is_path=*/false,
                  {},
                  [before](const StageArgs&) -> Result<std::unique_ptr<Stage>> {
                    return std::unique_ptr<Stage>(std::make_unique<HookStage>(before));
                  }});
}

// Its library throws on every sample whose id ends in 3.
const bool kThrowsRegistered = RegisterHookStage(
    "test_throws", "throws on ids ending in 3 (tests only)", [](const SampleContext& ctx) {
      if (ctx.id.back() == '3') throw std::runtime_error("cv::Exception: the library failed");
    });

TEST(PipelineTest, AThrowingWorkerSkipsThatSampleInsteadOfTerminating) {
  TempDir dir;
  MakeTextDataset(dir, 100, [](int) { return false; });
  const std::string cfg =
      "source: {type: manifest, path: manifest.jsonl, seed: 3}\n"
      "consumers: 2\n"
      "stages:\n"
      "  - {name: text, type: test_throws, field: text, workers: 2}\n"
      "  - {name: batch, type: batch, inputs: [text], params: {batch_size: 5}}\n";
  PipelineRun run = RunPipeline(dir, cfg);
  ASSERT_TRUE(run.pipeline) << run.create_status.message();
  EXPECT_TRUE(run.pipeline->status().ok());
  nlohmann::json errors = run.pipeline->errors().ToJson();
  EXPECT_EQ(errors["total"], 10);
  EXPECT_NE(
      errors["recent"][0]["message"].get<std::string>().find("test_throws threw: cv::Exception"),
      std::string::npos);
  for (auto& s : run.sinks) {
    EXPECT_EQ(s->batches.size(), 10u);
    for (auto& b : s->batches)
      for (auto& id : b->ids) EXPECT_NE(id.back(), '3');
  }
}

// It "hangs" on ids ending in 7: loops until the sample's deadline passes (as FFmpeg's loops
// do), or for 20 s if none is set.
const bool kHangsRegistered = RegisterHookStage(
    "test_hangs", "hangs on ids ending in 7 (tests only)", [](const SampleContext& ctx) {
      auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (ctx.id.back() == '7' && !SampleDeadlinePassed() &&
             std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });

TEST(PipelineTest, ASampleOverItsTimeLimitIsGivenUpAndTheWorkerGoesOn) {
  TempDir dir;
  MakeTextDataset(dir, 100, [](int) { return false; });
  const std::string cfg =
      "source: {type: manifest, path: manifest.jsonl, seed: 3}\n"
      "consumers: 2\n"
      "sample_timeout_s: 0.05\n"
      "stages:\n"
      "  - {name: text, type: test_hangs, field: text, workers: 1}\n"
      "  - {name: batch, type: batch, inputs: [text], params: {batch_size: 5}}\n";
  auto t0 = std::chrono::steady_clock::now();
  PipelineRun run = RunPipeline(dir, cfg);
  ASSERT_TRUE(run.pipeline) << run.create_status.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15))
      << "one worker went through 10 hanging samples";
  EXPECT_TRUE(run.pipeline->status().ok());
  nlohmann::json errors = run.pipeline->errors().ToJson();
  EXPECT_EQ(errors["total"], 10);
  EXPECT_EQ(errors["by_reason"]["timeout"], 10) << errors.dump();
  std::string message = errors["recent"][0]["message"].get<std::string>();
  EXPECT_NE(message.find("took longer than sample_timeout_s 0.05s"), std::string::npos) << message;
  EXPECT_NE(errors["recent"][0]["origin"].get<std::string>().find("manifest.jsonl:"),
            std::string::npos)
      << errors.dump();
  for (auto& s : run.sinks) {
    EXPECT_EQ(s->batches.size(), 10u);
    for (auto& b : s->batches)
      for (auto& id : b->ids) EXPECT_NE(id.back(), '7');
  }
}

// Sample paths come from a dataset that may be hostile: FIFOs, devices, folders, huge files
// and paths outside the dataset are per-sample errors naming the path, and nothing blocks.
TEST(PipelineTest, SampleFilesMustBeRegularSmallAndInsideTheDataRoots) {
  TempDir dir, elsewhere;
  std::filesystem::create_directories(dir / "data");
  std::ofstream m(dir / "data/manifest.jsonl");
  for (int i = 0; i < 8; ++i)
    m << "{\"id\": \"s" << i << "\", \"text\": \"caption " << i << "\"}\n";
  ASSERT_EQ(mkfifo((dir / "data/fifo").c_str(), 0600), 0);
  std::filesystem::create_directories(dir / "data/folder");
  WriteFile(dir / "data/big.txt", std::string(5000, 'x'));
  WriteFile(dir / "outside.txt", "secret");
  WriteFile(elsewhere / "ok.txt", "allowed elsewhere");
  std::filesystem::create_symlink("/etc/hostname", dir / "data/link");
  std::filesystem::create_symlink(elsewhere / "ok.txt", dir / "data/elsewhere");
  auto entry = [&](const std::string& id, const std::string& path) {
    m << "{\"id\": \"" << id << "\", \"text\": {\"path\": \"" << path << "\"}}\n";
  };
  entry("fifo", "fifo");
  entry("folder", "folder");
  entry("device", "/dev/zero");
  entry("big", "big.txt");
  entry("dotdot", "../outside.txt");
  entry("absolute", "/etc/hostname");
  entry("symlink", "link");
  entry("elsewhere", "elsewhere");
  m.close();
  auto config = [&](const std::string& top) {
    std::string c = TextConfig(1, 4, ", max_bytes: 4096", top);
    return c.replace(c.find("path: manifest.jsonl"), 20, "path: data/manifest.jsonl");
  };
  PipelineRun run = RunPipeline(dir, config(""));
  ASSERT_TRUE(run.pipeline) << run.create_status.message();
  nlohmann::json errors = run.pipeline->errors().ToJson();
  std::map<std::string, std::string> why;
  for (auto& e : errors["recent"]) why[e["origin"]] = e["message"];
  auto message = [&](int line) {
    for (auto& [origin, msg] : why)
      if (origin.size() > 3 && origin.substr(origin.rfind(':') + 1) == std::to_string(line))
        return msg;
    return std::string("<none>");
  };
  EXPECT_NE(message(9).find("fifo: is a FIFO, not a regular file"), std::string::npos)
      << message(9);
  EXPECT_NE(message(10).find("folder: is a directory, not a regular file"), std::string::npos)
      << message(10);
  EXPECT_NE(message(11).find("/dev/zero: is a device, not a regular file"), std::string::npos)
      << message(11);
  EXPECT_NE(message(12).find("big.txt: 5000 bytes, more than max_bytes 4096"), std::string::npos)
      << message(12);
  EXPECT_NE(message(13).find("outside.txt: outside the data roots"), std::string::npos)
      << message(13);
  EXPECT_NE(message(14).find("/etc/hostname: outside the data roots"), std::string::npos)
      << message(14);
  EXPECT_NE(message(15).find("link: outside the data roots (it is /etc/hostname)"),
            std::string::npos)
      << message(15);
  EXPECT_NE(message(16).find("outside the data roots"), std::string::npos) << message(16);
  EXPECT_EQ(run.pipeline->errors().ToJson()["total"], 8);
  // Listing another folder admits it; `any` admits everything readable and regular.
  PipelineRun listed = RunPipeline(dir, config("data_roots: [" + elsewhere.path() + "]\n"));
  ASSERT_TRUE(listed.pipeline) << listed.create_status.message();
  EXPECT_EQ(listed.pipeline->errors().ToJson()["total"], 7);
  PipelineRun any = RunPipeline(dir, config("data_roots: any\n"));
  ASSERT_TRUE(any.pipeline);
  EXPECT_EQ(any.pipeline->errors().ToJson()["total"], 4) << "fifo, folder, device, big";
}

// Quiesce leaves the sinks open; a second pipeline started at each rank's next batch carries
// on exactly where the first stopped.
TEST(PipelineTest, QuiescedPipelineHandsItsSinksToTheNextOne) {
  TempDir dir;
  MakeTextDataset(dir, 600, [](int i) { return i % 11 == 4; });
  PipelineRun full = RunPipeline(dir, TextConfig(2, 8, ", shuffle: true, epochs: 2"));
  ASSERT_TRUE(full.pipeline);
  WriteFile(dir / "p.yaml", TextConfig(2, 8, ", shuffle: true, epochs: 2"));
  Result<PipelineConfig> cfg = LoadConfigFile(dir / "p.yaml");
  ASSERT_TRUE(cfg.ok());
  MemorySink r0(BatchSpecs(*cfg), 8, 2), r1(BatchSpecs(*cfg), 8, 2);
  r0.Hold(true);  // keeps the first pipeline from running to the end
  auto first = Pipeline::Create(*cfg, {&r0, &r1});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->Start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  (*first)->Quiesce();
  r0.Hold(false);
  (*first)->Wait();
  EXPECT_FALSE(r0.finished || r1.finished) << "quiesce leaves the sinks open";
  std::vector<StreamCursor> next = {(*first)->stream().CursorAt((*first)->NextCommit(0)),
                                    (*first)->stream().CursorAt((*first)->NextCommit(1))};
  EXPECT_LT(next[0].seq, 74u);
  auto second = Pipeline::Create(*cfg, {&r0, &r1}, next);
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE((*second)->Start().ok());
  (*second)->Wait();
  EXPECT_TRUE(r0.finished && r1.finished);
  for (int r = 0; r < 2; ++r) {
    MemorySink& got = r == 0 ? r0 : r1;
    ASSERT_EQ(got.batches.size(), full.sinks[r]->batches.size()) << "rank " << r;
    for (size_t i = 0; i < got.batches.size(); ++i) {
      EXPECT_EQ(got.batches[i]->seq, i);
      EXPECT_EQ(got.batches[i]->ids, full.sinks[r]->batches[i]->ids)
          << "rank " << r << " batch " << i;
    }
  }
}

// QuiesceAtEpochEnd deals every rank to the end of its epoch: a pipeline with another seed
// that takes over there delivers the first run's epoch 0 and the second seed's epoch 1.
TEST(PipelineTest, QuiescingAtTheEpochEndHandsOverAtTheBoundary) {
  TempDir dir;
  MakeTextDataset(dir, 300, [](int i) { return i % 13 == 5; });
  const std::string a = ", shuffle: true, seed: 1, epochs: 2",
                    b = ", shuffle: true, seed: 2, epochs: 2";
  PipelineRun run_a = RunPipeline(dir, TextConfig(2, 8, a));
  PipelineRun run_b = RunPipeline(dir, TextConfig(2, 8, b));
  ASSERT_TRUE(run_a.pipeline && run_b.pipeline);
  const uint64_t per_epoch = run_a.pipeline->stream().batches_per_epoch();
  WriteFile(dir / "a.yaml", TextConfig(2, 8, a));
  WriteFile(dir / "b.yaml", TextConfig(2, 8, b));
  Result<PipelineConfig> cfg_a = LoadConfigFile(dir / "a.yaml"),
                         cfg_b = LoadConfigFile(dir / "b.yaml");
  ASSERT_TRUE(cfg_a.ok() && cfg_b.ok());
  MemorySink r0(BatchSpecs(*cfg_a), 8, 2), r1(BatchSpecs(*cfg_a), 8, 2);
  r0.Hold(true);
  auto first = Pipeline::Create(*cfg_a, {&r0, &r1});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->Start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  (*first)->QuiesceAtEpochEnd();
  r0.Hold(false);
  (*first)->Wait();
  EXPECT_FALSE(r0.finished || r1.finished);
  for (uint32_t r = 0; r < 2; ++r) EXPECT_EQ((*first)->NextCommit(r), per_epoch) << "rank " << r;
  auto second = Pipeline::Create(
      *cfg_b, {&r0, &r1},
      {(*first)->stream().CursorAt(per_epoch), (*first)->stream().CursorAt(per_epoch)});
  ASSERT_TRUE(second.ok());
  EXPECT_NE((*first)->stream().order_fingerprint(), (*second)->stream().order_fingerprint());
  ASSERT_TRUE((*second)->Start().ok());
  (*second)->Wait();
  EXPECT_TRUE(r0.finished && r1.finished);
  for (int r = 0; r < 2; ++r) {
    MemorySink& got = r == 0 ? r0 : r1;
    ASSERT_EQ(got.batches.size(), 2 * per_epoch) << "rank " << r;
    for (size_t i = 0; i < got.batches.size(); ++i) {
      const PipelineRun& want = i < per_epoch ? run_a : run_b;
      EXPECT_EQ(got.batches[i]->seq, i);
      EXPECT_EQ(got.batches[i]->ids, want.sinks[r]->batches[i]->ids)
          << "rank " << r << " batch " << i;
    }
  }
}

// QuiesceAtEpochEnd(true) takes every rank to one boundary, the one after the furthest rank;
// a pipeline with another batch size numbers its batches from there (SetOrigin) and delivers
// what a run of its own config delivers from that epoch on.
TEST(PipelineTest, ABatchSizeChangeHandsOverAtOneEpochForEveryRank) {
  TempDir dir;
  MakeTextDataset(dir, 300, [](int i) { return i % 13 == 5; });
  const std::string source = ", shuffle: true, epochs: 4";
  PipelineRun run_a = RunPipeline(dir, TextConfig(2, 8, source));
  PipelineRun run_b = RunPipeline(dir, TextConfig(2, 16, source));
  ASSERT_TRUE(run_a.pipeline && run_b.pipeline);
  const uint64_t per_a = run_a.pipeline->stream().batches_per_epoch(),
                 per_b = run_b.pipeline->stream().batches_per_epoch();
  ASSERT_NE(per_a, per_b);
  WriteFile(dir / "a.yaml", TextConfig(2, 8, source));
  WriteFile(dir / "b.yaml", TextConfig(2, 16, source));
  Result<PipelineConfig> cfg_a = LoadConfigFile(dir / "a.yaml"),
                         cfg_b = LoadConfigFile(dir / "b.yaml");
  ASSERT_TRUE(cfg_a.ok() && cfg_b.ok());
  MemorySink r0(BatchSpecs(*cfg_a), 16), r1(BatchSpecs(*cfg_a), 16);
  // Rank 0 in epoch 0, rank 1 in epoch 1: both stop at the start of epoch 2.
  auto first = Pipeline::Create(
      *cfg_a, {&r0, &r1},
      {run_a.pipeline->stream().CursorAt(3), run_a.pipeline->stream().CursorAt(per_a + 5)});
  ASSERT_TRUE(first.ok());
  (*first)->QuiesceAtEpochEnd(/*together=*/true);
  ASSERT_TRUE((*first)->Start().ok());
  (*first)->Wait();
  for (uint32_t r = 0; r < 2; ++r) EXPECT_EQ((*first)->NextCommit(r), 2 * per_a) << "rank " << r;

  auto second = Pipeline::Create(*cfg_b, {&r0, &r1});
  ASSERT_TRUE(second.ok());
  // The batches name their stream (StreamCursor::stream): each order its own tag, and the
  // reload's a chain of the tag before it, so a fresh run of config b is another stream.
  const Pipeline::Origin o = (*first)->stream().origin();
  EXPECT_EQ(o.stream, StreamPlan::FirstStreamTag((*first)->stream().order_fingerprint()));
  EXPECT_NE(o.stream, StreamPlan::FirstStreamTag((*second)->stream().order_fingerprint()));
  const uint32_t next =
      StreamPlan::NextStreamTag(o, 2 * per_a, (*second)->stream().order_fingerprint());
  EXPECT_NE(next, StreamPlan::FirstStreamTag((*second)->stream().order_fingerprint()));
  EXPECT_NE(next, 0u);
  ASSERT_TRUE((*second)->SetOrigin({2, 2 * per_a, next, o.stream}).ok());
  EXPECT_EQ((*second)->stream().StreamBefore(2 * per_a),
            o.stream);  // batch 2 per_a - 1: config a's
  EXPECT_EQ((*second)->stream().StreamBefore(2 * per_a + 1), next);
  EXPECT_EQ((*second)->stream().StreamBefore(0), 0u);
  EXPECT_EQ((*second)->stream().CursorAt(2 * per_a + per_b + 1),
            (StreamCursor{3, 1, 2 * per_a + per_b + 1}));
  EXPECT_FALSE((*second)->SetStart({StreamCursor{1, 0, per_a}, StreamCursor{1, 0, per_a}}).ok());
  Status before = (*second)->Rewind(0, 2 * per_a - 1);
  EXPECT_NE(before.message().find("before batch " + std::to_string(2 * per_a)), std::string::npos)
      << before.message();
  ASSERT_TRUE((*second)->Start().ok());
  (*second)->Wait();
  EXPECT_TRUE(r0.finished && r1.finished);
  for (int r = 0; r < 2; ++r) {
    MemorySink& got = r == 0 ? r0 : r1;
    const uint64_t first_seq = r == 0 ? 3 : per_a + 5, switch_at = 2 * per_a - first_seq;
    ASSERT_EQ(got.batches.size(), switch_at + 2 * per_b) << "rank " << r;
    for (size_t i = 0; i < got.batches.size(); ++i) {
      const bool old = i < switch_at;
      const MemBatch& want = old ? *run_a.sinks[r]->batches[first_seq + i]
                                 : *run_b.sinks[r]->batches[2 * per_b + i - switch_at];
      EXPECT_EQ(got.batches[i]->seq, first_seq + i) << "rank " << r;
      EXPECT_EQ(got.batches[i]->epoch, want.epoch) << "rank " << r << " batch " << i;
      EXPECT_EQ(got.batches[i]->ids, want.ids) << "rank " << r << " batch " << i;
    }
  }
}

TEST(PipelineTest, NoUsableSampleStopsWithAClearError) {
  TempDir dir;
  MakeTextDataset(dir, 64, [](int) { return true; });
  PipelineRun run = RunPipeline(dir, TextConfig(1, 4));
  ASSERT_TRUE(run.pipeline);
  Status st = run.pipeline->status();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no usable sample"), std::string::npos) << st.message();
  for (auto& s : run.sinks) {
    EXPECT_TRUE(s->finished);
    EXPECT_TRUE(s->batches.empty());
  }
}

// A rank's batches are a pure function of the data and the config: starting a rank at any
// cursor regenerates exactly the batches an uninterrupted run delivers from there, failures
// and refills included, whatever the other ranks do.
TEST(PipelineTest, StartingAtACursorRegeneratesTheSameBatches) {
  TempDir dir;
  MakeTextDataset(dir, 400, [](int i) { return i % 7 == 3 || (i >= 100 && i < 160); });
  PipelineRun full = RunPipeline(dir, TextConfig(3, 8, ", shuffle: true, epochs: 3"));
  ASSERT_TRUE(full.pipeline);
  ASSERT_EQ(full.pipeline->stream().batches_per_epoch(), 25u);
  StreamCursor c = full.pipeline->stream().CursorAfter(36);  // epoch 1, batch 12
  EXPECT_EQ(c.epoch, 1u);
  EXPECT_EQ(c.batch, 12u);
  EXPECT_EQ(c.seq, 37u);

  WriteFile(dir / "p.yaml", TextConfig(1, 8, ", shuffle: true, epochs: 3"));
  Result<PipelineConfig> cfg = LoadConfigFile(dir / "p.yaml");
  ASSERT_TRUE(cfg.ok());
  MemorySink r0(BatchSpecs(*cfg), 8, 2), r1(BatchSpecs(*cfg), 8, 2);
  StreamCursor last_epoch{2, 0, 50};
  auto p = Pipeline::Create(*cfg, {&r0, &r1}, {c, last_epoch});
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_TRUE((*p)->Start().ok());
  (*p)->Wait();
  auto same = [](const MemBatch& a, const MemBatch& b) {
    if (a.seq != b.seq || a.epoch != b.epoch || a.ids != b.ids ||
        a.tensors.size() != b.tensors.size())
      return false;
    for (size_t k = 0; k < a.tensors.size(); ++k)
      if (a.tensors[k].data != b.tensors[k].data) return false;
    return true;
  };
  ASSERT_EQ(r0.batches.size(), 75u - 37u);
  for (size_t i = 0; i < r0.batches.size(); ++i)
    EXPECT_TRUE(same(*r0.batches[i], *full.sinks[0]->batches[37 + i])) << "rank 0 batch " << 37 + i;
  ASSERT_EQ(r1.batches.size(), 25u);
  for (size_t i = 0; i < r1.batches.size(); ++i)
    EXPECT_TRUE(same(*r1.batches[i], *full.sinks[1]->batches[50 + i])) << "rank 1 batch " << 50 + i;

  auto bad = Pipeline::Create(*cfg, {&r0, &r1}, {StreamCursor{0, 25, 25}, StreamCursor{}});
  EXPECT_FALSE(bad.ok());
}

// A mixture resumed at 100 random cursors (issue #30): each resumed stream, refills of failed
// samples included, is the uninterrupted one from that cursor on, byte for byte.
TEST(PipelineTest, AMixtureResumedAtAnyCursorIsTheUninterruptedStream) {
  TempDir dir;
  {
    std::ofstream a(dir / "a.jsonl"), b(dir / "b.jsonl");
    for (int i = 0; i < 70; ++i)
      a << "{\"id\": \"a" << i << "\", \"text\": \"caption " << i << "\"}\n";
    for (int i = 0; i < 30; ++i)  // every sixth question names a missing file: refilled
      b << "{\"id\": \"b" << i << "\", \"question\": "
        << (i % 6 == 1 ? "{\"path\": \"gone.txt\"}" : "\"question " + std::to_string(i) + "\"")
        << "}\n";
  }
  const std::string yaml =
      "sources:\n"
      "  - {name: a, type: manifest, path: a.jsonl, weight: 2}\n"
      "  - {name: b, type: manifest, path: b.jsonl, weight: 1, fields: {text: question}}\n"
      "mix: {seed: 11, epochs: 3, samples_per_epoch: 120}\n"
      "consumers: 2\n"
      "stages:\n"
      "  - {name: text, type: text, field: text, workers: 2, params: {max_len: 16}}\n"
      "  - {name: batch, type: batch, inputs: [text], params: {batch_size: 4}}\n";
  PipelineRun full = RunPipeline(dir, yaml);
  ASSERT_TRUE(full.pipeline);
  const uint64_t total = 3 * full.pipeline->stream().batches_per_epoch();
  ASSERT_EQ(full.sinks[0]->batches.size(), total);
  ASSERT_EQ(full.sinks[1]->batches.size(), total);
  Result<PipelineConfig> cfg = LoadConfigFile(dir / "p.yaml");
  ASSERT_TRUE(cfg.ok());
  Rng rng(5, 0, "", "cursors");
  for (int trial = 0; trial < 100; ++trial) {
    const uint64_t s0 = rng.Below(total), s1 = rng.Below(total);
    MemorySink r0(BatchSpecs(*cfg), 4), r1(BatchSpecs(*cfg), 4);
    auto p = Pipeline::Create(
        *cfg, {&r0, &r1},
        {full.pipeline->stream().CursorAt(s0), full.pipeline->stream().CursorAt(s1)});
    ASSERT_TRUE(p.ok()) << p.status().message();
    ASSERT_TRUE((*p)->Start().ok());
    (*p)->Wait();
    const MemorySink* resumed[] = {&r0, &r1};
    const uint64_t from[] = {s0, s1};
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(resumed[r]->batches.size(), total - from[r]) << "trial " << trial;
      for (size_t i = 0; i < resumed[r]->batches.size(); ++i) {
        const MemBatch &got = *resumed[r]->batches[i], &want = *full.sinks[r]->batches[from[r] + i];
        ASSERT_EQ(got.seq, want.seq);
        ASSERT_EQ(got.ids, want.ids) << "trial " << trial << ", rank " << r << ", seq " << got.seq;
        ASSERT_EQ(got.tensors.size(), want.tensors.size());
        for (size_t k = 0; k < got.tensors.size(); ++k)
          ASSERT_EQ(got.tensors[k].data, want.tensors[k].data) << "tensor " << k;
      }
    }
  }
}

// Token-budget batches over texts of 1 to 60 bytes (the bytes tokenizer: a token a byte), in
// files t<i>.txt; sample i's file is missing when i % 50 == 7.
int BudgetTextLength(int i) { return 1 + static_cast<int>(HashString(std::to_string(i)) % 60); }
void MakeBudgetTextDataset(const TempDir& dir, int n) {
  std::ofstream m(dir / "manifest.jsonl");
  for (int i = 0; i < n; ++i) {
    m << "{\"id\": \"s" << i << "\", \"text\": {\"path\": \"t" << i << ".txt\"}}\n";
    if (i % 50 != 7)
      WriteFile(dir / fmt::format("t{}.txt", i), std::string(BudgetTextLength(i), 'a' + i % 26));
  }
}
std::string BudgetTextConfig(int workers, const std::string& budget = "max_tokens: 200",
                             const std::string& source = "") {
  std::string yaml = TextConfig(workers, 16, ", shuffle: true, epochs: 2" + source);
  for (auto [from, to] : {std::pair<std::string, std::string>{"max_len: 16", "max_len: 64"},
                          {"batch_size: 16", "batch_size: 16, " + budget}}) {
    EXPECT_NE(yaml.find(from), std::string::npos) << from;
    yaml.replace(yaml.find(from), from.size(), to);
  }
  return yaml;
}

// Checks a budgeted text run: every rank has the epoch's batch count, each batch is within
// the budget, each row is its sample's text. Returns the ids delivered per epoch.
std::vector<std::multiset<std::string>> CheckBudgetedText(const PipelineRun& run, int epochs) {
  std::vector<std::multiset<std::string>> ids(epochs);
  for (const auto& sink : run.sinks) {
    uint64_t seq = 0;
    for (int e = 0; e < epochs; ++e) {
      const uint64_t k = run.pipeline->stream().EpochBatches(e);
      EXPECT_GT(k, 0u);
      for (uint64_t b = 0; b < k; ++b, ++seq) {
        if (seq >= sink->batches.size()) {
          ADD_FAILURE() << "only " << sink->batches.size() << " batches";
          return ids;
        }
        const MemBatch& batch = *sink->batches[seq];
        EXPECT_EQ(batch.seq, seq);
        EXPECT_EQ(batch.epoch, static_cast<uint32_t>(e));
        EXPECT_EQ(run.pipeline->stream().CursorAt(seq),
                  (StreamCursor{static_cast<uint32_t>(e), b, seq}));
        EXPECT_LE(batch.ids.size(), 16u);
        int64_t tokens = 0;
        for (size_t r = 0; r < batch.ids.size(); ++r) {
          const int i = std::stoi(batch.ids[r].substr(1));
          const std::string text = RowText(batch, r, 64);
          EXPECT_EQ(text, std::string(BudgetTextLength(i), 'a' + i % 26))
              << "row " << r << " holds another sample";
          tokens += BudgetTextLength(i);
          ids[e].insert(batch.ids[r]);
        }
        EXPECT_LE(tokens, 200) << "epoch " << e << " batch " << b;
      }
    }
    EXPECT_EQ(sink->batches.size(), seq) << "no batch past the last epoch";
  }
  return ids;
}

TEST(PipelineTest, TokenBudgetBatchesHoldWholeSamplesWithEqualCountsPerRank) {
  TempDir dir;
  const int n = 600;
  MakeBudgetTextDataset(dir, n);
  PipelineRun run = RunPipeline(dir, BudgetTextConfig(2));
  ASSERT_TRUE(run.pipeline) << run.create_status.message();
  ASSERT_TRUE(run.pipeline->status().ok()) << run.pipeline->status().message();
  std::vector<std::multiset<std::string>> ids = CheckBudgetedText(run, 2);
  std::multiset<std::string> good;
  for (int i = 0; i < n; ++i)
    if (i % 50 != 7) good.insert(fmt::format("s{}", i));
  for (int e = 0; e < 2; ++e) EXPECT_EQ(ids[e], good) << "every usable sample once an epoch";
  EXPECT_NE(Fingerprint(run), "");
  // The missing files were found when measuring, once; never dealt.
  nlohmann::json samples = run.pipeline->Profile()["samples"];
  EXPECT_EQ(samples["failed"].get<size_t>(), 12u) << samples.dump();
  EXPECT_EQ(samples["refilled"].get<size_t>(), 0u) << samples.dump();
  const nlohmann::json errors = run.pipeline->errors().ToJson();
  EXPECT_EQ(errors["total"], 12) << errors.dump();
  EXPECT_NE(errors["recent"][0]["origin"].get<std::string>().find("manifest.jsonl:"),
            std::string::npos)
      << errors.dump();
  // Full batches: the greedy cut wastes little of the budget.
  double tokens = 0;
  for (int i = 0; i < n; ++i) tokens += i % 50 != 7 ? BudgetTextLength(i) : 0;
  const double full = tokens / 2 / 200;  // per rank and epoch, were every batch exactly full
  for (int e = 0; e < 2; ++e)
    EXPECT_LT(run.pipeline->stream().EpochBatches(e), 1.2 * full + 1) << full;

  // Same bytes whatever the worker count, and from any cursor.
  EXPECT_EQ(Fingerprint(RunPipeline(dir, BudgetTextConfig(1))), Fingerprint(run));
  WriteFile(dir / "p.yaml", BudgetTextConfig(2));
  Result<PipelineConfig> cfg = LoadConfigFile(dir / "p.yaml");
  ASSERT_TRUE(cfg.ok());
  MemorySink r0(BatchSpecs(*cfg), 16, 2), r1(BatchSpecs(*cfg), 16, 2);
  const uint64_t from = run.pipeline->stream().EpochBatches(0) + 3;  // epoch 1, batch 3
  auto p =
      Pipeline::Create(*cfg, {&r0, &r1},
                       {run.pipeline->stream().CursorAt(from), run.pipeline->stream().CursorAt(5)});
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_TRUE((*p)->Start().ok());
  (*p)->Wait();
  ASSERT_EQ(r0.batches.size(), run.sinks[0]->batches.size() - from);
  for (size_t i = 0; i < r0.batches.size(); ++i)
    EXPECT_EQ(r0.batches[i]->ids, run.sinks[0]->batches[from + i]->ids) << i;
  ASSERT_EQ(r1.batches.size(), run.sinks[1]->batches.size() - 5);
  EXPECT_EQ(r1.batches[0]->ids, run.sinks[1]->batches[5]->ids);
  // A cursor over 1000 epochs ahead is refused (at once: before planning any epoch).
  auto far =
      Pipeline::Create(*cfg, {&r0, &r1}, {StreamCursor{0, 0, uint64_t{1} << 50}, StreamCursor{}});
  ASSERT_FALSE(far.ok());
  EXPECT_NE(far.status().message().find("epochs past epoch 0"), std::string::npos)
      << far.status().message();
  // A cursor that does not fit the plan's numbering is refused.
  auto bad = Pipeline::Create(
      *cfg, {&r0, &r1},
      {StreamCursor{0, run.pipeline->stream().EpochBatches(0), from}, StreamCursor{}});
  EXPECT_FALSE(bad.ok());
}

// Files that vanish, or change, after the samples were measured fail when processed (a
// changed one because its cost is no longer the one its batch was planned with): their rows
// are refilled with samples that fit what the batch has left, or left out of the batch; the
// budget and the batch counts hold, and the bytes do not depend on the worker count.
TEST(PipelineTest, TokenBudgetRefillsStayWithinTheBudget) {
  TempDir dir;
  const int n = 600;
  MakeBudgetTextDataset(dir, n);
  auto run = [&](int workers) {
    PipelineRun run;
    WriteFile(dir / "p.yaml", BudgetTextConfig(workers));
    Result<PipelineConfig> cfg = LoadConfigFile(dir / "p.yaml");
    EXPECT_TRUE(cfg.ok());
    std::vector<BatchSink*> sinks;
    for (int r = 0; r < 2; ++r) {
      run.sinks.push_back(std::make_unique<MemorySink>(BatchSpecs(*cfg), 16));
      sinks.push_back(run.sinks.back().get());
    }
    auto text = [&](int i, int length) {
      WriteFile(dir / fmt::format("t{}.txt", i), std::string(length, 'a' + i % 26));
    };
    for (int i = 0; i < n; i += 40) {  // as they were, for this run's measuring
      text(i + 11, BudgetTextLength(i + 11));
      text(i + 31, BudgetTextLength(i + 31));
    }
    auto p = Pipeline::Create(*cfg, sinks);
    EXPECT_TRUE(p.ok()) << p.status().message();
    for (int i = 0; i < n; i += 40) {
      std::filesystem::remove(dir / fmt::format("t{}.txt", i + 11));
      text(i + 31, BudgetTextLength(i + 31) % 60 + 1);
    }
    run.pipeline = std::move(p.value());
    EXPECT_TRUE(run.pipeline->Start().ok());
    run.pipeline->Wait();
    return run;
  };
  PipelineRun two = run(2);
  ASSERT_TRUE(two.pipeline->status().ok()) << two.pipeline->status().message();
  std::vector<std::multiset<std::string>> ids = CheckBudgetedText(two, 2);
  for (int e = 0; e < 2; ++e)
    for (int i = 11; i < n; i += 20) EXPECT_EQ(ids[e].count(fmt::format("s{}", i)), 0u) << i;
  nlohmann::json samples = two.pipeline->Profile()["samples"];
  EXPECT_EQ(samples["failed"].get<size_t>(), 12u + 2 * 15 + 2 * 15) << samples.dump();
  const std::string errors = two.pipeline->errors().ToJson().dump();
  EXPECT_NE(errors.find("changed since it was measured at start"), std::string::npos) << errors;
  EXPECT_GT(samples["refilled"].get<size_t>(), 0u) << samples.dump();
  EXPECT_EQ(Fingerprint(run(1)), Fingerprint(two));
}

// Patches and tokens: Qwen vision + chat, within max_patches and max_tokens; undecodable
// images are found by their headers when measuring, a truncated one only when decoded.
TEST(PipelineTest, PatchAndTokenBudgetsBatchQwenSamples) {
  TempDir dir;
  MakeBadDataset(dir);
  std::string yaml = QwenConfig(2);
  const std::string from = "batch_size: 5}";
  yaml.replace(yaml.find(from), from.size(), "batch_size: 5, max_patches: 600, max_tokens: 400}");
  PipelineRun run = RunPipeline(dir, yaml);
  ASSERT_TRUE(run.pipeline) << run.create_status.message();
  ASSERT_TRUE(run.pipeline->status().ok()) << run.pipeline->status().message();
  const uint64_t k = run.pipeline->stream().EpochBatches(0);
  ASSERT_EQ(run.sinks[0]->batches.size(), k);
  std::multiset<std::string> seen;
  for (auto& b : run.sinks[0]->batches) {
    // chat, chat_lengths, labels, pixel_values, image_grid_thw, image_grid_thw_count
    const auto& t = b->tensors;
    EXPECT_LE(t[3].spec.shape[0], 600) << "patches";
    const int32_t* lengths = reinterpret_cast<const int32_t*>(t[1].data.data());
    const int32_t* grids = reinterpret_cast<const int32_t*>(t[4].data.data());
    int64_t tokens = 0, patches = 0;
    for (size_t r = 0; r < b->ids.size(); ++r) {
      tokens += lengths[r];
      patches += int64_t{grids[3 * r]} * grids[3 * r + 1] * grids[3 * r + 2];
      seen.insert(b->ids[r]);
    }
    EXPECT_LE(tokens, 400);
    EXPECT_EQ(t[3].spec.shape[0], patches);
    EXPECT_GE(b->ids.size(), 1u);
  }
  EXPECT_GT(seen.size(), 5u);
  for (const std::string& id : seen)  // bad_text's Latin-1 is replaced, as the reference does
    EXPECT_TRUE(id.rfind("bad", 0) == std::string::npos || id == "bad_text") << id;
  // The truncated JPEG's header is whole: it fails only when decoded, and its row is refilled.
  nlohmann::json samples = run.pipeline->Profile()["samples"];
  EXPECT_EQ(samples["failed"].get<size_t>(), 5u) << samples.dump();
  EXPECT_EQ(samples["refilled"].get<size_t>(), 1u) << samples.dump();
  EXPECT_EQ(Fingerprint(RunPipeline(dir,
                                    [&] {
                                      std::string y = yaml;
                                      y.replace(y.find("workers: 2"), 10, "workers: 1");
                                      return y;
                                    }())),
            Fingerprint(run));
}

// Only the stages a budget counts are measured: an image stage beside a budgeted text stage
// is neither asked nor opened at start.
TEST(PipelineTest, AStageTheBudgetDoesNotCountIsNotMeasured) {
  TempDir dir;
  testing::MakeImageTextDataset(dir.path(), 40);
  std::string yaml = Config(2, 2, 8);
  yaml.replace(yaml.find("batch_size: 8"), 13, "batch_size: 8, max_tokens: 40");
  PipelineRun run = RunPipeline(dir, yaml);
  ASSERT_TRUE(run.pipeline) << run.create_status.message();
  ASSERT_TRUE(run.pipeline->status().ok()) << run.pipeline->status().message();
  EXPECT_EQ(run.pipeline->errors().ToJson()["total"], 0);
  std::multiset<std::string> seen;
  for (const auto& sink : run.sinks) {
    EXPECT_EQ(sink->batches.size(), run.pipeline->stream().EpochBatches(0));
    for (const auto& b : sink->batches) {
      const int32_t* lengths = reinterpret_cast<const int32_t*>(b->tensors[2].data.data());
      EXPECT_LE(std::accumulate(lengths, lengths + b->ids.size(), 0), 40);
      seen.insert(b->ids.begin(), b->ids.end());
    }
  }
  EXPECT_EQ(seen.size(), 40u);
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), 40u) << "each once";
}

// An indexed source keeps its costs in a file beside its index: a later start reads them
// instead of measuring (a text edited in place since is then found changed when processed),
// and measures again when the stages' parameters change or the file is damaged.
TEST(PipelineTest, AnIndexedSourceKeepsItsCostsForTheNextStart) {
  TempDir dir;
  MakeBudgetTextDataset(dir, 200);
  const std::string indexed = BudgetTextConfig(2, "max_tokens: 200", ", index: on");
  const std::string costs = CostIndexPath(dir / "manifest.jsonl", "");
  PipelineRun first = RunPipeline(dir, indexed);
  ASSERT_TRUE(first.pipeline && first.pipeline->status().ok());
  ASSERT_TRUE(std::filesystem::exists(costs));
  EXPECT_EQ(first.pipeline->errors().ToJson()["total"], 4) << "the 4 missing files";

  // Sample 3's text gets longer: measured again, it would be planned as it is now.
  WriteFile(dir / "t3.txt", std::string(BudgetTextLength(3) % 60 + 1, 'a' + 3));
  PipelineRun second = RunPipeline(dir, indexed);
  ASSERT_TRUE(second.pipeline && second.pipeline->status().ok());
  std::string errors = second.pipeline->errors().ToJson().dump();
  EXPECT_NE(errors.find("t7.txt: no such file"), std::string::npos)
      << "kept failures, reported again";
  EXPECT_NE(errors.find("changed since it was measured at start"), std::string::npos) << errors;
  EXPECT_EQ(Fingerprint(RunPipeline(dir, indexed)), Fingerprint(second)) << "the same costs";

  // Another max_len: measured again (so sample 3 is not found changed), and kept.
  PipelineRun other = RunPipeline(dir, AllReplaced(indexed, "max_len: 64", "max_len: 63"));
  ASSERT_TRUE(other.pipeline && other.pipeline->status().ok());
  errors = other.pipeline->errors().ToJson().dump();
  EXPECT_EQ(errors.find("changed since"), std::string::npos) << errors;
  // A damaged file: measured again.
  const std::string bytes = testing::ReadFile(costs);
  WriteFile(costs, bytes.substr(0, bytes.size() - 3));
  PipelineRun damaged = RunPipeline(dir, indexed);
  ASSERT_TRUE(damaged.pipeline && damaged.pipeline->status().ok());
  errors = damaged.pipeline->errors().ToJson().dump();
  EXPECT_EQ(errors.find("changed since"), std::string::npos) << errors;
  EXPECT_EQ(testing::ReadFile(costs).size(), bytes.size()) << "written again";
}

TEST(PipelineTest, ABudgetOnlyCountsWhatItsStagesCanMeasure) {
  TempDir dir;
  MakeBudgetTextDataset(dir, 40);
  // A sample over the budget on its own is left out, with the reason.
  PipelineRun run = RunPipeline(dir, BudgetTextConfig(1, "max_tokens: 30"));
  ASSERT_TRUE(run.pipeline) << run.create_status.message();
  const nlohmann::json errors = run.pipeline->errors().ToJson();
  int over = 0;
  for (int i = 0; i < 40; ++i) over += i % 50 != 7 && BudgetTextLength(i) > 30;
  EXPECT_EQ(errors["total"].get<int>(), over + 1) << errors.dump();
  EXPECT_NE(errors.dump().find("tokens, above the batch's max_tokens 30"), std::string::npos)
      << errors.dump();
}

TEST(PlacementTest, CpuListWritesRunsOfCpus) {
  EXPECT_EQ(CpuList({}), "");
  EXPECT_EQ(CpuList({3}), "3");
  EXPECT_EQ(CpuList({0, 1, 2, 3, 5, 7, 8}), "0-3,5,7-8");
  EXPECT_EQ(CpuList({4, 6, 7}), "4,6-7");
}

}  // namespace
}  // namespace mmfeed
