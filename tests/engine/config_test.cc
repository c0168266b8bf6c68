#include "engine/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "engine/batch_plan.h"
#include "engine/config_diff.h"
#include "engine/config_schema.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::TempDir;
using testing::WriteFile;

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteFile(dir_ / "manifest.jsonl", "{\"id\":\"a\",\"image\":\"x.jpg\",\"text\":\"t\"}\n");
  }
  // Returns "" on success, the error message otherwise.
  std::string Error(const std::string& yaml) {
    Result<PipelineConfig> r = ParseConfig(yaml, dir_ / "p.yaml");
    return r.ok() ? "" : r.status().message();
  }
  TempDir dir_;
};

const char* kCanonical = R"(pipeline: image-text
source: {type: manifest, path: manifest.jsonl, shuffle: true, seed: 42, epochs: 1}
consumers: 2
stages:
  - {name: image, type: image, field: image, workers: 2,
     params: {crop: random_resized_crop, size: [224, 224], flip: 0.5,
              mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], dtype: float32, layout: CHW}}
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 128}}
  - {name: batch, type: batch, inputs: [image, text], params: {batch_size: 32}}
output: {ring_slots: 8}
on_error: skip
)";

TEST_F(ConfigTest, CanonicalImageTextConfigIsAccepted) {
  Result<PipelineConfig> r = ParseConfig(kCanonical, dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->consumers, 2);
  EXPECT_EQ(r->batch_size, 32);
  EXPECT_EQ(r->stages.size(), 3u);
  EXPECT_EQ(r->stages[0].workers, 2);
  EXPECT_EQ(r->source.seed, 42u);
  EXPECT_EQ(r->source.path, dir_ / "manifest.jsonl");
  auto specs = r->stages[0].stage->OutputSpecs();
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{3, 224, 224}));
  EXPECT_EQ(specs[0].dtype, DType::kFloat32);
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  size_t p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  return s.replace(p, from.size(), to);
}

