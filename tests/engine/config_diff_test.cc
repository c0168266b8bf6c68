#include "engine/config_diff.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace mmfeed {
namespace {

class ConfigDiffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteFile(dir_ / "manifest.jsonl", "{\"id\":\"a\",\"text\":\"t\"}\n");
  }
  PipelineConfig Parse(const std::string& workers, const std::string& max_len,
                       const std::string& top = "", const std::string& source = "",
                       const std::string& batch_size = "4") {
    std::string yaml = "pipeline: p\nsource: {type: manifest, path: manifest.jsonl" + source +
                       "}\nconsumers: 2\n" + top +
                       "stages:\n"
                       "  - {name: text, type: text, field: text, workers: " +
                       workers + ", params: {max_len: " + max_len +
                       "}}\n"
                       "  - {name: batch, type: batch, inputs: [text], params: {batch_size: " +
                       batch_size + "}}\n";
    return ParseYaml(yaml);
  }
  PipelineConfig ParseYaml(const std::string& yaml) {
    Result<PipelineConfig> c = ParseConfig(yaml, dir_ / "p.yaml");
    EXPECT_TRUE(c.ok()) << c.status().message();
    return std::move(c.value());
  }
  testing::TempDir dir_;
};

TEST_F(ConfigDiffTest, NamesWhatChangedAndWhatNeedsARestart) {
  PipelineConfig a = Parse("2", "16");
  EXPECT_TRUE(DiffConfigs(a, Parse("2", "16")).empty());
  ConfigChanges c = DiffConfigs(a, Parse("1", "8"));
  EXPECT_TRUE(c.needs_restart.empty());
  EXPECT_EQ(c.Summary(), "text: params; workers of text 2 -> 1");
  c = DiffConfigs(a, Parse("2", "16", "", ", seed: 9"));
  EXPECT_EQ(c.json["settings"], nlohmann::json::array({"source.seed"}));
  EXPECT_TRUE(c.needs_restart.empty()) << "the order is judged by the pipelines";
  c = DiffConfigs(a, Parse("2", "16", "", "", "8"));
  EXPECT_EQ(c.json["settings"], nlohmann::json::array({"batch_size"}));
  EXPECT_TRUE(c.needs_restart.empty())
      << "applied at an epoch boundary, as judged by the pipelines";
  c = DiffConfigs(a, Parse("2", "16", "output: {ring_slots: 4}\n"));
  EXPECT_NE(c.needs_restart.find("output.ring_slots 8 -> 4"), std::string::npos) << c.needs_restart;
  c = DiffConfigs(a, Parse("2", "16", "", ", num_nodes: 2, node_rank: 1"));
  EXPECT_NE(c.needs_restart.find("this node's share"), std::string::npos) << c.needs_restart;
  // workers: auto and its budget reload like any worker count.
  c = DiffConfigs(a, Parse("auto", "16", "cpu_budget: 3\n"));
  EXPECT_TRUE(c.needs_restart.empty());
  EXPECT_EQ(c.Summary(), "workers of text 2 -> auto; cpu_budget changed");
  c = DiffConfigs(a, Parse("2", "16", "faults: {stage: text, read_delay_ms: 5}\n"));
  EXPECT_EQ(c.Summary(), "faults changed");
}

// Of what decides the order, only a weighted mixture's weights: a reload may switch them at a
// batch boundary (`mmfeedctl reload --at batch`).
TEST_F(ConfigDiffTest, AWeightsOnlyChangeOfAMixtureIsNamed) {
  testing::WriteFile(dir_ / "b.jsonl", "{\"id\":\"b\",\"text\":\"t\"}\n");
  auto mix = [&](const std::string& wa, const std::string& wb, const std::string& mix = "{}",
                 const std::string& batch_size = "4") {
    const std::string yaml =
        "pipeline: p\nsources:\n  - {name: a, type: manifest, path: manifest.jsonl, " + wa +
        "}\n  - {name: b, type: manifest, path: b.jsonl, " + wb + "}\nmix: " + mix +
        "\nconsumers: 2\nstages:\n  - {name: text, type: text, field: text}\n"
        "  - {name: batch, type: batch, inputs: [text], params: {batch_size: " +
        batch_size + "}}\n";
    return ParseYaml(yaml);
  };
  const PipelineConfig a = mix("weight: 3", "weight: 1");
  ConfigChanges c = DiffConfigs(a, mix("weight: 1", "weight: 1"));
  EXPECT_TRUE(c.weights_only);
  EXPECT_EQ(c.json["settings"], nlohmann::json::array({"sources"}));
  EXPECT_FALSE(DiffConfigs(a, mix("weight: 3", "weight: 1")).weights_only) << "no change";
  EXPECT_FALSE(DiffConfigs(a, mix("weight: 1", "weight: 1", "{seed: 9}")).weights_only);
  EXPECT_FALSE(DiffConfigs(a, mix("weight: 1", "weight: 1", "{}", "8")).weights_only);
  EXPECT_FALSE(DiffConfigs(a, mix("weight: 1", "weight: 1, shuffle: false")).weights_only);
  EXPECT_FALSE(DiffConfigs(mix("repeat: 1", "repeat: 1", "{mode: epochs}"),
                           mix("repeat: 2", "repeat: 1", "{mode: epochs}"))
                   .weights_only);
}

}  // namespace
}  // namespace mmfeed
