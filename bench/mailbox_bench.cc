// Mailbox micro-benchmark: items per second through engine/mailbox.h's Mailbox (a stage's
// inbox: several producers, several poppers) and BulkMailbox (the join: several producers, one
// consumer woken in bulk), with the blocking a real pipeline sees (capacity 64). Items are
// plain nonzero integers, so the queue itself is measured, not an allocator.
// usage: mailbox_bench [--items N] [--rounds R]   (bench/mailbox_bench.sh runs it side by side
// with a baseline revision's mailbox.h)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "engine/mailbox.h"

namespace {

using mmfeed::NowNs;

// Mailbox: `producers` threads push items/producers each, `poppers` threads pop until closed.
double MailboxRate(int producers, int poppers, uint64_t items) {
  mmfeed::Mailbox<uint64_t> box(64);
  std::atomic<uint64_t> blocked{0}, starved{0}, popped{0};
  const uint64_t t0 = NowNs();
  std::vector<std::thread> threads;
  for (int c = 0; c < poppers; ++c)
    threads.emplace_back([&] {
      uint64_t n = 0;
      while (box.Pop(&starved)) ++n;
      popped += n;
    });
  std::vector<std::thread> pushers;
  for (int p = 0; p < producers; ++p)
    pushers.emplace_back([&] {
      for (uint64_t i = 1; i <= items / producers; ++i) box.Push(i, &blocked);
    });
  for (auto& t : pushers) t.join();
  box.Close(poppers);
  for (auto& t : threads) t.join();
  return popped.load() / ((NowNs() - t0) / 1e9);
}

// BulkMailbox: `producers` threads push, one consumer pops (woken every 32 items).
double BulkRate(int producers, uint64_t items) {
  mmfeed::BulkMailbox<uint64_t> box(64, 32);
  std::atomic<uint64_t> blocked{0}, starved{0};
  uint64_t popped = 0;
  const uint64_t t0 = NowNs();
  std::thread consumer([&] {
    while (box.Pop(&starved)) ++popped;
  });
  std::vector<std::thread> pushers;
  for (int p = 0; p < producers; ++p)
    pushers.emplace_back([&] {
      for (uint64_t i = 1; i <= items / producers; ++i) box.Push(i, false, &blocked);
    });
  for (auto& t : pushers) t.join();
  box.Close();
  consumer.join();
  return popped / ((NowNs() - t0) / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t items = 2000000;
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--items")) items = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  }
  struct Case {
    const char* name;
    int producers, poppers;  // poppers 0: BulkMailbox
  };
  const Case cases[] = {
      {"mailbox 1->1", 1, 1}, {"mailbox 1->2", 1, 2}, {"mailbox 2->2", 2, 2}, {"bulk 2->1", 2, 0}};
  for (const Case& c : cases) {
    double best = 0;
    for (int r = 0; r < rounds; ++r) {
      double rate =
          c.poppers ? MailboxRate(c.producers, c.poppers, items) : BulkRate(c.producers, items);
      if (rate > best) best = rate;
    }
    std::printf("%s %.0f\n", c.name, best);
  }
  return 0;
}