TEST_F(ConfigTest, OnlyASmallRegularFileIsReadAsAConfig) {
  testing::TempDir dir;
  auto error = [](const std::string& file) {
    Result<PipelineConfig> c = LoadConfigFile(file);
    return c.ok() ? std::string("loaded") : c.status().message();
  };
  EXPECT_NE(error(dir.path()).find("is a directory"), std::string::npos) << error(dir.path());
  EXPECT_NE(error("/dev/zero").find("/dev/zero: is a device, not a regular file"),
            std::string::npos);
  ASSERT_EQ(mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_NE(error(dir / "fifo").find("is a FIFO"), std::string::npos) << "and it does not block";
  std::string big = "pipeline: x\nstages:\n";
  while (big.size() <= kMaxConfigBytes) big += "  - 1\n";
  testing::WriteFile(dir / "big.yaml", big);
  EXPECT_NE(error(dir / "big.yaml").find("more than max_bytes 1048576"), std::string::npos)
      << error(dir / "big.yaml");
  // Issue #60: the absolute path, the system's reason with its errno, and where it looked.
  EXPECT_EQ(error(dir / "none.yaml"), "cannot open config file " + (dir / "none.yaml") +
                                          ": No such file or directory (errno 2); the folder " +
                                          dir.path() + " exists, the file does not");
  EXPECT_NE(error(dir / "no/none.yaml").find("; the folder " + (dir / "no") + " does not exist"),
            std::string::npos)
      << error(dir / "no/none.yaml");
  // A relative path is named absolute.
  const std::string cwd = std::filesystem::current_path().string();
  std::filesystem::current_path(dir.path());
  const std::string relative = error("none.yaml");
  std::filesystem::current_path(cwd);
  EXPECT_NE(relative.find("cannot open config file " + (dir / "none.yaml") + ":"),
            std::string::npos)
      << relative;
}

TEST_F(ConfigTest, PlacementStrictAndDataRoots) {
  Result<PipelineConfig> r = ParseConfig(
      std::string(kCanonical) + "placement: strict\ndata_roots: any\n", dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->placement.strict);
  EXPECT_TRUE(r->stages[0].placement.strict) << "stages inherit the top-level placement";
  EXPECT_TRUE(r->data_roots_any);
  r = ParseConfig(std::string(kCanonical) + "placement: {numa_node: 0, strict: false}\n",
                  dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->placement.strict);
  EXPECT_NE(Error(std::string(kCanonical) + "data_roots: [nowhere]\n").find("data_roots: '"),
            std::string::npos);
  EXPECT_NE(Error(std::string(kCanonical) + "placement: {strict: maybe}\n")
                .find("strict must be true or false"),
            std::string::npos);
}

TEST_F(ConfigTest, UnknownStageTypeNamesLineAndColumn) {
  std::string e = Error(Replace(kCanonical, "type: text,", "type: txet,"));
  EXPECT_NE(e.find("p.yaml:8:24: unknown stage type 'txet'"), std::string::npos) << e;
  // (This test binary also registers test stages, e.g. test_throws.)
  EXPECT_NE(e.find("known types: audio, batch, image, "), std::string::npos) << e;
  EXPECT_NE(e.find("text, video"), std::string::npos) << e;
}

// YAML parsers keep one of two equal keys silently; a config must not mean something else
// than it says.
TEST_F(ConfigTest, AKeyGivenTwiceIsAnError) {
  std::string e = Error(Replace(kCanonical, "seed: 42,", "seed: 42, seed: 7,"));
  EXPECT_NE(e.find("p.yaml:2:73: 'seed' is given twice in source (first at line 2, column 63)"),
            std::string::npos)
      << e;
  e = Error(Replace(kCanonical, "flip: 0.5", "flip: 0.5, flip: 0"));
  EXPECT_NE(e.find("'flip' is given twice in the params of stage 'image' (image)"),
            std::string::npos)
      << e;
  e = Error(std::string(kCanonical) + "consumers: 3\n");
  EXPECT_NE(e.find("p.yaml:12:1: 'consumers' is given twice in the pipeline config (first at line "
                   "3, column 1)"),
            std::string::npos)
      << e;
}

TEST_F(ConfigTest, MetricsListenIsPortOrHostPort) {
  for (const char* ok : {"9464", "127.0.0.1:9464", "[::1]:9464", "0.0.0.0:1"}) {
    Result<PipelineConfig> r = ParseConfig(
        std::string(kCanonical) + "metrics: {listen: \"" + ok + "\"}\n", dir_ / "p.yaml");
    ASSERT_TRUE(r.ok()) << ok << ": " << r.status().message();
    EXPECT_EQ(r->metrics_listen, ok);
  }
  for (const char* bad : {"localhost", "127.0.0.1:", ":9464", "1.2.3.4:70000", "::1:9464", "x:y"}) {
    std::string e = Error(std::string(kCanonical) + "metrics: {listen: \"" + bad + "\"}\n");
    EXPECT_NE(e.find("p.yaml:12:19: metrics.listen must be PORT, HOST:PORT or [IPV6]:PORT"),
              std::string::npos)
        << bad << ": " << e;
  }
}

TEST_F(ConfigTest, UnknownParameterIsRejected) {
  std::string e = Error(Replace(kCanonical, "flip: 0.5", "flop: 0.5"));
  EXPECT_NE(e.find("p.yaml:6:60: unknown parameter 'flop' for stage 'image' (image)"),
            std::string::npos)
      << e;
}

// Issue #60: `workers` placed inside params got no hint.
TEST_F(ConfigTest, AStageLevelKeyInsideParamsSaysWhereItGoes) {
  std::string e = Error(Replace(kCanonical, "flip: 0.5", "workers: 4"));
  EXPECT_NE(e.find("p.yaml:6:60: 'workers' is not a parameter of stage 'image' (image): it is a "
                   "stage-level key; did you mean to put `workers` beside `params`, not inside "
                   "it?"),
            std::string::npos)
      << e;
  e = Error(Replace(kCanonical, "flip: 0.5", "cache: {max_bytes: 1G}"));
  EXPECT_NE(e.find("did you mean to put `cache` beside `params`"), std::string::npos) << e;
}

// Issue #60: the schema is the config's one description. A config with every default the
// schema states spelled out parses to the same settings as one without them, so a default
// written in the schema is the parser's.
nlohmann::json SettingsOf(const PipelineConfig& c) {
  nlohmann::json stages = nlohmann::json::array();
  for (const StageConfig& s : c.stages) stages.push_back({s.workers, s.queue, s.cache_max_bytes});
  const SourceConfig& s = c.source;
  return {{"source",
           {s.shuffle, s.seed, s.epochs, s.max_bytes, s.index, s.shuffle_window,
            s.fetch.concurrency, s.fetch.prefetch_bytes, s.fetch.retries, s.fetch.timeout_s,
            s.fetch.stall_s, s.fetch.max_shard_bytes}},
          {"top",
           {c.consumers, c.replicas, c.ring_slots, static_cast<int>(c.on_error), c.sample_timeout_s,
            c.placement.strict}},
          {"mix", c.mix.mode},
          {"stages", stages}};
}

TEST_F(ConfigTest, TheSchemasDefaultsAreTheParsersDefaults) {
  const nlohmann::json schema = ConfigSchema();
  auto d = [&](const std::string& pointer) {
    return schema.at(nlohmann::json::json_pointer(pointer + "/default")).dump();
  };
  const std::string stages =
      "stages:\n"
      "  - {name: image, type: image, field: image%W, params: {size: [8, 8]}}\n"
      "  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 4}}\n"
      "  - {name: batch, type: batch, inputs: [image, text], params: {batch_size: 1}}\n";
  auto with_workers = [&](const std::string& w) {
    std::string s = stages;
    s.replace(s.find("%W"), 2, w);
    return s;
  };
  const std::string src = "/properties/source/properties/";
  auto parse = [&](const std::string& yaml) {
    Result<PipelineConfig> r = ParseConfig(yaml, dir_ / "p.yaml");
    EXPECT_TRUE(r.ok()) << r.status().message() << "\n" << yaml;
    return r.ok() ? SettingsOf(*r) : nlohmann::json();
  };
  // One local source; the top level's keys.
  const std::string bare = "source: {type: manifest, path: manifest.jsonl}\n" + with_workers("");
  const std::string spelt =
      "source: {type: manifest, path: manifest.jsonl, shuffle: " + d(src + "shuffle") +
      ", seed: " + d(src + "seed") + ", epochs: " + d(src + "epochs") +
      ", max_bytes: " + d(src + "max_bytes") + ", index: " + d(src + "index") + "}\n" +
      with_workers(", workers: " + d("/properties/stages/items/properties/workers")) +
      "consumers: " + d("/properties/consumers") + "\nreplicas: " + d("/properties/replicas") +
      "\noutput: {ring_slots: " + d("/properties/output/properties/ring_slots") +
      "}\non_error: " + d("/properties/on_error") +
      "\nsample_timeout_s: " + d("/properties/sample_timeout_s") +
      "\nplacement: {strict: " + d("/properties/placement/oneOf/1/properties/strict") + "}\n";
  EXPECT_EQ(parse(bare), parse(spelt)) << spelt;
  // Shards in object storage: the fetch keys.
  const std::string url = "source: {type: webdataset, path: \"http://127.0.0.1:9/s.tar\"";
  const std::string remote = url + ", prefetch_bytes: " + d(src + "prefetch_bytes") +
                             ", fetch_concurrency: " + d(src + "fetch_concurrency") +
                             ", fetch_retries: " + d(src + "fetch_retries") +
                             ", fetch_timeout_s: " + d(src + "fetch_timeout_s") +
                             ", fetch_stall_s: " + d(src + "fetch_stall_s") +
                             ", max_shard_bytes: " + d(src + "max_shard_bytes") + "}\n" +
                             with_workers("");
  EXPECT_EQ(parse(url + "}\n" + with_workers("")), parse(remote)) << remote;
  // A mixture: mix's keys.
  WriteFile(dir_ / "b.jsonl", "{\"id\":\"b\",\"image\":\"y.jpg\",\"text\":\"u\"}\n");
  const std::string sources =
      "sources:\n  - {name: a, type: manifest, path: manifest.jsonl, weight: 1}\n"
      "  - {name: b, type: manifest, path: b.jsonl, weight: 1}\n";
  const std::string mix = "/properties/mix/properties/";
  const std::string mixed = sources + "mix: {mode: " + d(mix + "mode") +
                            ", seed: " + d(mix + "seed") + ", shuffle: " + d(mix + "shuffle") +
                            ", epochs: " + d(mix + "epochs") + "}\n" + with_workers("");
  EXPECT_EQ(parse(sources + with_workers("")), parse(mixed)) << mixed;
}

// Every key the schema knows has a description, and every optional scalar states its default
// (a value, or in words: "x-default"), so the generated reference leaves no key unexplained.
TEST_F(ConfigTest, EveryKeyInTheSchemaIsDescribedWithItsDefault) {
  std::vector<std::string> missing;
  std::function<void(const nlohmann::json&, const std::string&, const nlohmann::json&)> walk =
      [&](const nlohmann::json& props, const std::string& at, const nlohmann::json& required) {
        for (const auto& [name, s] : props.items()) {
          const std::string path = at + name;
          const bool is_required =
              std::find(required.begin(), required.end(), name) != required.end();
          if (!s.contains("description")) missing.push_back(path + ": no description");
          const bool object =
              s.value("type", "") == "object" ||
              (s.contains("oneOf") && s["oneOf"].dump().find("properties") != std::string::npos);
          const bool list = s.value("type", "") == "array";
          if (!is_required && !object && !list && !s.contains("default") &&
              !s.contains("x-default") && name != "pipeline" && name != "data_roots" &&
              name != "cache_budget" && name != "samples_per_epoch" && name != "weight" &&
              name != "fields" && name != "max_bytes" && name != "listen" && name != "dir" &&
              name != "read_delay_ms" && name != "leak_bytes_per_item" && name != "numa_node" &&
              name != "name" && name != "field")
            missing.push_back(path + ": no default");
          if (s.contains("properties"))
            walk(s["properties"], path + ".", s.value("required", nlohmann::json::array()));
        }
      };
  const nlohmann::json schema = ConfigSchema();
  walk(schema["properties"], "", schema["required"]);
  walk(schema["properties"]["stages"]["items"]["properties"], "stages[].",
       schema["properties"]["stages"]["items"]["required"]);
  EXPECT_TRUE(missing.empty()) << ::testing::PrintToString(missing);
}

TEST_F(ConfigTest, UnknownTopLevelKeyIsRejected) {
  std::string e = Error(std::string(kCanonical) + "colour: blue\n");
  EXPECT_NE(e.find("p.yaml:12:1: unknown key 'colour'"), std::string::npos) << e;
}

TEST_F(ConfigTest, FaultsNameAFieldStageAndNeedToBeAllowed) {
  std::string yaml = std::string(kCanonical) +
                     "faults: {stage: image, read_delay_ms: 20, leak_bytes_per_item: 4096}\n";
  Result<PipelineConfig> r = ParseConfig(yaml, dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->faults.stage, "image");
  EXPECT_EQ(r->faults.read_delay_ms, 20);
  EXPECT_EQ(r->faults.leak_bytes_per_item, 4096);
  EXPECT_TRUE(CheckFaultsAllowed(*r, true).ok());
  Status refused = CheckFaultsAllowed(*r, false);
  EXPECT_EQ(refused.message().find(dir_ / "p.yaml:12:9: faults:"), 0u) << refused.message();
  EXPECT_NE(refused.message().find("--allow-faults"), std::string::npos);
  Result<PipelineConfig> plain = ParseConfig(kCanonical, dir_ / "p.yaml");
  EXPECT_TRUE(CheckFaultsAllowed(*plain, false).ok());

  EXPECT_NE(Error(std::string(kCanonical) + "faults: {stage: batch, read_delay_ms: 1}\n")
                .find("12:17: faults.stage: 'batch' is not a stage that reads a sample field"),
            std::string::npos);
  EXPECT_NE(Error(std::string(kCanonical) + "faults: {read_delay_ms: 1}\n").find("needs a 'stage'"),
            std::string::npos);
  EXPECT_NE(Error(std::string(kCanonical) + "faults: {stage: image, read_delay_ms: -1}\n")
                .find("at least 0"),
            std::string::npos);
  EXPECT_NE(Error(std::string(kCanonical) + "faults: {stage: image, slow: 1}\n")
                .find("unknown key 'slow' in faults"),
            std::string::npos);
}

TEST_F(ConfigTest, WorkersAutoAndTheCpuBudget) {
  std::string yaml = Replace(kCanonical, "workers: 2", "workers: auto");
  Result<PipelineConfig> r = ParseConfig(yaml + "cpu_budget: 6\n", dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->stages[0].workers_auto);
  EXPECT_FALSE(r->stages[1].workers_auto);
  EXPECT_EQ(r->cpu_budget, 6);
  EXPECT_TRUE(ParseConfig(yaml, dir_ / "p.yaml").ok()) << "cpu_budget defaults to the CPUs";
  EXPECT_NE(Error(yaml + "cpu_budget: 1\n")
                .find("12:13: cpu_budget 1 is less than the 1 fixed worker(s) plus one for each "
                      "of the 1 stage(s) with workers: auto"),
            std::string::npos)
      << Error(yaml + "cpu_budget: 1\n");
  EXPECT_NE(Error(std::string(kCanonical) + "cpu_budget: 4\n").find("there is none"),
            std::string::npos);
  EXPECT_NE(Error(Replace(kCanonical, "workers: 2", "workers: many"))
                .find("workers must be an integer or auto"),
            std::string::npos);
  EXPECT_NE(
      Error(Replace(kCanonical, "inputs: [image, text],", "inputs: [image, text], workers: auto,"))
          .find("a batch stage runs on one thread"),
      std::string::npos);
}

// A stage's cache: its own max_bytes, or a share of cache_budget; refused where it cannot work.
TEST_F(ConfigTest, StageCachesAndTheCacheBudget) {
  const std::string center =
      Replace(Replace(kCanonical, "random_resized_crop", "center"), "flip: 0.5,", "flip: 0,");
  const std::string both =
      Replace(Replace(center, "workers: 2,", "workers: 2, cache: {max_bytes: 1G},"), "field: text,",
              "field: text, cache: {},");
  Result<PipelineConfig> r = ParseConfig(both + "cache_budget: 4G\n", dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->stages[0].cache_max_bytes, 1ull << 30);
  EXPECT_EQ(r->stages[1].cache_max_bytes, 3ull << 30) << "what the image stage leaves";
  EXPECT_FALSE(r->stages[2].cache);
  EXPECT_EQ(r->CacheBytes(), 4ull << 30);
  EXPECT_NE(Error(both).find("p.yaml:8:50: stage 'text': cache needs max_bytes"), std::string::npos)
      << Error(both);
  EXPECT_NE(Error(both + "cache_budget: 1G\n")
                .find("12:15: cache_budget 1073741824 is less than the stages' own cache "
                      "max_bytes (1073741824) with room left for the stages with cache: {}"),
            std::string::npos)
      << Error(both + "cache_budget: 1G\n");
  EXPECT_NE(Error(center + "cache_budget: 1G\n").find("there is none"), std::string::npos);
  // A random crop keeps its decoded images (Stage::OwnCache), unless they are not what it asked
  // for.
  const std::string random =
      Replace(kCanonical, "workers: 2,", "workers: 2, cache: {max_bytes: 1G},");
  EXPECT_EQ(Error(random), "");
  EXPECT_NE(Error(Replace(random, "flip: 0.5,", "flip: 0.5, dct_scaling: on,"))
                .find("p.yaml:5:65: stage 'image' (image) cannot be cached: crop: "
                      "random_resized_crop draws a new crop every epoch; with dct_scaling: auto or "
                      "off, a cache keeps the decoded pixels"),
            std::string::npos)
      << Error(Replace(random, "flip: 0.5,", "flip: 0.5, dct_scaling: on,"));
  EXPECT_NE(Error(Replace(Replace(both, "flip: 0,", "flip: 0.5,"), "layout: CHW}",
                          "layout: CHW, dct_scaling: on}") +
                  "cache_budget: 4G\n")
                .find("cannot be cached: flip draws a new flip every epoch"),
            std::string::npos);
  EXPECT_NE(Error(Replace(center, "inputs: [image, text],", "inputs: [image, text], cache: {},"))
                .find("a batch stage keeps no per-sample outputs"),
            std::string::npos);
  EXPECT_NE(Error(Replace(center, "workers: 2,", "workers: 2, cache: {max_bytes: 1G, disk: x},"))
                .find("disk"),
            std::string::npos);
  EXPECT_NE(Error(Replace(center, "workers: 2,", "workers: 2, cache: 1G,"))
                .find("cache must be a mapping {max_bytes}"),
            std::string::npos);
}

TEST_F(ConfigTest, TokenBudgetsCountWhatTheirStagesMake) {
  Result<PipelineConfig> r = ParseConfig(
      Replace(kCanonical, "batch_size: 32}", "batch_size: 32, max_tokens: 4096}"), dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->budgeted());
  EXPECT_EQ(r->max_tokens, 4096);
  EXPECT_EQ(r->max_patches, 0);
  const std::string patches =
      Error(Replace(kCanonical, "batch_size: 32}", "batch_size: 32, max_patches: 4096}"));
  EXPECT_NE(patches.find("p.yaml:9:"), std::string::npos) << patches;
  EXPECT_NE(patches.find("no input of this batch stage has vision patches"), std::string::npos)
      << patches;
  EXPECT_NE(Error(Replace(kCanonical, "batch_size: 32}", "batch_size: 32, max_tokens: -1}"))
                .find("max_tokens must be in 0..4294967295, got -1"),
            std::string::npos);
  EXPECT_NE(Error(Replace(kCanonical, "batch_size: 32}",
                          "batch_size: 32, max_tokens: 64, drop_last: true}"))
                .find("drop_last has no meaning"),
            std::string::npos);
}

TEST_F(ConfigTest, IllTypedParametersAreRejected) {
  std::string e = Error(Replace(kCanonical, "size: [224, 224]", "size: [224]"));
  EXPECT_NE(e.find("p.yaml:6:48: image.size must have 2 values, got 1"), std::string::npos) << e;
  e = Error(Replace(kCanonical, "max_len: 128", "max_len: long"));
  EXPECT_NE(e.find("text.max_len must be an integer, got 'long'"), std::string::npos) << e;
  e = Error(Replace(kCanonical, "dtype: float32", "dtype: float64"));
  EXPECT_NE(e.find("image.dtype must be one of uint8, float32, bfloat16, got 'float64'"),
            std::string::npos)
      << e;
  e = Error(Replace(kCanonical, "workers: 2", "workers: 0"));
  EXPECT_NE(e.find("workers must be at least 1"), std::string::npos) << e;
}

TEST_F(ConfigTest, MissingInputIsRejected) {
  std::string e = Error(Replace(kCanonical, "inputs: [image, text]", "inputs: [image, txt]"));
  EXPECT_NE(e.find("p.yaml:9:48: stage 'batch' reads input 'txt', but no stage has that name"),
            std::string::npos)
      << e;
}

TEST_F(ConfigTest, DuplicateStageNameIsRejected) {
  std::string e = Error(Replace(kCanonical, "{name: text,", "{name: image,"));
  EXPECT_NE(e.find("p.yaml:8:12: duplicate stage name 'image'"), std::string::npos) << e;
}

TEST_F(ConfigTest, CycleIsRejected) {
  std::string yaml = Replace(
      kCanonical,
      "  - {name: batch, type: batch, inputs: [image, text], params: {batch_size: 32}}\n",
      "  - {name: batch, type: batch, inputs: [image, text, b2], params: {batch_size: 32}}\n"
      "  - {name: b2, type: batch, inputs: [batch], params: {batch_size: 32}}\n");
  std::string e = Error(yaml);
  EXPECT_NE(e.find("the stages form a cycle: batch -> b2 -> batch"), std::string::npos) << e;
}

TEST_F(ConfigTest, MissingRequiredParameterAndField) {
  std::string e = Error(Replace(kCanonical, "params: {batch_size: 32}", "params: {}"));
  EXPECT_NE(e.find("stage 'batch' (batch) needs parameter 'batch_size'"), std::string::npos) << e;
  e = Error(Replace(kCanonical, "type: text, field: text,", "type: text,"));
  EXPECT_NE(e.find("p.yaml:8:5: stage 'text' (text) needs a 'field'"), std::string::npos) << e;
}

TEST_F(ConfigTest, UnusedStageAndMissingManifestAreRejected) {
  std::string e = Error(Replace(kCanonical, "inputs: [image, text]", "inputs: [image]"));
  EXPECT_NE(e.find("the output of stage 'text' is not used"), std::string::npos) << e;
  e = Error(Replace(kCanonical, "path: manifest.jsonl", "path: nope.jsonl"));
  EXPECT_NE(e.find("p.yaml:2:32: manifest '"), std::string::npos) << e;
}

TEST_F(ConfigTest, MissingOrBrokenTokenizerIsAConfigError) {
  std::string e = Error(Replace(kCanonical, "tokenizer: bytes", "tokenizer: nope.json"));
  EXPECT_NE(
      e.find("p.yaml:8:51: stage 'text' (text): " + dir_ / "nope.json: cannot open tokenizer file"),
      std::string::npos)
      << e;
  WriteFile(dir_ / "bad.json", "{\"model\": {\"type\": \"Unigram\"}}");
  e = Error(Replace(kCanonical, "tokenizer: bytes", "tokenizer: bad.json"));
  EXPECT_NE(e.find("bad.json: unsupported tokenizer: model type 'Unigram'"), std::string::npos)
      << e;
}

TEST_F(ConfigTest, YamlSyntaxErrorHasLocation) {
  std::string e = Error("source: {type: manifest\nstages: [\n");
  EXPECT_EQ(e.rfind(dir_ / "p.yaml:", 0), 0u) << e;
  EXPECT_NE(e.find(":2:"), std::string::npos) << e;
}

TEST_F(ConfigTest, WebDatasetFieldsMapNamesToExtensions) {
  WriteFile(dir_ / "shard-0.tar", std::string(1024, '\0'));
  const std::string yaml =
      R"(source: {type: webdataset, path: shard-0.tar, fields: {video: [mp4, mkv], text: txt}}
stages:
  - {name: video, type: video, field: video, params: {size: [8, 8]}}
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 8}}
  - {name: batch, type: batch, inputs: [video, text], params: {batch_size: 2}}
)";
  Result<PipelineConfig> r = ParseConfig(yaml, dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->source.fields.at("video"), (std::vector<std::string>{"mp4", "mkv"}));
  EXPECT_EQ(r->source.fields.at("text"), (std::vector<std::string>{"txt"}));
  EXPECT_NE(Error(R"(source: {type: webdataset, path: shard-0.tar, fields: {video: {a: 1}}}
stages:
  - {name: batch, type: batch, inputs: [video], params: {batch_size: 2}}
)")
                .find("source.fields values"),
            std::string::npos);
}

