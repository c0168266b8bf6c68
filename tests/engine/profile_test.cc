#include "engine/profile.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <chrono>
#include <thread>

namespace mmfeed {
namespace {

// Counters for one stage that was busy for `busy` of a 1-second run.
struct Fake {
  StageCounters c;
  Fake(double busy, double cpu, double runnable) {
    c.items = 10;
    c.busy_ns = static_cast<uint64_t>(busy * 1e9);
    c.cpu_ns = static_cast<uint64_t>(cpu * 1e9);
    c.runnable_ns = static_cast<uint64_t>(runnable * 1e9);
  }
};

nlohmann::json Bottleneck(const Fake& image, const char* type = "image") {
  Fake text(0.1, 0.1, 0);
  std::vector<StageInfo> stages = {{"image", type, 1, 8, &image.c, {}},
                                   {"text", "text", 1, 8, &text.c, {}}};
  return BuildProfile(stages, 1.0)["bottleneck"];
}

TEST(ProfileTest, TheBusiestStageIsTheBottleneckAndItsKindComesFromWhereItsTimeWent) {
  EXPECT_EQ(Bottleneck(Fake(0.9, 0.85, 0))["kind"], "cpu");
  EXPECT_EQ(Bottleneck(Fake(0.9, 0.2, 0))["kind"], "io");
  // Waiting for a CPU is a CPU limit (more threads than cores), not IO.
  nlohmann::json b = Bottleneck(Fake(0.9, 0.45, 0.4));
  EXPECT_EQ(b["stage"], "image");
  EXPECT_EQ(b["kind"], "cpu");
  EXPECT_NE(b["why"].get<std::string>().find("44% waiting for a CPU"), std::string::npos)
      << b["why"];
  EXPECT_EQ(Bottleneck(Fake(0.9, 0.9, 0), "batch")["kind"], "memory");
}

TEST(ProfileTest, ARingBlockedMoreThanHalfTheTimeNamesTheTrainers) {
  Fake image(0.5, 0.5, 0), ring(0.01, 0.01, 0);
  ring.c.blocked_ns = 700000000;
  std::vector<StageInfo> stages = {{"image", "image", 1, 8, &image.c, {}},
                                   {"ring0", "ring", 1, 0, &ring.c, {}}};
  nlohmann::json b = BuildProfile(stages, 1.0)["bottleneck"];
  EXPECT_EQ(b["stage"], "ring0");
  EXPECT_EQ(b["kind"], "transfer");
}

// Two threads spinning on one CPU each wait about half the time for it: WorkTimer must see that
// wait (from /proc/thread-self/schedstat), or an oversubscribed CPU-bound stage looks like IO.
TEST(ProfileTest, WorkTimerSeesTheTimeAThreadWaitsForACpu) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &allowed)) ++cpu;
  StageCounters counters;
  auto spin = [&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    WorkTimer timer;
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
    while (std::chrono::steady_clock::now() < end) {
    }
    timer.AddTo(&counters);
  };
  std::thread a(spin), b(spin);
  a.join();
  b.join();
  double busy = counters.busy_ns.load(), cpu_ns = counters.cpu_ns.load(),
         runnable = counters.runnable_ns.load();
  EXPECT_GT(runnable / busy, 0.15) << "cpu " << cpu_ns / busy << " runnable " << runnable / busy;
  EXPECT_GT((cpu_ns + runnable) / busy, 0.8) << "cpu " << cpu_ns / busy;
  EXPECT_LT((cpu_ns + runnable) / busy, 1.02)
      << "cpu " << cpu_ns / busy << " runnable " << runnable / busy;
}

}  // namespace
}  // namespace mmfeed
