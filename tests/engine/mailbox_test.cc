#include "engine/mailbox.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>

namespace mmfeed {
namespace {

TEST(MailboxTest, PushBlocksWhenFullUntilAPop) {
  Mailbox<std::unique_ptr<int>> box(2);
  std::atomic<uint64_t> blocked{0}, starved{0};
  box.Push(std::make_unique<int>(1), &blocked);
  box.Push(std::make_unique<int>(2), &blocked);
  EXPECT_EQ(blocked.load(), 0u);
  std::atomic<bool> third_in{false};
  std::thread producer([&] {
    box.Push(std::make_unique<int>(3), &blocked);
    third_in = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(third_in.load()) << "push must wait while the mailbox is full";
  EXPECT_EQ(*box.Pop(&starved), 1);
  producer.join();
  EXPECT_TRUE(third_in.load());
  EXPECT_GE(blocked.load(), 50'000'000u) << "the wait is counted as blocked time";
  // Order is kept per producer only (moodycamel has a sub-queue per producer).
  int a = *box.Pop(&starved), b = *box.Pop(&starved);
  EXPECT_EQ(a + b, 5);
  EXPECT_NE(a, b);
}

TEST(MailboxTest, CloseWakesEveryPopperWithAnEmptyItem) {
  Mailbox<std::unique_ptr<int>> box(4);
  std::atomic<uint64_t> starved{0};
  std::atomic<int> ended{0};
  std::vector<std::thread> poppers;
  for (int i = 0; i < 3; ++i)
    poppers.emplace_back([&] {
      if (!box.Pop(&starved)) ++ended;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  box.Close(3);
  for (auto& t : poppers) t.join();
  EXPECT_EQ(ended.load(), 3);
  EXPECT_GT(starved.load(), 0u);
}

// Items queued by a thread that has finished, and a Close from another thread: the consumer
// must get every item before the end (the queue orders per producer only).
TEST(MailboxTest, CloseNeverOvertakesAnotherProducersItems) {
  for (int round = 0; round < 200; ++round) {
    Mailbox<std::unique_ptr<int>> box(4);
    std::atomic<uint64_t> t{0};
    std::thread([&] {
      box.Push(std::make_unique<int>(1), &t);
      box.Push(std::make_unique<int>(2), &t);
    }).join();
    box.Close(1);
    int sum = 0;
    while (auto v = box.Pop(&t)) sum += *v;
    ASSERT_EQ(sum, 3) << "round " << round;
  }
}

TEST(MailboxTest, ManyProducersManyConsumersLoseNothing) {
  Mailbox<std::unique_ptr<int>> box(8);
  std::atomic<uint64_t> t{0};
  std::atomic<long> sum{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < 3; ++p)
    threads.emplace_back([&, p] {
      for (int i = 1; i <= 1000; ++i) box.Push(std::make_unique<int>(i), &t);
    });
  for (int c = 0; c < 2; ++c)
    threads.emplace_back([&] {
      while (auto v = box.Pop(&t)) sum += *v;
    });
  for (int p = 0; p < 3; ++p) threads[p].join();
  box.Close(2);
  threads[3].join();
  threads[4].join();
  EXPECT_EQ(sum.load(), 3L * 1000 * 1001 / 2);
}

// The bulk mailbox's consumer sleeps through pushes below its wake-up count, yet gets every
// item: the rest within its look-again interval, an urgent one at once, all before the end.
TEST(BulkMailboxTest, ManyProducersOneSleepyConsumerLoseNothing) {
  BulkMailbox<std::unique_ptr<int>> box(16, 8);
  std::atomic<uint64_t> t{0};
  long sum = 0;
  std::vector<std::thread> producers;
  for (int p = 0; p < 3; ++p)
    producers.emplace_back([&, p] {
      for (int i = 1; i <= 1000; ++i) {
        box.Push(std::make_unique<int>(i), i % 97 == 0, &t);
        if (i % 250 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(7));
      }
    });
  std::thread consumer([&] {
    while (auto v = box.Pop(&t)) sum += *v;
  });
  for (auto& p : producers) p.join();
  box.Close();
  consumer.join();
  EXPECT_EQ(sum, 3L * 1000 * 1001 / 2);
}

TEST(BulkMailboxTest, ATrickleBelowTheWakeUpCountStillArrives) {
  BulkMailbox<std::unique_ptr<int>> box(64, 32);
  std::atomic<uint64_t> t{0};
  box.Push(std::make_unique<int>(7), false, &t);
  EXPECT_EQ(*box.Pop(&t), 7);  // already waiting: no sleep
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    box.Push(std::make_unique<int>(8), false, &t);  // one item, far below 32: no wake-up
  });
  EXPECT_EQ(*box.Pop(&t), 8) << "found when the consumer looks again";
  late.join();
  box.Close();
  EXPECT_EQ(box.Pop(&t), nullptr);
}

}  // namespace
}  // namespace mmfeed