// Remote shards: a URL path is kept as it is (not resolved against the config's folder), needs
// no file at parse time, gets window mode by default, and its keys are checked.
TEST_F(ConfigTest, RemoteShardsAndTheirKeys) {
  const std::string stages = R"(
stages:
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 8}}
  - {name: batch, type: batch, inputs: [text], params: {batch_size: 2}}
)";
  auto parse = [&](const std::string& source) {
    return ParseConfig("source: " + source + stages, dir_ / "p.yaml");
  };
  Result<PipelineConfig> r = parse(
      R"({type: webdataset, path: "https://127.0.0.1:9/b/shard-{0..3}.tar", prefetch_bytes: 4096,
          fetch_concurrency: 2, fetch_retries: 1, fetch_timeout_s: 2.5, max_shard_bytes: 8192})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->source.remote);
  EXPECT_EQ(r->source.path, "https://127.0.0.1:9/b/shard-{0..3}.tar");
  EXPECT_EQ(r->source.shuffle_window, 8);
  EXPECT_EQ(r->source.fetch.prefetch_bytes, 4096u);
  EXPECT_EQ(r->source.fetch.concurrency, 2);
  EXPECT_EQ(r->source.fetch.retries, 1);
  EXPECT_DOUBLE_EQ(r->source.fetch.timeout_s, 2.5);
  EXPECT_EQ(r->source.fetch.max_shard_bytes, 8192u);
  r = parse(R"({type: webdataset, path: "s3://bucket/p/shard-0.tar", shuffle_window: 2,
          s3: {endpoint: "http://127.0.0.1:9", region: eu-west-1, credentials_file: creds}})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->source.shuffle_window, 2);
  EXPECT_EQ(r->source.fetch.s3_region, "eu-west-1");
  EXPECT_EQ(r->source.fetch.s3_credentials_file, dir_ / "creds");
  WriteFile(dir_ / "shard-0.tar", std::string(1024, '\0'));
  r = parse("{type: webdataset, path: shard-0.tar}");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->source.shuffle_window, 0) << "local shards keep the full permutation";
  auto error = [&](const std::string& source) {
    Result<PipelineConfig> e = parse(source);
    return e.ok() ? std::string() : e.status().message();
  };
  EXPECT_NE(error(R"({type: webdataset, path: "http://h/s.tar", shuffle_window: 0})")
                .find("p.yaml:1:68: remote shards are read whole"),
            std::string::npos)
      << error(R"({type: webdataset, path: "http://h/s.tar", shuffle_window: 0})");
  EXPECT_NE(error("{type: webdataset, path: shard-0.tar, prefetch_bytes: 10}")
                .find("source.prefetch_bytes applies to http://, https:// and s3:// paths only"),
            std::string::npos);
  EXPECT_NE(error(R"({type: webdataset, path: "http://h/s.tar", s3: {region: x}})")
                .find("source.s3 applies to s3:// paths only"),
            std::string::npos);
  EXPECT_NE(error(R"({type: webdataset, path: "s3://b/s.tar", s3: {secret: x}})").find("secret"),
            std::string::npos);
  EXPECT_NE(error(R"({type: manifest, path: "http://h/m.jsonl"})").find("needs type: webdataset"),
            std::string::npos);
  // source.cache: a folder (relative to the config) and a size with or without a unit.
  for (const auto& [size, bytes] : std::vector<std::pair<std::string, uint64_t>>{
           {"4096", 4096}, {"500G", 500ull << 30}, {"1.5TiB", 3ull << 39}, {"2MB", 2ull << 20}}) {
    r = parse(R"({type: webdataset, path: "http://h/s.tar", cache: {dir: c, max_bytes: )" + size +
              "}}");
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->source.fetch.cache_dir, dir_ / "c");
    EXPECT_EQ(r->source.fetch.cache_max_bytes, bytes) << size;
  }
  for (const char* bad : {"0", "-5", "12X", "G", "1.5Q", "many"})
    EXPECT_NE(error(std::string(R"({type: webdataset, path: "http://h/s.tar", cache: {dir: c, )") +
                    "max_bytes: " + bad + "}}")
                  .find("source.cache.max_bytes must be a size in bytes, like 1073741824, 500G"),
              std::string::npos)
        << bad;
  EXPECT_NE(error(R"({type: webdataset, path: "http://h/s.tar", cache: {dir: c}})")
                .find("source.cache needs a 'dir'"),
            std::string::npos);
  // A folder that cannot be made is caught with the config's position, before any start.
  WriteFile(dir_ / "plain-file", "x");
  EXPECT_NE(error(R"({type: webdataset, path: "http://h/s.tar", cache: {dir: plain-file/c, )"
                  "max_bytes: 1G}}")
                .find("p.yaml:1:65: source.cache.dir " + dir_ / "plain-file/c" + ": " +
                      dir_ / "plain-file" + " is not a folder"),
            std::string::npos)
      << error(
             R"({type: webdataset, path: "http://h/s.tar", cache: {dir: plain-file/c, max_bytes: 1G}})");
  EXPECT_NE(error("{type: webdataset, path: shard-0.tar, cache: {dir: c, max_bytes: 1G}}")
                .find("source.cache applies to http://, https:// and s3:// paths only"),
            std::string::npos);
  {  // token budgets plan with the full permutation
    Result<PipelineConfig> e =
        ParseConfig(std::string("source: {type: webdataset, path: \"http://h/s-{0..1}.tar\"}") +
                        R"(
stages:
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 8}}
  - {name: batch, type: batch, inputs: [text], params: {batch_size: 2, max_tokens: 16}}
)",
                    dir_ / "p.yaml");
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("p.yaml:4:5: token budgets"), std::string::npos)
        << e.status().message();
  }
  EXPECT_NE(error(R"({type: webdataset, path: "http://h/s.tar", fetch_timeout_s: 0})")
                .find("at least 0.1"),
            std::string::npos);
  EXPECT_NE(error(R"({type: webdataset, path: "s.tar", max_shard_bytes: 4096})")
                .find("source.max_shard_bytes applies to http://, https:// and s3:// paths only"),
            std::string::npos);
}

TEST_F(ConfigTest, NodeRankFromEnvironment) {
  setenv("NODE_RANK", "1", 1);
  setenv("NUM_NODES", "4", 1);
  Result<PipelineConfig> r = ParseConfig(kCanonical, dir_ / "p.yaml");
  unsetenv("NODE_RANK");
  unsetenv("NUM_NODES");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->source.node_rank, 1);
  EXPECT_EQ(r->source.num_nodes, 4);
}

// `consumers: auto` and `node_rank`/`num_nodes: auto`: the trainers' job gives the shape (#31).
TEST_F(ConfigTest, AutoShapeWaitsForTheTrainersJob) {
  std::string yaml = kCanonical;
  yaml.replace(yaml.find("consumers: 2"), 12, "consumers: auto");
  yaml.replace(yaml.find("epochs: 1}"), 10, "epochs: 1, node_rank: auto, num_nodes: auto}");
  setenv("NODE_RANK", "3", 1);  // auto is the trainers' word, not the daemon's environment
  setenv("NUM_NODES", "4", 1);
  Result<PipelineConfig> r = ParseConfig(yaml, dir_ / "p.yaml");
  unsetenv("NODE_RANK");
  unsetenv("NUM_NODES");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->shape_from_trainers());
  EXPECT_EQ((std::tuple{r->consumers, r->source.node_rank, r->source.num_nodes}),
            (std::tuple{1, 0, 1}));
  ASSERT_TRUE(r->AdoptShape(8, 2, 3, 0).ok());
  EXPECT_EQ((std::tuple{r->consumers, r->source.node_rank, r->source.num_nodes}),
            (std::tuple{8, 2, 3}));
  EXPECT_FALSE(r->AdoptShape(65, 0, 1, 0).ok()) << "at most 64 consumers";
  std::string half = kCanonical;
  half.replace(half.find("epochs: 1}"), 10, "epochs: 1, node_rank: auto, num_nodes: 2}");
  EXPECT_NE(Error(half).find("source.node_rank and source.num_nodes are auto together"),
            std::string::npos)
      << Error(half);
  Result<PipelineConfig> fixed = ParseConfig(kCanonical, dir_ / "p.yaml");
  ASSERT_TRUE(fixed.ok());
  EXPECT_FALSE(fixed->shape_from_trainers());
  ASSERT_TRUE(fixed->AdoptShape(8, 2, 3, 0).ok());
  EXPECT_EQ(fixed->consumers, 2) << "explicit values stay";
}

// `replicas: k`: consecutive groups of k trainer ranks read one stream (#31); `consumers:`
// counts the trainer ranks.
TEST_F(ConfigTest, ReplicasGroupTheTrainerRanksIntoStreams) {
  std::string yaml = kCanonical;
  yaml.replace(yaml.find("consumers: 2"), 12, "consumers: 4\nreplicas: 2");
  Result<PipelineConfig> r = ParseConfig(yaml, dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((std::tuple{r->consumers, r->replicas, r->trainers()}), (std::tuple{2, 2, 4}));
  std::string odd = kCanonical;
  odd.replace(odd.find("consumers: 2"), 12, "consumers: 3\nreplicas: 2");
  EXPECT_NE(Error(odd).find(":4:11: consumers: 3 is not a multiple of replicas: 2"),
            std::string::npos)
      << Error(odd);
  std::string automatic = kCanonical;
  automatic.replace(automatic.find("consumers: 2"), 12, "consumers: auto\nreplicas: 2");
  Result<PipelineConfig> a = ParseConfig(automatic, dir_ / "p.yaml");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->consumers, 1) << "one stream until the job is adopted (--check builds it)";
  EXPECT_NE(a->AdoptShape(3, 0, 1, 0).message().find("not a multiple of replicas: 2"),
            std::string::npos);
  EXPECT_NE(
      a->AdoptShape(4, 0, 1, 4)
          .message()
          .find("the job declares groups of 4 ranks receiving the same batches ($MMFEED_REPLICAS), "
                "the config replicas: 2"),
      std::string::npos)
      << "a declared group size other than the config's";
  ASSERT_TRUE(a->AdoptShape(4, 0, 1, 2).ok());
  EXPECT_EQ((std::tuple{a->consumers, a->trainers()}), (std::tuple{2, 4}));
  Result<PipelineConfig> one = ParseConfig(kCanonical, dir_ / "p.yaml");
  ASSERT_TRUE(one.ok());
  EXPECT_NE(DiffConfigs(*one, *r).needs_restart.find("replicas 1 -> 2"), std::string::npos)
      << "which ranks share a ring cannot change under attached trainers";
}

// `replicas: auto`: the group size the trainers declare with their job, with consumers: auto.
TEST_F(ConfigTest, ReplicasAutoTakesTheDeclaredGroupSize) {
  std::string yaml = kCanonical;
  yaml.replace(yaml.find("consumers: 2"), 12, "consumers: auto\nreplicas: auto");
  Result<PipelineConfig> r = ParseConfig(yaml, dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((std::tuple{r->replicas_auto, r->replicas, r->consumers}), (std::tuple{true, 1, 1}));
  PipelineConfig undeclared = *r;
  ASSERT_TRUE(undeclared.AdoptShape(4, 0, 1, 0).ok());
  EXPECT_EQ((std::tuple{undeclared.replicas, undeclared.consumers}), (std::tuple{1, 4}))
      << "a job declaring no group size: one rank a stream";
  EXPECT_NE(r->AdoptShape(6, 0, 1, 4).message().find("not a multiple of replicas: 4"),
            std::string::npos);
  EXPECT_EQ((std::tuple{r->replicas, r->consumers}), (std::tuple{1, 1}))
      << "a refused job changes nothing";
  ASSERT_TRUE(r->AdoptShape(8, 0, 1, 4).ok());
  EXPECT_EQ((std::tuple{r->replicas, r->consumers, r->trainers()}), (std::tuple{4, 2, 8}));
  std::string fixed = kCanonical;
  fixed.replace(fixed.find("consumers: 2"), 12, "consumers: 2\nreplicas: auto");
  EXPECT_NE(Error(fixed).find(":4:11: replicas: auto takes the group size the trainers declare"),
            std::string::npos)
      << Error(fixed);
}

// A mixture of two manifests (issue #30); `sources` replaces `source`.
std::string MixYaml(const std::string& sources, const std::string& mix = "") {
  return "sources:\n" + sources + (mix.empty() ? "" : "mix: " + mix + "\n") +
         "stages:\n"
         "  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 8}}\n"
         "  - {name: batch, type: batch, inputs: [text], params: {batch_size: 2}}\n";
}

TEST_F(ConfigTest, AMixtureOfSourcesIsParsedWithItsOrderFromMix) {
  WriteFile(dir_ / "b.jsonl", "{\"id\":\"b\",\"question\":\"q\"}\n");
  Result<PipelineConfig> r =
      ParseConfig(MixYaml("  - {name: captions, type: manifest, path: manifest.jsonl, weight: 3}\n"
                          "  - {name: qa, type: manifest, path: b.jsonl, weight: 1, seed: 5, "
                          "fields: {text: question}}\n",
                          "{seed: 42, epochs: 2, samples_per_epoch: 1000}"),
                  dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(r->mixed());
  EXPECT_EQ(r->source.type, "mix");
  EXPECT_EQ(r->source.seed, 42u);
  EXPECT_EQ(r->source.epochs, 2);
  EXPECT_TRUE(r->source.shuffle) << "a mixture shuffles unless mix says shuffle: false";
  EXPECT_EQ(r->mix.mode, "weighted");
  EXPECT_EQ(r->mix.samples_per_epoch, 1000u);
  ASSERT_EQ(r->sources.size(), 2u);
  EXPECT_EQ(r->sources[0].name, "captions");
  EXPECT_EQ(r->sources[0].weight, 3);
  EXPECT_NE(r->sources[0].seed, 42u) << "each source's order is seeded by the mix and its name";
  EXPECT_EQ(r->sources[1].seed, 5u);
  EXPECT_EQ(r->sources[1].keys, (std::map<std::string, std::string>{{"text", "question"}}));
  Result<PipelineConfig> epochs =
      ParseConfig(MixYaml("  - {name: a, type: manifest, path: manifest.jsonl, repeat: 0.5}\n"
                          "  - {name: b, type: manifest, path: b.jsonl}\n",
                          "{mode: epochs}"),
                  dir_ / "p.yaml");
  ASSERT_TRUE(epochs.ok()) << epochs.status().message();
  EXPECT_EQ(epochs->sources[0].repeat, 0.5);
  EXPECT_EQ(epochs->sources[1].repeat, 1) << "epochs mode: each sample once by default";
}

// A mixture's batch has each row's source and a mask per fixed-shape stage (BatchPlan).
TEST_F(ConfigTest, AMixturesBatchNamesEachRowsSourceAndWhetherItHadAField) {
  WriteFile(dir_ / "b.jsonl", "{\"id\":\"b\",\"text\":\"q\"}\n");
  const std::string sources =
      "  - {name: a, type: manifest, path: manifest.jsonl, weight: 1}\n"
      "  - {name: b, type: manifest, path: b.jsonl, weight: 1}\n";
  Result<PipelineConfig> r = ParseConfig(MixYaml(sources), dir_ / "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  Result<BatchPlan> plan = PlanBatch(*r);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  std::vector<std::string> names;
  for (const TensorSpec& t : plan->specs) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"text", "text_lengths", "text_present", "source"}));
  EXPECT_EQ(plan->present, std::vector<int>{2});
  EXPECT_EQ(plan->source, 3);
  EXPECT_EQ(plan->specs[2].dtype, DType::kUInt8);
  EXPECT_EQ(plan->specs[3].dtype, DType::kInt32);
  Result<PipelineConfig> one = ParseConfig(kCanonical, dir_ / "p.yaml");
  ASSERT_TRUE(one.ok());
  Result<BatchPlan> plain = PlanBatch(*one);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->source, -1) << "one source: no source column";
  EXPECT_EQ(plain->TensorIndex("text_present"), -1);
  // A stage whose output takes the column's name is refused, saying why.
  std::string yaml = MixYaml(sources);
  for (auto [from, to] : {std::pair<std::string, std::string>{"name: text,", "name: source,"},
                          {"inputs: [text]", "inputs: [source]"}})
    yaml.replace(yaml.find(from), from.size(), to);
  Result<PipelineConfig> clash = ParseConfig(yaml, dir_ / "p.yaml");
  ASSERT_TRUE(clash.ok()) << clash.status().message();
  Result<BatchPlan> refused = PlanBatch(*clash);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("two tensors of the batch are named 'source' (a "
                                            "mixture adds `source`"),
            std::string::npos)
      << refused.status().message();
}

