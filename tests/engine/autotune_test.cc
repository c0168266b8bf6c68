#include "engine/autotune.h"

#include <gtest/gtest.h>

namespace mmfeed {
namespace {

nlohmann::json Stage(const char* name, bool automatic, int workers, int max_workers, double busy,
                     double on_cpu = 0.95) {
  return {{"name", name},
          {"type", name},
          {"auto_workers", automatic},
          {"workers", workers},
          {"max_workers", max_workers},
          {"busy_share", busy},
          {"cpu_share_of_busy", on_cpu},
          {"runnable_share_of_busy", 0.0}};
}

// A report whose diagnosis names `limit` as `kind`.
nlohmann::json Report(std::vector<nlohmann::json> stages, const char* limit,
                      const char* kind = "cpu") {
  return {
      {"stages", stages},
      {"diagnosis", {{"stage", limit ? nlohmann::json(limit) : nlohmann::json()}, {"kind", kind}}}};
}

TEST(AutotuneTest, AFreePlaceInTheBudgetGoesToTheLimitingStage) {
  nlohmann::json r =
      Report({Stage("image", true, 2, 5, 0.97), Stage("text", true, 2, 5, 0.3)}, "image");
  std::optional<WorkerMove> m = ProposeMove(r, 5, 0);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->to, "image");
  EXPECT_EQ(m->from, "");
  EXPECT_NE(m->evidence.find("image busy 97% (95% on CPU) with 2 workers; 1 of cpu_budget 5 free"),
            std::string::npos)
      << m->evidence;
  // No core idles on the machine: another CPU-bound thread would only wait for one, so the
  // worker comes from the other stage instead; an IO-bound stage may still grow.
  r["host"] = {{"idle_cores", 0.1}};
  m = ProposeMove(r, 5, 0);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->from, "text");
  r["diagnosis"]["kind"] = "io";
  m = ProposeMove(r, 5, 0);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->from, "");
  r["diagnosis"]["kind"] = "cpu";
  r.erase("host");
  // Fixed workers count against the budget too.
  m = ProposeMove(r, 5, 1);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->from, "text") << "no free place: taken from the starving auto stage";
  // An IO-bound stage gets workers too; a stage at its thread limit does not.
  EXPECT_TRUE(ProposeMove(Report({Stage("image", true, 2, 5, 0.97, 0.1)}, "image", "io"), 4, 0));
  EXPECT_FALSE(ProposeMove(Report({Stage("image", true, 4, 4, 0.97)}, "image"), 8, 0));
}

TEST(AutotuneTest, NoMoveWithoutASaturatedAutoStageOrADonorThatStaysUnsaturated) {
  // The limit is not a workers: auto stage, or not saturated, or the consumers, or nothing.
  EXPECT_FALSE(ProposeMove(Report({Stage("image", false, 2, 2, 0.97)}, "image"), 4, 2));
  EXPECT_FALSE(ProposeMove(Report({Stage("image", true, 2, 5, 0.8)}, "image"), 4, 0));
  EXPECT_FALSE(ProposeMove(Report({Stage("image", true, 2, 5, 0.97)}, nullptr, "consumer"), 4, 0));
  EXPECT_FALSE(ProposeMove(Report({Stage("image", true, 2, 5, 0.97)}, nullptr, "none"), 4, 0));
  EXPECT_FALSE(ProposeMove(Report({Stage("image", true, 2, 5, 0.97)}, "image", "memory"), 4, 0));
  // Budget in use, and the other stage would be 80% busy with one worker fewer.
  nlohmann::json r =
      Report({Stage("image", true, 2, 3, 0.97), Stage("text", true, 2, 3, 0.4)}, "image");
  EXPECT_FALSE(ProposeMove(r, 4, 0));
  r["stages"][1]["busy_share"] = 0.3;
  EXPECT_TRUE(ProposeMove(r, 4, 0));
  r["stages"][1]["workers"] = 1;  // its last worker is never taken
  r["stages"][1]["busy_share"] = 0.01;
  EXPECT_FALSE(ProposeMove(r, 3, 0));
}

TEST(AutotuneTest, AMoveIsMadeOnlyAfterTwoWindowsAgreeAndTheNextWindowSettles) {
  WorkerTuner t(4, 0);
  nlohmann::json wants =
      Report({Stage("image", true, 2, 3, 0.97), Stage("text", true, 2, 3, 0.1)}, "image");
  nlohmann::json fine =
      Report({Stage("image", true, 2, 3, 0.5), Stage("text", true, 2, 3, 0.1)}, nullptr, "none");
  EXPECT_FALSE(t.Observe(wants));
  EXPECT_FALSE(t.Observe(fine)) << "the streak is broken";
  EXPECT_FALSE(t.Observe(wants));
  std::optional<WorkerMove> m = t.Observe(wants);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->to, "image");
  EXPECT_EQ(m->from, "text");
  EXPECT_FALSE(t.Observe(wants)) << "settling";
  EXPECT_FALSE(t.Observe(wants));
  EXPECT_TRUE(t.Observe(wants));
}

}  // namespace
}  // namespace mmfeed
