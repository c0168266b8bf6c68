// The --state-dir file (daemon/stream_state.h): what is written is read back whole, and every
// malformed part is refused naming the file and the part, never read as a different stream.
#include "daemon/stream_state.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/test_util.h"

namespace mmfeed {
namespace {

StreamState Example() {
  StreamState s;
  s.pipeline = "p";
  s.fingerprint = "abc123";
  s.origin_epoch = 2;
  s.origin_seq = 40;
  s.origin_stream = 7;
  s.origin_previous = 5;
  s.origin_base = 96;
  s.origin_lanes = 4;
  s.origin_nodes = 2;
  s.ranks = {{2, 3, 43, 7}, {2, 1, 41, 7}};
  s.config_file = "/etc/mmfeed/pipeline.yaml";
  s.config_text = "pipeline: p\n";
  s.mix_switches = {{1, 240, {3.0, 1.0}}};
  return s;
}

TEST(StreamStateTest, WhatIsWrittenIsReadBackWhole) {
  const nlohmann::json j = StreamStateToJson(Example());
  Result<StreamState> r = StreamStateFromJson(j, "/s/cursors.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(StreamStateToJson(*r), j);
  EXPECT_EQ(r->ranks.size(), 2u);
  EXPECT_EQ(r->ranks[0].seq, 43u);
  EXPECT_EQ(r->origin_base, 96u);
  EXPECT_EQ(r->mix_switches[0].weights, (std::vector<double>{3.0, 1.0}));
}

TEST(StreamStateTest, AVersionOneFileIsReadWithoutItsConfig) {
  nlohmann::json j = StreamStateToJson(Example());
  j.erase("version");
  j.erase("config");
  Result<StreamState> r = StreamStateFromJson(j, "/s/cursors.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->config_text.empty());
}

TEST(StreamStateTest, EveryMalformedPartIsNamed) {
  const nlohmann::json good = StreamStateToJson(Example());
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
  };
  const std::vector<Case> cases = {
      {"not a JSON object", [](nlohmann::json& j) { j = nlohmann::json::array(); }},
      {"unknown \"version\"", [](nlohmann::json& j) { j["version"] = 3; }},
      {"unknown \"version\"", [](nlohmann::json& j) { j["version"] = "2"; }},
      {"no string \"fingerprint\"", [](nlohmann::json& j) { j["fingerprint"] = 5; }},
      {"\"origin\" is not an epoch's first batch",
       [](nlohmann::json& j) { j["origin"]["batch"] = 3; }},
      {"\"origin\".\"previous_stream\" is not a 32-bit tag",
       [](nlohmann::json& j) { j["origin"]["previous_stream"] = uint64_t{1} << 33; }},
      {"\"origin\".\"base\" is not a position",
       [](nlohmann::json& j) { j["origin"]["base"] = -1; }},
      {"\"origin\".\"base_lanes\" is not a 32-bit count",
       [](nlohmann::json& j) { j["origin"]["base_lanes"] = "4"; }},
      {"no \"ranks\" array", [](nlohmann::json& j) { j["ranks"] = nlohmann::json::array(); }},
      {"rank 1: ",
       [](nlohmann::json& j) {
         j["ranks"][1] = {{"epoch", "x"}};
       }},
      {"no \"config\" with a \"file\" and a \"text\"",
       [](nlohmann::json& j) { j["config"].erase("text"); }},
      {"\"mix_switches\" is not an array", [](nlohmann::json& j) { j["mix_switches"] = 1; }},
      {"mix_switches[0] is not",
       [](nlohmann::json& j) { j["mix_switches"][0]["weights"] = {"a"}; }},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.edit(j);
    Result<StreamState> r = StreamStateFromJson(j, "/s/cursors.json");
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.status().message().find(std::string("/s/cursors.json: ") + c.what),
              std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("move it away to start every rank at the beginning"),
              std::string::npos);
  }
}

TEST(StreamStateTest, OnlyASmallRegularFileIsRead) {
  testing::TempDir dir;
  Result<std::optional<StreamState>> none = ReadStreamState(dir / "cursors.json");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  testing::WriteFile(dir / "cursors.json", StreamStateToJson(Example()).dump());
  Result<std::optional<StreamState>> read = ReadStreamState(dir / "cursors.json");
  ASSERT_TRUE(read.ok() && read->has_value()) << read.status().message();
  EXPECT_EQ((*read)->fingerprint, "abc123");
  testing::WriteFile(dir / "bad.json", "{\"fingerprint\": ");
  EXPECT_FALSE(ReadStreamState(dir / "bad.json").ok());
  ASSERT_EQ(symlink((dir / "cursors.json").c_str(), (dir / "link.json").c_str()), 0);
  EXPECT_FALSE(ReadStreamState(dir / "link.json").ok()) << "a symlink is never followed";
  ASSERT_EQ(mkfifo((dir / "fifo.json").c_str(), 0600), 0);
  EXPECT_FALSE(ReadStreamState(dir / "fifo.json").ok()) << "and a FIFO does not block";
}

}  // namespace
}  // namespace mmfeed