TEST_F(ConfigTest, MixtureMistakesNameTheirLineAndColumn) {
  WriteFile(dir_ / "b.jsonl", "{\"id\":\"b\",\"text\":\"q\"}\n");
  const std::string p = dir_ / "p.yaml";
  const std::string a = "  - {name: a, type: manifest, path: manifest.jsonl, weight: 1}\n";
  EXPECT_EQ(Error("source: {type: manifest, path: manifest.jsonl}\n" + MixYaml(a)),
            p + ":3:3: give either 'source' (one) or 'sources' (a mixture), not both");
  EXPECT_EQ(Error("source: {type: manifest, path: manifest.jsonl}\nmix: {seed: 1}\nstages: []\n"),
            p + ":2:6: 'mix' is for a mixture of 'sources'; with one 'source' leave it out");
  EXPECT_EQ(Error(MixYaml("  - {type: manifest, path: manifest.jsonl, weight: 1}\n")),
            p + ":2:5: each source of a mixture needs a 'name' (status and metrics use it)");
  EXPECT_EQ(Error(MixYaml(a + "  - {name: a, type: manifest, path: b.jsonl, weight: 1}\n")),
            p + ":3:12: two sources are named 'a'");
  EXPECT_EQ(
      Error(MixYaml(a + "  - {name: b, type: manifest, path: ./manifest.jsonl, weight: 2}\n")),
      p + ":3:37: sources 'a' and 'b' read the same files (" + (dir_ / "manifest.jsonl") +
          "): give one source, with the share of both");
  EXPECT_EQ(Error(MixYaml("  - {name: a, type: manifest, path: manifest.jsonl}\n")),
            p + ":2:5: source 'a' needs a weight (mix.mode weighted): its share of the stream, in "
                "proportion to the others'");
  EXPECT_EQ(Error(MixYaml(a, "{mode: epochs}")),
            p + ":2:61: mix.mode epochs gives each source a repeat, not a weight");
  EXPECT_EQ(Error(MixYaml("  - {name: a, type: manifest, path: manifest.jsonl, weight: -1}\n")),
            p + ":2:61: the weight of source 'a' must be above 0 and at most 1e12");
  std::filesystem::create_symlink(dir_ / "manifest.jsonl", dir_ / "link.jsonl");
  EXPECT_NE(Error(MixYaml(a + "  - {name: b, type: manifest, path: link.jsonl, weight: 2}\n"))
                .find("sources 'a' and 'b' read the same files"),
            std::string::npos)
      << "a symlink to a source's manifest is that source";
  EXPECT_EQ(Error(MixYaml(a, "{samples_per_epoch: 1000000000001}")),
            p + ":3:26: mix.samples_per_epoch must be at most 1000000000000");
  EXPECT_EQ(Error(MixYaml(a, "{mode: blend}")),
            p + ":3:13: mix.mode must be weighted or epochs, not 'blend'");
  EXPECT_EQ(Error(MixYaml(a, "{mode: epochs, samples_per_epoch: 10}")),
            p + ":3:40: mix.samples_per_epoch is for mode weighted (mode epochs: each source's "
                "repeat x its size)");
  EXPECT_NE(Error(MixYaml("  - {name: a, type: manifest, path: manifest.jsonl, weight: 1, "
                          "epochs: 2}\n"))
                .find(":2:64: unknown key 'epochs' in a source of 'sources' (epochs and the node's "
                      "share are mix's)"),
            std::string::npos);
  // Remote shards in a mixture are read in windows, as one remote source's are: token budgets
  // need a permutation order, and say which source has none.
  const std::string remote =
      "  - {name: web, type: webdataset, path: \"http://h/s-{0..1}.tar\", weight: 1}\n";
  Result<PipelineConfig> mixed = ParseConfig(MixYaml(remote), dir_ / "p.yaml");
  ASSERT_TRUE(mixed.ok()) << mixed.status().message();
  EXPECT_EQ(mixed->sources[0].shuffle_window, 8) << "remote shards: windows of 8 by default";
  EXPECT_NE(Error(MixYaml(Replace(remote, "weight: 1", "weight: 1, shuffle_window: 0")))
                .find("remote shards are read whole: source.shuffle_window must be at least 1"),
            std::string::npos);
  EXPECT_EQ(Error(Replace(MixYaml(remote), "batch_size: 2", "batch_size: 2, max_tokens: 64")),
            p + ":5:5: token budgets (max_tokens, max_patches) need a permutation order: source "
                "'web' is read in shard windows (shuffle_window: 8), as remote shards must be: "
                "mix it without token budgets");
  EXPECT_EQ(Error(MixYaml("  - {name: a, type: manifest, path: manifest.jsonl, weight: 1, "
                          "fields: {text: [a, b]}}\n")),
            p + ":2:79: the manifest key of field 'text' must be a string, got a list");
}

}  // namespace
// Every registered stage type and parameter is in the config's JSON Schema, with its type,
// default and choices: a parameter the schema lost (or a type it forgot) fails here.
TEST(ConfigSchemaTest, EveryRegisteredParameterIsInTheSchemaWithItsTypeAndDefault) {
  const nlohmann::json schema = ConfigSchema();
  const nlohmann::json& stage = schema["properties"]["stages"]["items"];
  std::map<std::string, nlohmann::json> params;
  for (const auto& c : stage["allOf"])
    params[c["if"]["properties"]["type"]["const"].get<std::string>()] =
        c["then"]["properties"]["params"]["properties"];
  const std::vector<std::string> types = Registry::Get().Types();
  ASSERT_EQ(params.size(), types.size());
  for (const std::string& type : types) {
    ASSERT_TRUE(params.count(type)) << type;
    const StageSchema* s = Registry::Get().Find(type);
    EXPECT_EQ(params[type].size(), s->params.size()) << type;
    for (const ParamSpec& p : s->params) {
      SCOPED_TRACE(type + "." + p.name);
      ASSERT_TRUE(params[type].contains(p.name));
      const nlohmann::json& j = params[type][p.name];
      const char* want = p.type == ParamType::kBool     ? "boolean"
                         : p.type == ParamType::kInt    ? "integer"
                         : p.type == ParamType::kFloat  ? "number"
                         : p.type == ParamType::kString ? "string"
                                                        : "array";
      EXPECT_EQ(j["type"], want);
      EXPECT_EQ(j["description"], p.doc);
      EXPECT_EQ(j.contains("default"), p.default_value.has_value());
      if (!p.choices.empty()) {
        EXPECT_EQ(j["enum"], nlohmann::json(p.choices));
      }
      if (p.list_size) {
        EXPECT_EQ(j["minItems"], p.list_size);
      }
    }
  }
}

}  // namespace mmfeed
