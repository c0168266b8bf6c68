// mmfeed-video: the video stage outside the daemon, to check what a config samples and to
// benchmark it.
//
//   mmfeed-video [--params '{sampling: clip, frames: 16, size: [224, 224]}'] [--seed N]
//                [--epoch N] [--memory] [--out DIR] FILE...
//   mmfeed-video --bench [--workers N] [--repeat R] [--params ...] FILE...
//
// --params takes the stage's `params:` map as YAML, checked against the same schema.
// Default: one JSON line per file: pts, mask and the decoder's work (decoded frames, seeks),
// or the error; --out also writes DIR/<k>.npy (the frames of the k-th file). --memory reads each
// file into memory first (the path a tar member's bytes take). --bench samples every file
// `repeat` times on `workers` threads and prints one JSON line: clips/s and decoded frames per
// sampled frame.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/npy.h"
#include "engine/config.h"
#include "engine/registry.h"
#include "engine/stage.h"
#include "stages/ffmpeg/av_input.h"
#include "stages/video/video_sampler.h"

namespace {

int Usage() {
  std::fprintf(
      stderr,
      "usage: mmfeed-video [--params YAML] [--seed N] [--epoch N] [--memory] [--out DIR] FILE...\n"
      "       mmfeed-video --bench [--workers N] [--repeat R] [--stage TYPE] [--params YAML] "
      "FILE...\n");
  return 2;
}

mmfeed::FieldValue Field(const std::string& path, bool memory, std::string* storage) {
  mmfeed::FieldValue f;
  f.kind = mmfeed::FieldValue::Kind::kPath;
  f.data = path;
  if (memory) {
    auto bytes = mmfeed::FieldBytes(f, storage);
    if (bytes.ok()) {
      f.kind = mmfeed::FieldValue::Kind::kBytes;
      f.data = *storage;
    }
  }
  return f;
}

// Runs item(w, k) for every k < total on `workers` threads (w: the thread, taking the next k);
// returns the seconds they took.
template <class Item>
double OnThreads(int workers, size_t total, Item item) {
  std::atomic<size_t> next{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      for (size_t k; (k = next++) < total;) item(w, k);
    });
  for (auto& t : threads) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --bench: every file `repeat` times on `workers` threads; one JSON line.
int Bench(const std::vector<std::string>& files, uint64_t seed, bool memory, int workers,
          int repeat, const mmfeed::VideoOptions& o, const mmfeed::TensorSpec& spec,
          mmfeed::KeyframeIndexCache* cache) {
  std::atomic<int64_t> errors{0};
  // Each thread's sampler and buffers. The outputs are made (and their pages touched) before
  // the clock starts, as the daemon's ring slots are reused: a 388 MB clip would otherwise
  // time the kernel zeroing pages.
  struct Worker {
    mmfeed::VideoSampler sampler;
    std::vector<uint8_t> frames, mask;
    std::vector<float> pts;
    std::string storage;
  };
  std::vector<std::unique_ptr<Worker>> work;
  for (int w = 0; w < workers; ++w)
    work.emplace_back(new Worker{mmfeed::VideoSampler(o, cache),
                                 std::vector<uint8_t>(spec.NumBytes(), 0),
                                 std::vector<uint8_t>(o.frames),
                                 std::vector<float>(o.frames),
                                 {}});
  const double secs = OnThreads(workers, files.size() * repeat, [&](int w, size_t k) {
    Worker& t = *work[w];
    const std::string& path = files[k % files.size()];
    mmfeed::Rng rng(seed, k / files.size(), path, "video");
    auto field = Field(path, memory, &t.storage);
    if (!t.sampler.Sample(field, &rng, t.frames.data(), t.pts.data(), t.mask.data()).ok()) ++errors;
  });
  mmfeed::VideoStats sum;
  for (const auto& t : work) sum += t->sampler.stats();
  nlohmann::json j = {{"clips", sum.videos},
                      {"errors", errors.load()},
                      {"seconds", secs},
                      {"clips_per_s", sum.videos / secs},
                      {"decoded", sum.decoded},
                      {"sampled", sum.sampled},
                      {"decoded_per_sampled", sum.DecodedPerSampled()},
                      {"seeks_per_clip", sum.SeeksPerVideo()},
                      {"nonref_skippable", sum.skipped}};
  std::cout << j.dump() << std::endl;
  return errors.load() ? 1 : 0;
}

// --bench --stage TYPE: another stage that samples videos (qwen_video), as the daemon makes
// and runs it: every file `repeat` times on `workers` threads, each its own worker; one JSON
// line with the stage's decoding figures.
int BenchStage(const std::vector<std::string>& files, const mmfeed::StageConfig& spec, bool memory,
               int workers, int repeat) {
  const mmfeed::StageSchema* schema = mmfeed::Registry::Get().Find(spec.type);
  auto made = schema->factory({spec.name, spec.params, ""});
  if (!made.ok()) {
    std::fprintf(stderr, "mmfeed-video: %s\n", made.status().message().c_str());
    return 2;
  }
  const std::unique_ptr<mmfeed::Stage> stage = std::move(made.value());
  std::atomic<int64_t> errors{0};
  const size_t total = files.size() * repeat;
  std::vector<std::unique_ptr<mmfeed::StageWorker>> work;
  std::vector<std::vector<std::vector<uint8_t>>> outputs(workers);
  std::vector<std::vector<uint8_t*>> ptrs(workers);
  std::vector<std::string> storage(workers);
  for (int w = 0; w < workers; ++w) {
    work.push_back(stage->NewWorker());
    for (const mmfeed::TensorSpec& t : stage->OutputSpecs())
      outputs[w].emplace_back(t.NumBytes(), 0);
    for (auto& o : outputs[w]) ptrs[w].push_back(o.data());
  }
  const double secs = OnThreads(workers, total, [&](int w, size_t k) {
    const std::string& path = files[k % files.size()];
    const mmfeed::SampleContext ctx{0, static_cast<uint32_t>(k / files.size()), path, path};
    const mmfeed::Status s = work[w]->Process(ctx, Field(path, memory, &storage[w]),
                                              mmfeed::OutputRow(ptrs[w].data(), ptrs[w].size()));
    if (!s.ok()) {
      std::fprintf(stderr, "mmfeed-video: %s: %s\n", path.c_str(), s.message().c_str());
      ++errors;
    }
  });
  nlohmann::json j = {{"clips", total - errors.load()},
                      {"errors", errors.load()},
                      {"seconds", secs},
                      {"clips_per_s", (total - errors.load()) / secs}};
  for (const auto& [name, value] : stage->Metrics()) j[name] = value;
  std::cout << j.dump() << std::endl;
  return errors.load() ? 1 : 0;
}

// One JSON line per file (and DIR/<k>.npy with --out).
int SampleEach(const std::vector<std::string>& files, uint64_t seed, uint32_t epoch, bool memory,
               const std::string& out_dir, const mmfeed::VideoOptions& o,
               const mmfeed::TensorSpec& spec, mmfeed::KeyframeIndexCache* cache) {
  mmfeed::VideoSampler sampler(o, cache);
  // The output, then a canary: a stage writing past its output (in a ring slot, into the next
  // tensor) fails here.
  constexpr size_t kCanary = 256;
  const size_t bytes = spec.NumBytes();
  std::vector<uint8_t> frames(bytes + kCanary, 0xA5), mask(o.frames);
  std::vector<float> pts(o.frames);
  std::string storage;
  int failed = 0;
  for (size_t k = 0; k < files.size(); ++k) {
    const mmfeed::VideoStats before = sampler.stats();
    mmfeed::Rng rng(seed, epoch, files[k], "video");
    auto field = Field(files[k], memory, &storage);
    mmfeed::Status s = sampler.Sample(field, &rng, frames.data(), pts.data(), mask.data());
    if (std::any_of(frames.begin() + bytes, frames.end(), [](uint8_t b) { return b != 0xA5; })) {
      std::fprintf(stderr, "mmfeed-video: %s: the stage wrote past its output\n", files[k].c_str());
      return 1;
    }
    nlohmann::json j = {{"path", files[k]}, {"ok", s.ok()}};
    if (!s.ok()) {
      j["error"] = s.message();
      ++failed;
    } else {
      j["pts"] = pts;
      j["mask"] = mask;
      const mmfeed::VideoStats work = sampler.stats() - before;
      j["decoded"] = work.decoded;
      j["seeks"] = work.seeks;
      if (!out_dir.empty()) {
        mmfeed::Status w = mmfeed::WriteNpy(out_dir + "/" + std::to_string(k) + ".npy", spec.dtype,
                                            spec.shape, frames.data(), bytes);
        if (!w.ok()) {
          std::fprintf(stderr, "mmfeed-video: %s\n", w.message().c_str());
          return 1;
        }
      }
    }
    std::cout << j.dump() << std::endl;
  }
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string params = "{size: [224, 224]}", out_dir, type = "video";
  uint64_t seed = 0;
  uint32_t epoch = 0;
  bool memory = false, bench = false;
  int workers = 1, repeat = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--params")
      params = value();
    else if (a == "--seed")
      seed = std::stoull(value());
    else if (a == "--epoch")
      epoch = static_cast<uint32_t>(std::stoul(value()));
    else if (a == "--memory")
      memory = true;
    else if (a == "--out")
      out_dir = value();
    else if (a == "--bench")
      bench = true;
    else if (a == "--stage")
      type = value();
    else if (a == "--workers")
      workers = std::max(1, std::stoi(value()));
    else if (a == "--repeat")
      repeat = std::max(1, std::stoi(value()));
    else if (!a.empty() && a[0] == '-')
      return Usage();
    else
      files.push_back(a);
  }
  if (files.empty() || (type != "video" && !bench)) return Usage();
  mmfeed::RouteFfmpegLogs();

