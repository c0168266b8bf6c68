#include "engine/window_profile.h"

#include <gtest/gtest.h>

#include <cmath>

namespace mmfeed {
namespace {

TEST(WindowProfileTest, LatencyBucketsAreOrderedAndTheirMiddleIsWithinAnEighth) {
  int last = 0;
  for (double ns = 1100; ns < 1e12; ns *= 1.07) {
    int b = LatencyBucket(static_cast<uint64_t>(ns));
    EXPECT_GE(b, last);
    last = b;
    EXPECT_NEAR(LatencyBucketNs(b) / ns, 1.0, 0.125) << ns;
  }
  EXPECT_EQ(LatencyBucket(0), 0);
  EXPECT_EQ(LatencyBucket(UINT64_MAX), kLatencyBuckets - 1);
}

StageSample Stage(const char* name, const char* type, int workers, double busy_s, double cpu_s,
                  uint64_t items) {
  StageSample s;
  s.name = name;
  s.type = type;
  s.workers = workers;
  s.threads = workers;
  s.queue_capacity = 8;
  s.items = items;
  s.busy_ns = static_cast<uint64_t>(busy_s * 1e9);
  s.cpu_ns = static_cast<uint64_t>(cpu_s * 1e9);
  return s;
}

TEST(WindowProfileTest, TheReportIsTheDifferenceOfTwoSamples) {
  WindowSample a, b;
  a.t_ns = 1'000'000'000;
  b.t_ns = 3'000'000'000;  // a 2 s window
  a.stages = {Stage("image", "image", 2, 10, 9, 1000), Stage("ring0", "ring", 1, 0, 0, 50)};
  b.stages = {Stage("image", "image", 2, 13.6, 12.4, 1400), Stage("ring0", "ring", 1, 0, 0, 75)};
  b.stages[0].latency[LatencyBucket(9'000'000)] = 400;  // 400 items of ~9 ms in the window
  b.stages[0].latency[LatencyBucket(50'000'000)] = 4;
  b.stages[1].blocked_ns = 1'000'000'000;
  ConsumerSample c0;
  c0.attached = true;
  c0.generation = 3;
  c0.wait_ns = 5'000'000'000;
  c0.released = 50;
  c0.slots = 4;
  ConsumerSample c1 = c0;
  c1.wait_ns += 1'500'000'000;
  c1.hold_ns = 400'000'000;
  c1.released = 75;
  a.consumers = {c0};
  b.consumers = {c1};
  nlohmann::json r = BuildWindowReport(a, b);
  EXPECT_DOUBLE_EQ(r["window_s"].get<double>(), 2.0);
  const auto& image = r["stages"][0];
  EXPECT_DOUBLE_EQ(image["items_per_s"].get<double>(), 200);
  EXPECT_NEAR(image["busy_share"].get<double>(), 3.6 / 4, 1e-9);  // 2 workers x 2 s
  EXPECT_NEAR(image["cpu_share_of_busy"].get<double>(), 3.4 / 3.6, 1e-9);
  EXPECT_NEAR(image["latency_ms"]["p50"].get<double>(), 9, 1.2);
  EXPECT_NEAR(image["latency_ms"]["p99"].get<double>(), 9, 1.2);
  EXPECT_TRUE(r["stages"][1]["latency_ms"].is_null()) << "no items timed in the window";
  EXPECT_NEAR(r["stages"][1]["blocked_share"].get<double>(), 0.5, 1e-9);
  const auto& rank = r["consumers"][0];
  EXPECT_NEAR(rank["wait_share"].get<double>(), 0.75, 1e-9);
  EXPECT_NEAR(rank["held_batches"].get<double>(), 0.2, 1e-9);
  EXPECT_NEAR(rank["batches_per_s"].get<double>(), 12.5, 1e-9);
  EXPECT_EQ(r["diagnosis"]["stage"], "image");
  EXPECT_EQ(r["diagnosis"]["kind"], "cpu");

  // A trainer that attached again within the window counts from 0; a pipeline a reload made
  // within it counts from its own start, while the rings (which outlive it) keep counting.
  b.consumers[0].generation = 4;
  b.consumers[0].wait_ns = 100'000'000;
  b.pipeline_id = 1;
  b.stages[0].busy_ns = 1'000'000'000;
  b.stages[0].items = 100;
  r = BuildWindowReport(a, b);
  EXPECT_TRUE(r["pipeline_replaced"].get<bool>());
  EXPECT_NEAR(r["consumers"][0]["wait_share"].get<double>(), 0.05, 1e-9);
  EXPECT_DOUBLE_EQ(r["stages"][0]["items"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(r["stages"][1]["items"].get<double>(), 25);
}

TEST(WindowProfileTest, ANonsenseTrainerCountSpoilsOnlyItsOwnLine) {
  WindowSample a, b;
  b.t_ns = 1'000'000'000;
  ConsumerSample c;
  c.attached = true;
  c.generation = 1;
  c.slots = 4;
  a.consumers = {c};
  c.wait_ns = UINT64_MAX;  // scribbled
  c.hold_ns = UINT64_MAX;
  b.consumers = {c};
  nlohmann::json r = BuildWindowReport(a, b);
  EXPECT_LE(r["consumers"][0]["wait_share"].get<double>(), 1.0);
  EXPECT_LE(r["consumers"][0]["held_batches"].get<double>(), 4.0);
  EXPECT_LE(r["consumers"][0]["hold_share"].get<double>(), 1.0);
}

// A report as BuildWindowReport writes it, with the fields the diagnosis reads.
nlohmann::json Report() {
  return {{"window_s", 2.0},
          {"stages", nlohmann::json::array()},
          {"host",
           {{"cpus", 8},
            {"cpu_cores_used", 2.0},
            {"rss_bytes", 1e9},
            {"rss_growth_bytes_per_s", 0.0},
            {"minor_faults_per_s", 100.0},
            {"major_faults_per_s", 0.0},
            {"thread_faults_per_s", 100.0},
            {"read_bytes_per_s", 1e8},
            {"read_syscalls_per_s", 3000.0},
            {"storage_read_bytes_per_s", 9e7},
            {"mem_available_bytes", 1e10},
            {"pressure", {{"cpu", 0.0}, {"io", 0.3}, {"memory", 0.0}}}}},
          {"consumers", nlohmann::json::array()}};
}

nlohmann::json StageJson(const char* name, const char* type, double busy, double on_cpu,
                         double runnable = 0, double faults = 0) {
  return {{"name", name},
          {"type", type},
          {"workers", 2},
          {"busy_share", busy},
          {"starved_share", 1 - busy},
          {"blocked_share", 0.0},
          {"cpu_share_of_busy", on_cpu},
          {"runnable_share_of_busy", runnable},
          {"queue_fill", 0.9},
          {"minor_faults_per_s", faults},
          {"major_faults_per_s", 0.0}};
}

// The report's consumers: one attached trainer. An array built as such: a one-element braced
// list of a json is an array under GCC but a copy of the element under clang.
nlohmann::json OneTrainer(double wait, double held) {
  return nlohmann::json::array({{{"attached", true},
                                 {"wait_share", wait},
                                 {"held_batches", held},
                                 {"ready_not_taken", 0},
                                 {"taken", 1},
                                 {"slots", 4},
                                 {"batches_per_s", 10.0}}});
}

TEST(WindowProfileTest, ASaturatedStageIsNamedWithTheKindItsTimeShows) {
  nlohmann::json r = Report();
  r["stages"] = {StageJson("source", "manifest", 0.05, 0.5),
                 StageJson("image", "image", 0.97, 0.95), StageJson("batch", "batch", 0.1, 0.9),
                 StageJson("ring0", "ring", 0.01, 1.0)};
  r["consumers"] = OneTrainer(0.8, 0.1);
  nlohmann::json d = Diagnose(r);
  EXPECT_EQ(d["stage"], "image");
  EXPECT_EQ(d["kind"], "cpu");
  EXPECT_NE(d["evidence"].get<std::string>().find("2 workers 97% busy, 95% of it on CPU"),
            std::string::npos)
      << d;
  EXPECT_NE(d["evidence"].get<std::string>().find("the batch stage starved 90%"), std::string::npos)
      << d;
  EXPECT_NE(d["advice"].get<std::string>().find("add image workers (6.0 idle cores)"),
            std::string::npos)
      << d;

  r["host"]["idle_cores"] = 0.3;  // the rest of the machine keeps the other cores busy
  EXPECT_NE(Diagnose(r)["advice"].get<std::string>().find("no idle core"), std::string::npos);
  r["host"].erase("idle_cores");
  r["host"]["cpu_cores_used"] = 7.9;  // nothing idle: the advice changes
  EXPECT_NE(Diagnose(r)["advice"].get<std::string>().find("no idle core"), std::string::npos);

  // Waiting for a CPU is still a CPU limit.
  r["stages"][1] = StageJson("image", "image", 0.97, 0.4, 0.5);
  EXPECT_EQ(Diagnose(r)["kind"], "cpu");
  EXPECT_NE(Diagnose(r)["advice"].get<std::string>().find("waited for a CPU"), std::string::npos);

  // Busy but off CPU: IO, with the read figures as evidence.
  r["stages"][1] = StageJson("image", "image", 0.9, 0.08);
  d = Diagnose(r);
  EXPECT_EQ(d["kind"], "io");
  EXPECT_NE(d["evidence"].get<std::string>().find("100 MB/s read"), std::string::npos) << d;
  EXPECT_NE(d["evidence"].get<std::string>().find("IO pressure 30%"), std::string::npos) << d;

  // ... unless its threads page: memory.
  r["stages"][1]["major_faults_per_s"] = 120.0;
  EXPECT_EQ(Diagnose(r)["kind"], "memory");
  EXPECT_EQ(Diagnose(r)["stage"], "image");
}

// Issue #60: the profile told a CPU-bound image stage to try dct_scaling (already on) and never
// mentioned `cache:`, which gave 10x less data wait in the same run.
TEST(WindowProfileTest, CpuBoundAdviceNamesACacheThatFitsAndOnlySettingsNotInForce) {
  nlohmann::json r = Report();
  nlohmann::json image = StageJson("image", "image", 0.97, 0.95);
  image["tuning"] = {{"cpu_advice", {"dtype: uint8 with the normalization on the GPU"}},
                     {"cache_entry_bytes", 600e3},
                     {"cacheable", true},
                     {"epoch_samples", 2048},
                     {"cache_max_bytes", 0}};
  r["stages"] = {image, StageJson("batch", "batch", 0.1, 0.9)};
  r["consumers"] = OneTrainer(0.8, 0.1);
  r["host"]["idle_cores"] = 0.2;
  std::string advice = Diagnose(r)["advice"].get<std::string>();
  // 2048 samples x 600 kB x 1.05 = 1231 MiB, within half of the 10 GB available.
  EXPECT_NE(advice.find("image: cache: {max_bytes: 1231M} keeps its work for all 2048 samples"),
            std::string::npos)
      << advice;
  EXPECT_NE(advice.find("image: dtype: uint8 with the normalization on the GPU"), std::string::npos)
      << advice;
  EXPECT_EQ(advice.find("dct_scaling"), std::string::npos) << advice;  // the stage did not list it
  // A cache that already holds the epoch: not advised again; one too small: a larger one.
  r["stages"][0]["tuning"]["cache_max_bytes"] = 2e9;
  advice = Diagnose(r)["advice"].get<std::string>();
  EXPECT_EQ(advice.find("cache:"), std::string::npos) << advice;
  r["stages"][0]["tuning"]["cache_max_bytes"] = 500e6;
  advice = Diagnose(r)["advice"].get<std::string>();
  EXPECT_NE(advice.find("a larger cache: {max_bytes: 1231M}"), std::string::npos) << advice;
  // An epoch that does not fit in the memory the daemon could use, or a stage whose work
  // changes every epoch: no cache advised.
  r["stages"][0]["tuning"]["cache_max_bytes"] = 0;
  r["stages"][0]["tuning"]["epoch_samples"] = 100000;
  EXPECT_EQ(Diagnose(r)["advice"].get<std::string>().find("cache:"), std::string::npos);
  r["stages"][0]["tuning"]["epoch_samples"] = 2048;
  r["stages"][0]["tuning"]["cacheable"] = false;
  EXPECT_EQ(Diagnose(r)["advice"].get<std::string>().find("cache:"), std::string::npos);
}

TEST(WindowProfileTest, StarvedTrainersNameAStageThatIsOnlyHalfBusy) {
  nlohmann::json r = Report();
  r["stages"] = {StageJson("image", "image", 0.45, 0.9), StageJson("batch", "batch", 0.1, 0.9)};
  r["consumers"] = OneTrainer(0.6, 0.1);
  EXPECT_EQ(Diagnose(r)["stage"], "image");
  r["consumers"] = OneTrainer(0.04, 0.1);
  EXPECT_EQ(Diagnose(r)["kind"], "none");
  // A stage busy 80% while the trainers barely wait is spare capacity, not the limit.
  r["stages"][0]["busy_share"] = 0.8;
  nlohmann::json d = Diagnose(r);
  EXPECT_EQ(d["kind"], "none");
  EXPECT_NE(d["evidence"].get<std::string>().find("the busiest stage, image, was busy 80%"),
            std::string::npos)
      << d;
  r["consumers"] = OneTrainer(0.06, 0.1);
  EXPECT_EQ(Diagnose(r)["stage"], "image");
}

TEST(WindowProfileTest, AGrowingProcessIsAMemoryProblemOfTheStageThatFaults) {
  nlohmann::json r = Report();
  r["stages"] = {StageJson("image", "image", 0.97, 0.95, 0, 100),
                 StageJson("text", "text", 0.3, 0.9, 0, 30000)};
  r["host"]["rss_growth_bytes_per_s"] = 40e6;
  r["host"]["thread_faults_per_s"] = 30500.0;
  nlohmann::json d = Diagnose(r);
  EXPECT_EQ(d["kind"], "memory");
  EXPECT_EQ(d["stage"], "text");
  EXPECT_NE(d["evidence"].get<std::string>().find("RSS grows 40 MB/s"), std::string::npos) << d;
  EXPECT_NE(d["advice"].get<std::string>().find("last 250s"), std::string::npos) << d;
  // Growth that does not add up to much within the window is not yet a problem.
  r["window_s"] = 0.5;
  EXPECT_EQ(Diagnose(r)["kind"], "cpu");
  // Paging is, whoever faults: no single stage is named.
  r["host"]["major_faults_per_s"] = 500.0;
  r["stages"][1]["minor_faults_per_s"] = 0.0;
  d = Diagnose(r);
  EXPECT_EQ(d["kind"], "memory");
  EXPECT_TRUE(d["stage"].is_null()) << d;
}

TEST(WindowProfileTest, TrainersHoldingFullRingsAreTheLimitAndIdleIsNone) {
  nlohmann::json r = Report();
  nlohmann::json ring = StageJson("ring0", "ring", 0.01, 1.0);
  ring["blocked_share"] = 0.95;
  r["stages"] = {StageJson("image", "image", 0.2, 0.95), ring};
  r["consumers"] = OneTrainer(0.0, 0.9);
  nlohmann::json d = Diagnose(r);
  EXPECT_EQ(d["kind"], "consumer");
  EXPECT_TRUE(d["stage"].is_null());
  // The mean number of batches held, not a share of the time (issue #60: "trainers hold batches
  // 107% of the time").
  EXPECT_NE(d["evidence"].get<std::string>().find("each trainer holds 0.90 batches on average"),
            std::string::npos)
      << d;
  // Trainers holding batches and never waiting set the pace even while the rings are not full.
  r["stages"][1]["blocked_share"] = 0.2;
  EXPECT_EQ(Diagnose(r)["kind"], "consumer");
  r["consumers"] = OneTrainer(0.3, 0.9);  // ... but not if they also wait for data
  EXPECT_NE(Diagnose(r)["kind"], "consumer");
  r["stages"][1]["blocked_share"] = 0.95;
  // Full rings, trainers that take and release at once: spare capacity, no alarm.
  r["consumers"] = OneTrainer(0.0, 0.02);
  EXPECT_EQ(Diagnose(r)["kind"], "none");
  // No trainer at all.
  r["consumers"] = nlohmann::json::array();
  d = Diagnose(r);
  EXPECT_EQ(d["kind"], "none");
  EXPECT_NE(d["evidence"].get<std::string>().find("no trainer is attached"), std::string::npos);
}

TEST(WindowProfileTest, TheHostSampleReadsThisProcess) {
  HostSample h = SampleHost({});
  EXPECT_GT(h.cpu_ns, 0u);
  EXPECT_GT(h.rss_bytes, 0u);
  EXPECT_GE(h.rss_bytes, h.rss_anon_bytes);
  EXPECT_GT(h.mem_available_bytes, 0u);
  EXPECT_GE(h.cpus, 1);
  ASSERT_FALSE(h.threads.empty());
  EXPECT_GT(h.threads[0].cpu_ns, 0u);
  EXPECT_FALSE(h.threads[0].name.empty());
}

}  // namespace
}  // namespace mmfeed
