// The run's counters over pipelines (daemon/run_totals.h): a reload's replaced pipeline is
// carried, its rings left out (they count on), a removed source kept after the current ones.
#include "daemon/run_totals.h"

#include <gtest/gtest.h>

namespace mmfeed {
namespace {

nlohmann::json Stage(const std::string& name, const std::string& type, double items) {
  return {{"name", name},         {"type", type},        {"items", items},
          {"errors", 1},          {"busy_seconds", 2.0}, {"starved_seconds", 0.5},
          {"blocked_seconds", 0}, {"queue_depth", items}};
}

nlohmann::json Source(const std::string& name, uint64_t samples, double passes) {
  return {{"name", name},
          {"samples", samples},
          {"errors", 2},
          {"passes", passes},
          {"errors_by_reason", {{"corrupt", 2}}}};
}

nlohmann::json Profile(std::vector<nlohmann::json> stages, std::vector<nlohmann::json> sources,
                       uint64_t corrupt) {
  nlohmann::json p = {{"stages", stages}, {"errors", {{"by_reason", {{"corrupt", corrupt}}}}}};
  if (!sources.empty()) p["sources"] = sources;
  return p;
}

TEST(RunTotalsTest, AReplacedPipelinesCountersAreCarriedItsRingsAreNot) {
  RunTotals t;
  t.Retire(Profile({Stage("image", "image", 100), Stage("ring0", "ring", 7)}, {}, 3));
  const nlohmann::json now =
      Profile({Stage("image", "image", 10), Stage("ring0", "ring", 9)}, {}, 1);
  const auto stages = t.Stages(now);
  EXPECT_EQ(stages.at("image").items, 110);
  EXPECT_EQ(stages.at("image").errors, 2);
  EXPECT_EQ(stages.at("image").busy, 4.0);
  EXPECT_EQ(stages.at("ring0").items, 9) << "a ring counts on by itself";
  EXPECT_EQ(t.Errors(now).at("corrupt"), 4u);
  t.RetireStage("ring0", Stage("ring0", "ring", 9));  // a rank moved to a new ring
  EXPECT_EQ(t.Stages(Profile({Stage("ring0", "ring", 2)}, {}, 0)).at("ring0").items, 11);
}

TEST(RunTotalsTest, SourcesKeepTheirTotalsAndARemovedOneComesLast) {
  RunTotals t;
  t.Retire(Profile({}, {Source("a", 50, 1.0), Source("gone", 20, 0.5)}, 0));
  const auto sources = t.Sources(Profile({}, {Source("b", 5, 0.1), Source("a", 10, 0.2)}, 0));
  ASSERT_EQ(sources.size(), 3u);
  EXPECT_EQ(sources[0].first, "b");
  EXPECT_EQ(sources[0].second.samples, 5u);
  EXPECT_EQ(sources[1].first, "a");
  EXPECT_EQ(sources[1].second.samples, 60u);
  EXPECT_DOUBLE_EQ(sources[1].second.passes, 1.2);
  EXPECT_EQ(sources[1].second.reasons.at("corrupt"), 4u);
  EXPECT_EQ(sources[2].first, "gone") << "a source a reload removed keeps its totals";
  EXPECT_EQ(sources[2].second.samples, 20u);
  // Retired again (another reload): "a" is not counted twice.
  t.Retire(Profile({}, {Source("a", 10, 0.2)}, 0));
  const auto later = t.Sources(Profile({}, {}, 0));
  for (const auto& [name, s] : later) {
    if (name == "a") {
      EXPECT_EQ(s.samples, 60u);
    }
  }
}

}  // namespace
}  // namespace mmfeed