  // The params go through the config parser, so they are checked exactly as in a pipeline.
  // (The source is never read; the parser only wants an existing file there.)
  const std::string text =
      "source: {type: manifest, path: " + nlohmann::json(files[0]).dump() +
      "}\nstages:\n"
      "  - {name: video, type: " +
      nlohmann::json(type).dump() + ", field: video, params: " + params +
      "}\n"
      "  - {name: batch, type: batch, inputs: [video], params: {batch_size: 1}}\n";
  auto cfg = mmfeed::ParseConfig(text, "--params");
  if (!cfg.ok()) {
    std::fprintf(stderr, "mmfeed-video: %s\n", cfg.status().message().c_str());
    return 2;
  }
  if (type != "video") return BenchStage(files, cfg->stages[0], memory, workers, repeat);
  auto opts = mmfeed::VideoOptionsFromParams(cfg->stages[0].params);
  if (!opts.ok()) {
    std::fprintf(stderr, "mmfeed-video: %s\n", opts.status().message().c_str());
    return 2;
  }
  const mmfeed::VideoOptions& o = *opts;
  const auto specs = mmfeed::VideoOutputSpecs("video", o);
  mmfeed::KeyframeIndexCache cache(o.index_cache);

  if (bench) return Bench(files, seed, memory, workers, repeat, o, specs[0], &cache);
  return SampleEach(files, seed, epoch, memory, out_dir, o, specs[0], &cache);
}
