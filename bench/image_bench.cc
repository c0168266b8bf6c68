// mmfeed-bench-image: the image stage next to a bare libjpeg-turbo full-size decode (TurboJPEG,
// RGB, accurate DCT), on the same files held in memory, on the same number of threads, in
// alternating trials. It isolates the per-image work (no IO, no pipeline) for profiling; the
// pipeline itself is measured by bench/image_text_bench.py. Prints JSON: images/s of both
// (median of the trials) and their ratio.
//   mmfeed-bench-image [--threads N] [--trials K] [--params "{crop: ..., size: [224, 224]}"]
//   FILE...
#include <fmt/format.h>
#include <turbojpeg.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "base/malloc_tuning.h"
#include "engine/config.h"
#include "engine/stage.h"

namespace mmfeed {
namespace {

// Runs `work(i)` for every file index on `threads` threads; returns images/s.
double Rate(size_t n, int threads, const std::function<std::function<void(size_t)>()>& make) {
  std::atomic<size_t> next{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      std::function<void(size_t)> work = make();  // per thread: a decoder, a stage worker
      for (size_t i; (i = next++) < n;) work(i);
    });
  for (auto& t : pool) t.join();
  return n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Outputs go to kRows rows in turn, as the daemon's go to its ring's slots (8 batches of 32 per
// rank there): written to memory, not to one row that stays in the cache.
constexpr int kRows = 256;

int Main(int argc, char** argv) {
  KeepSampleMemoryOnTheHeap();  // as mmfeedd does, for both sides
  int threads = 2, trials = 5;
  std::string only;  // "stage" or "bare": run one side (for profilers)
  std::string params =
      "{crop: random_resized_crop, size: [224, 224], flip: 0.5, mean: [0.485, 0.456, 0.406], "
      "std: [0.229, 0.224, 0.225], dtype: float32, layout: CHW}";
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc)
      threads = std::stoi(argv[++i]);
    else if (a == "--trials" && i + 1 < argc)
      trials = std::stoi(argv[++i]);
    else if (a == "--params" && i + 1 < argc)
      params = argv[++i];
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
    else
      files.push_back(a);
  }
  if (files.empty()) {
    std::fprintf(stderr,
                 "usage: mmfeed-bench-image [--threads N] [--trials K] [--params YAML] FILE...\n");
    return 2;
  }
  Result<PipelineConfig> cfg = ParseConfig(
      // The source is never read; the config only needs an existing file for it.
      fmt::format("pipeline: bench\nsource: {{type: manifest, path: '{}'}}\nstages:\n"
                  "  - {{name: image, type: image, field: image, params: {}}}\n"
                  "  - {{name: batch, type: batch, inputs: [image], params: {{batch_size: 1}}}}\n",
                  files[0], params),
      "bench.yaml");
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().message().c_str());
    return 2;
  }
  const Stage& stage = *cfg->stages[0].stage;
  std::vector<FieldValue> data;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    FieldValue v;
    v.kind = FieldValue::Kind::kBytes;
    v.data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    data.push_back(std::move(v));
  }
  auto bare = [&] {
    return [&, h = std::shared_ptr<void>(tjInitDecompress(), tjDestroy),
            out = std::make_shared<std::vector<unsigned char>>()](size_t i) {
      const std::string& d = data[i].data;
      auto* src = reinterpret_cast<const unsigned char*>(d.data());
      int w, ht, ss, cs;
      if (tjDecompressHeader3(h.get(), src, d.size(), &w, &ht, &ss, &cs) != 0) return;
      out->resize(static_cast<size_t>(w) * ht * 3);
      tjDecompress2(h.get(), src, d.size(), out->data(), w, 0, ht, TJPF_RGB, TJFLAG_ACCURATEDCT);
    };
  };
  std::atomic<int> failed{0};
  // Each thread writes its outputs to its own kRows rows in turn, made before the trials.
  const std::vector<TensorSpec> specs = stage.OutputSpecs();
  std::vector<std::vector<uint8_t>> rows;
  for (int r = 0; r < threads * kRows; ++r)
    for (const TensorSpec& s : specs) rows.emplace_back(s.NumBytes(), 1);
  std::atomic<int> next_thread{0};
  auto staged = [&] {
    std::shared_ptr<StageWorker> worker = stage.NewWorker();
    const size_t first = static_cast<size_t>(next_thread++ % threads) * kRows * specs.size();
    return [&, worker, first](size_t i) {
      std::string id = std::to_string(i);
      std::vector<uint8_t*> ptrs;
      for (size_t k = 0; k < specs.size(); ++k)
        ptrs.push_back(rows[first + (i % kRows) * specs.size() + k].data());
      Status st =
          worker->Process({1, 0, id, "bench"}, data[i], OutputRow(ptrs.data(), ptrs.size()));
      if (!st.ok()) ++failed;
    };
  };
  std::vector<double> bare_rates, stage_rates;
  for (int t = 0; t < trials; ++t) {
    bare_rates.push_back(only == "stage" ? 1 : Rate(data.size(), threads, bare));
    stage_rates.push_back(only == "bare" ? 1 : Rate(data.size(), threads, staged));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double b = median(bare_rates), s = median(stage_rates);
  std::printf(
      "{\"files\": %zu, \"threads\": %d, \"trials\": %d, \"bare_decode_images_per_s\": %.1f, "
      "\"stage_images_per_s\": %.1f, \"ratio\": %.3f, \"failed\": %d}\n",
      data.size(), threads, trials, b, s, s / b, failed.load() / trials);
  return 0;
}

}  // namespace
}  // namespace mmfeed

int main(int argc, char** argv) { return mmfeed::Main(argc, argv); }
