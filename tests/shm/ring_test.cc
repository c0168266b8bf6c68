#include "shm/ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

namespace mmfeed::shm {
namespace {

// Writes a batch of `n` int32 values all equal to `seq`, with ids "b<seq>-<i>", into a
// claimed slot, and commits it.
Status WriteBatch(RingWriter& w, int slot, uint64_t seq, int n = 1000) {
  int32_t* values = reinterpret_cast<int32_t*>(w.slot_data(slot) + w.layout().tensor_offsets[0]);
  for (int i = 0; i < n && static_cast<uint64_t>(i) * 4 < w.layout().tensor_capacity[0]; ++i) values[i] = static_cast<int32_t>(seq);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back("b" + std::to_string(seq) + "-" + std::to_string(i));
  BatchView view;
  view.seq = seq;
  view.epoch = static_cast<uint32_t>(seq / 10);
  for (auto& s : ids) view.ids.push_back(s);
  view.tensors.push_back({"values", 2, {n}, nullptr, static_cast<uint64_t>(n) * 4});
  return w.Commit(slot, view);
}

std::unique_ptr<RingWriter> MakeRing(uint32_t slots) {
  auto w = RingWriter::Create(0, 1, slots, PlanSlot(64, {4000}));
  EXPECT_TRUE(w.ok()) << w.status().message();
  return std::move(w.value());
}

std::unique_ptr<RingReader> MapReader(const RingWriter& w) {
  auto r = RingReader::Map(dup(w.fd()));
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::move(r.value());
}

void Publish(RingWriter& w, uint64_t seq) {
  int slot = w.AcquireFree(1000);
  ASSERT_GE(slot, 0);
  ASSERT_TRUE(WriteBatch(w, slot, seq).ok());
}

void ExpectBatch(const BatchView& v, uint64_t seq) {
  EXPECT_EQ(v.seq, seq);
  ASSERT_EQ(v.ids.size(), 3u);
  EXPECT_EQ(v.ids[2], "b" + std::to_string(seq) + "-2");
  ASSERT_EQ(v.tensors.size(), 1u);
  EXPECT_EQ(v.tensors[0].name, "values");
  EXPECT_EQ(v.tensors[0].shape, std::vector<int64_t>{1000});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.tensors[0].data) % 4096, 0u);
  const int32_t* d = reinterpret_cast<const int32_t*>(v.tensors[0].data);
  EXPECT_EQ(d[0], static_cast<int32_t>(seq));
  EXPECT_EQ(d[999], static_cast<int32_t>(seq));
}

