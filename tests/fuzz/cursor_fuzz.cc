// libFuzzer target: a cursor as a trainer (or an edited checkpoint) sends it, against real
// plans: a shuffled manifest of 96 samples dealt to 2 ranks, and a weighted mixture of two
// manifests (96 draws an epoch, 2 lanes). Any JSON is a cursor or a clear error; a cursor's
// position is rebased to one inside the epoch's order or refused (never read as "the epoch is
// done": an edited cursor once skipped the rest of a job that way), a position without its
// stream tag is refused, and a seq the plan accepts maps to a cursor of that seq.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/cursor.h"
#include "engine/config.h"
#include "engine/pipeline.h"

namespace {

using namespace mmfeed;

constexpr uint64_t kSamples = 96;  // the manifest's, and the mixture's draws an epoch

class NoSink : public BatchSink {
 public:
  Reservation Reserve(BatchMemory*, int) override { return Reservation::kClosed; }
  void Commit(const BatchMemory&, const BatchInfo&) override {}
  void Discard(const BatchMemory&) override {}
  void Finish(bool) override {}
};

struct Plan {
  std::vector<std::unique_ptr<NoSink>> sinks;
  std::unique_ptr<Pipeline> pipeline;
};

std::string Folder() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/mmfeed-fuzz-cursor-XXXXXX";
    const std::string d = ::mkdtemp(tmpl);
    std::ofstream m(d + "/manifest.jsonl"), q(d + "/qa.jsonl");
    for (uint64_t i = 0; i < kSamples; ++i)
      m << nlohmann::json{{"id", "s" + std::to_string(i)}, {"text", "caption"}}.dump() << "\n";
    for (int i = 0; i < 40; ++i)
      q << nlohmann::json{{"id", "q" + std::to_string(i)}, {"text", "question"}}.dump() << "\n";
    return d;
  }();
  return dir;
}

std::unique_ptr<Plan> Build(const std::string& source) {
  const std::string text =
      source +
      "consumers: 2\n"
      "stages:\n"
      "  - {name: text, type: text, field: text, params: {max_len: 8}}\n"
      "  - {name: batch, type: batch, inputs: [text], params: {batch_size: 4}}\n";
  Result<PipelineConfig> cfg = ParseConfig("pipeline: fuzz\n" + text, Folder() + "/p.yaml");
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().message().c_str());
    std::abort();
  }
  auto plan = std::make_unique<Plan>();
  std::vector<BatchSink*> sinks;
  for (int r = 0; r < cfg->consumers; ++r) {
    plan->sinks.push_back(std::make_unique<NoSink>());
    sinks.push_back(plan->sinks.back().get());
  }
  Result<std::unique_ptr<Pipeline>> p = Pipeline::Create(*cfg, sinks);
  if (!p.ok()) {
    std::fprintf(stderr, "%s\n", p.status().message().c_str());
    std::abort();
  }
  plan->pipeline = std::move(p.value());
  return plan;
}

const std::vector<std::unique_ptr<Plan>>& Plans() {
  static const auto plans = [] {
    std::vector<std::unique_ptr<Plan>> v;
    v.push_back(
        Build("source: {type: manifest, path: manifest.jsonl, shuffle: true, seed: 5, "
              "epochs: 2}\n"));
    v.push_back(
        Build("sources:\n"
              "  - {name: captions, type: manifest, path: manifest.jsonl, weight: 3}\n"
              "  - {name: qa, type: manifest, path: qa.jsonl, weight: 1}\n"
              "mix: {seed: 5, epochs: 2, samples_per_epoch: 96}\n"));
    return v;
  }();
  return plans;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j =
      nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size), nullptr, false);
  Result<StreamCursor> c = CursorFromJson(j);
  if (!c.ok()) return 0;
  if (c->order && !c->stream) __builtin_trap();  // a position without its stream's tag
  for (const auto& plan : Plans()) {
    const Pipeline& p = *plan->pipeline;
    if (c->order) {
      Result<Pipeline::Origin> o = p.stream().Rebased(c->epoch, c->position, c->lanes, c->nodes);
      if (o.ok() && (c->position > kSamples || o->base > kSamples ||
                     (o->epoch != c->epoch && o->epoch != c->epoch + 1)))
        __builtin_trap();  // a position outside the epoch served as something else
    }
    if (p.stream().CheckCursor(c->seq).ok() && p.stream().CursorAt(c->seq).seq != c->seq)
      __builtin_trap();
  }
  return 0;
}