TEST(RingTest, SealedMemfdCannotBeResized) {
  auto w = MakeRing(2);
  EXPECT_NE(ftruncate(w->fd(), 4096), 0);
  EXPECT_NE(ftruncate(w->fd(), static_cast<off_t>(w->size() * 2)), 0);
  EXPECT_EQ(fcntl(w->fd(), F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
}

TEST(RingTest, WrapsAroundManyTimesInOrder) {
  auto w = MakeRing(3);
  auto r = MapReader(*w);
  for (uint64_t seq = 0; seq < 50; ++seq) {
    Publish(*w, seq);
    int slot;
    BatchView v;
    auto got = r->Acquire(100, &slot, &v);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(*got, RingReader::Wait::kGot);
    ExpectBatch(v, seq);
    r->Release(slot);
  }
  EXPECT_EQ(w->published(), 50u);
  EXPECT_EQ(w->released(), 50u);
}

TEST(RingTest, FullRingMakesTheWriterWaitAndOutOfOrderReleaseKeepsOrder) {
  auto w = MakeRing(3);
  auto r = MapReader(*w);
  for (uint64_t seq = 0; seq < 3; ++seq) Publish(*w, seq);
  EXPECT_EQ(w->AcquireFree(50), -1) << "no free slot until a release";
  int s0, s1;
  BatchView v0, v1;
  ASSERT_EQ(*r->Acquire(100, &s0, &v0), RingReader::Wait::kGot);
  ASSERT_EQ(*r->Acquire(100, &s1, &v1), RingReader::Wait::kGot);
  ExpectBatch(v0, 0);
  ExpectBatch(v1, 1);
  r->Release(s1);  // release 1 before 0
  Publish(*w, 3);
  int s2;
  BatchView v2;
  ASSERT_EQ(*r->Acquire(100, &s2, &v2), RingReader::Wait::kGot);
  ExpectBatch(v2, 2);
  r->Release(s0);
  r->Release(s2);
  ASSERT_EQ(*r->Acquire(100, &s2, &v2), RingReader::Wait::kGot);
  ExpectBatch(v2, 3);
  r->Release(s2);
  w->Close();
  EXPECT_EQ(*r->Acquire(100, &s2, &v2), RingReader::Wait::kEnd);
  EXPECT_TRUE(w->Drained());
}

TEST(RingTest, ReaderRejectsABadHeader) {
  auto w = MakeRing(2);
  int fd = dup(w->fd());
  uint32_t bad = 99;
  ASSERT_EQ(pwrite(fd, &bad, 4, 8), 4);  // layout_version
  auto r = RingReader::Map(fd);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layout version 99"), std::string::npos);
}

// Two real processes: the child reads 200 batches through a 4-slot ring while the parent
// writes them, blocking on the futex whenever the ring is full.
TEST(RingTest, TwoProcessesHandOffEveryBatch) {
  auto w = MakeRing(4);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto r = RingReader::Map(dup(w->fd()));
    if (!r.ok()) _exit(10);
    for (uint64_t seq = 0;; ++seq) {
      int slot;
      BatchView v;
      auto got = (*r)->Acquire(5000, &slot, &v);
      if (!got.ok()) _exit(11);
      if (*got == RingReader::Wait::kEnd) _exit(seq == 200 ? 0 : 12);
      if (*got != RingReader::Wait::kGot || v.seq != seq) _exit(13);
      const int32_t* d = reinterpret_cast<const int32_t*>(v.tensors[0].data);
      if (d[0] != static_cast<int32_t>(seq) || d[999] != static_cast<int32_t>(seq)) _exit(14);
      if (seq % 7 == 0) usleep(2000);
      (*r)->Release(slot);
    }
  }
  for (uint64_t seq = 0; seq < 200; ++seq) {
    int slot;
    while ((slot = w->AcquireFree(1000)) < 0) {
    }
    ASSERT_TRUE(WriteBatch(*w, slot, seq).ok());
  }
  w->Close();
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(w->released(), 200u);
  EXPECT_TRUE(w->Drained());
}

// A reader process dies holding a batch: Reclaim hands it to the next reader, first.
TEST(RingTest, BatchesHeldByADeadReaderAreDeliveredAgain) {
  auto w = MakeRing(4);
  for (uint64_t seq = 0; seq < 4; ++seq) Publish(*w, seq);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto r = RingReader::Map(dup(w->fd()));
    int slot;
    BatchView v;
    (*r)->Acquire(1000, &slot, &v);
    (*r)->Release(slot);           // batch 0 acknowledged
    (*r)->Acquire(1000, &slot, &v);  // batch 1 taken, never released
    (*r)->Acquire(1000, &slot, &v);  // batch 2 too
    _exit(0);
  }
  int status;
  waitpid(child, &status, 0);
  EXPECT_EQ(w->Reclaim(), 2);
  auto r = MapReader(*w);
  for (uint64_t seq = 1; seq < 4; ++seq) {
    int slot;
    BatchView v;
    ASSERT_EQ(*r->Acquire(100, &slot, &v), RingReader::Wait::kGot);
    ExpectBatch(v, seq);
    r->Release(slot);
  }
}

TEST(RingTest, BatchLargerThanPlannedIsRefusedAndAbandonFreesTheSlot) {
  auto w = MakeRing(2);
  int slot = w->AcquireFree(100);
  EXPECT_EQ(WriteBatch(*w, slot, 0, 5000).code(), Status::Code::kTooLarge);
  EXPECT_EQ(w->published(), 0u);
  int other = w->AcquireFree(100);
  EXPECT_GE(other, 0);
  EXPECT_EQ(w->AcquireFree(50), -1) << "both slots claimed";
  w->Abandon(slot);
  EXPECT_EQ(w->AcquireFree(100), slot) << "the slot is free again";
}

TEST(RingTest, LayoutIsPageAlignedAfterTheIds) {
  SlotLayout l = PlanSlot(32 * 256, {602112, 16384, 128});
  ASSERT_EQ(l.tensor_offsets.size(), 3u);
  EXPECT_EQ(l.tensor_offsets[0] % kPageBytes, 0u);
  EXPECT_GE(l.tensor_offsets[0], sizeof(SlotDescriptor) + 32 * 256);
  EXPECT_EQ(l.tensor_offsets[1], l.tensor_offsets[0] + 602112);
  EXPECT_EQ(l.tensor_offsets[2], l.tensor_offsets[1] + 16384);
  EXPECT_EQ(l.slot_bytes, l.tensor_offsets[2] + kPageBytes);
}

}  // namespace
}  // namespace mmfeed::shm
