#include "shm/ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
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
  for (int i = 0; i < n && static_cast<uint64_t>(i) * 4 < w.layout().tensor_capacity[0]; ++i)
    values[i] = static_cast<int32_t>(seq);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back("b" + std::to_string(seq) + "-" + std::to_string(i));
  BatchView view;
  view.seq = seq;
  view.epoch = static_cast<uint32_t>(seq / 10);
  for (auto& s : ids) view.ids.push_back(s);
  view.tensors.push_back({"values", 2, {n}, nullptr, static_cast<uint64_t>(n) * 4});
  view.next.seq = seq + 1;
  view.next.position = 7 * seq + 3;  // a token-budget order's position (next_position)
  return w.Commit(slot, view);
}

std::unique_ptr<RingWriter> MakeRing(uint32_t slots) {
  auto w = RingWriter::Create(0, 1, slots, PlanSlot(64, {4000}));
  EXPECT_TRUE(w.ok()) << w.status().message();
  return std::move(w.value());
}

// Attaches a reader of a new generation, as the daemon does for a trainer (of `member`, for a
// ring read by replicas).
std::unique_ptr<RingReader> Attach(RingWriter& w, uint32_t generation, uint32_t member = 0) {
  Result<int> control = w.Attach(generation, member);
  EXPECT_TRUE(control.ok()) << control.status().message();
  auto r = RingReader::Map(dup(w.data_fd()), dup(*control));
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
  EXPECT_EQ(v.next.seq, seq + 1);
  EXPECT_EQ(v.next.position, 7 * seq + 3);
}

BatchView Take(RingReader& r, int* slot) {
  BatchView v;
  auto got = r.Acquire(100, slot, &v);
  EXPECT_TRUE(got.ok() && *got == RingReader::Wait::kGot);
  return v;
}

TEST(RingTest, DataAreaCannotBeResizedNorMappedWritableByAReader) {
  auto w = MakeRing(2);
  const int ro = w->data_fd();
  EXPECT_NE(ftruncate(ro, 4096), 0);
  EXPECT_EQ(mmap(nullptr, w->size(), PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0), MAP_FAILED);
  // Reopening the memfd read-write through /proc does not help: it is sealed against new
  // writable mappings and writes.
  int rw = open(("/proc/self/fd/" + std::to_string(ro)).c_str(), O_RDWR);
  if (rw >= 0) {
    EXPECT_EQ(mmap(nullptr, w->size(), PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0), MAP_FAILED);
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(pwrite(rw, "x", 1, 0), -1);
    EXPECT_NE(ftruncate(rw, static_cast<off_t>(w->size() * 2)), 0);
    close(rw);
  }
  auto r = Attach(*w, 1);
  // The reader's own read-only mapping cannot be made writable either.
  void* p = mmap(nullptr, w->size(), PROT_READ, MAP_SHARED, ro, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_NE(mprotect(p, 4096, PROT_READ | PROT_WRITE), 0);
  munmap(p, w->size());
}

TEST(RingTest, WrapsAroundManyTimesInOrder) {
  auto w = MakeRing(3);
  auto r = Attach(*w, 1);
  for (uint64_t seq = 0; seq < 50; ++seq) {
    Publish(*w, seq);
    int slot;
    ExpectBatch(Take(*r, &slot), seq);
    ASSERT_TRUE(r->Release(slot).ok());
  }
  EXPECT_EQ(w->published(), 50u);
  EXPECT_EQ(w->released(), 50u);
}

// What the Python client hands to torch: writes into a batch land in private pages, are seen as
// written, and are gone when the slot comes back with its next batch.
TEST(RingTest, WritesIntoTheCopyOnWriteViewStayPrivateAndGoWithTheRelease) {
  auto w = MakeRing(2);
  auto r = Attach(*w, 1);
  Result<uint8_t*> cow = r->CopyOnWriteView();
  ASSERT_TRUE(cow.ok()) << cow.status().message();
  for (uint64_t seq = 0; seq < 20; ++seq) {
    Publish(*w, seq);
    int slot;
    BatchView v = Take(*r, &slot);
    ExpectBatch(v, seq);
    auto* mine = reinterpret_cast<int32_t*>(*cow + (v.tensors[0].data - r->data()));
    // Every batch, including those in a slot written before, reads the daemon's bytes.
    ASSERT_EQ(mine[0], static_cast<int32_t>(seq));
    ASSERT_EQ(mine[999], static_cast<int32_t>(seq));
    Result<bool> written = r->Written(mine, 4000);
    ASSERT_TRUE(written.ok() && !*written);
    if (seq % 3 != 2) {
      mine[500] = -1;  // a write in the middle page of the tensor
      written = r->Written(mine, 4000);
      ASSERT_TRUE(written.ok() && *written);
      EXPECT_TRUE(*r->Written(mine + 500, 4));
      EXPECT_FALSE(*r->Written(mine + 1100, 8));  // the next page was not written
      // The ring is unchanged: the shared mapping still has the daemon's value.
      EXPECT_EQ(reinterpret_cast<const int32_t*>(v.tensors[0].data)[500],
                static_cast<int32_t>(seq));
    }
    ASSERT_TRUE(r->Release(slot).ok());
  }
  EXPECT_FALSE(r->Written(*cow - 1, 4).ok());  // outside the view
}

TEST(RingTest, TheReaderAccountsItsWaitAndHoldTimesInItsControlArea) {
  auto w = MakeRing(3);
  auto r = Attach(*w, 7);
  int slot;
  BatchView v;
  EXPECT_EQ(*r->Acquire(60, &slot, &v), RingReader::Wait::kTimeout);
  RingWriter::Backlog b = w->backlog();
  EXPECT_EQ(b.generation, 7u);
  EXPECT_GE(b.wait_ns, 50'000'000u) << "the empty wait is the trainer's data stall";
  EXPECT_EQ(b.hold_ns, 0u);
  Publish(*w, 0);
  ExpectBatch(Take(*r, &slot), 0);
  EXPECT_EQ(w->backlog().taken, 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  ASSERT_TRUE(r->Release(slot).ok());
  b = w->backlog();
  EXPECT_GE(b.hold_ns, 35'000'000u);
  EXPECT_LT(b.hold_ns, 5'000'000'000u);
  EXPECT_EQ(b.taken, 0u);
  // A new attach has a fresh control area: its counts start at 0.
  r.reset();
  w->Detach();
  auto r2 = Attach(*w, 8);
  b = w->backlog();
  EXPECT_EQ(b.generation, 8u);
  EXPECT_EQ(b.wait_ns, 0u);
  EXPECT_EQ(b.hold_ns, 0u);
}

TEST(RingTest, FullRingMakesTheWriterWaitAndOutOfOrderReleaseKeepsOrder) {
  auto w = MakeRing(3);
  auto r = Attach(*w, 1);
  for (uint64_t seq = 0; seq < 3; ++seq) Publish(*w, seq);
  EXPECT_EQ(w->AcquireFree(50), -1) << "no free slot until a release";
  int s0, s1, s2;
  ExpectBatch(Take(*r, &s0), 0);
  ExpectBatch(Take(*r, &s1), 1);
  ASSERT_TRUE(r->Release(s1).ok());  // release 1 before 0
  Publish(*w, 3);
  ExpectBatch(Take(*r, &s2), 2);
  ASSERT_TRUE(r->Release(s0).ok());
  ASSERT_TRUE(r->Release(s2).ok());
  ExpectBatch(Take(*r, &s2), 3);
  ASSERT_TRUE(r->Release(s2).ok());
  w->Close(true);
  BatchView v;
  EXPECT_EQ(*r->Acquire(100, &s2, &v), RingReader::Wait::kEnd);
  EXPECT_FALSE(r->stopped_early());
  EXPECT_TRUE(w->Drained());
}

TEST(RingTest, ReaderRejectsABadHeader) {
  auto w = MakeRing(2);
  Result<int> control = w->Attach(1);
  ASSERT_TRUE(control.ok());
  // A copy of the data area with a damaged header.
  std::string bytes(w->size(), '\0');
  ASSERT_EQ(pread(w->data_fd(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  uint32_t bad = 99;
  std::memcpy(bytes.data() + 8, &bad, 4);  // layout_version
  int fd = memfd_create("bad-ring", MFD_CLOEXEC);
  ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  auto r = RingReader::Map(fd, dup(*control));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layout version 99"), std::string::npos);
}

TEST(RingTest, ReaderChecksDtypeAndShapeAgainstBytes) {
  auto w = MakeRing(2);
  auto r = Attach(*w, 1);
  int slot = w->AcquireFree(100);
  BatchView view;
  view.tensors.push_back({"values", 3, {10, 10}, nullptr, 396});  // 100 float32 are 400 bytes
  ASSERT_TRUE(w->Commit(slot, view).ok());
  int got;
  BatchView v;
  auto st = r->Acquire(100, &got, &v);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("shape x element size"), std::string::npos)
      << st.status().message();
  slot = w->AcquireFree(100);
  view.seq = 1;  // the next batch (the reader has taken batch 0)
  view.tensors[0] = {"values", 9, {4}, nullptr, 16};
  ASSERT_TRUE(w->Commit(slot, view).ok());
  st = r->Acquire(100, &got, &v);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("unknown dtype 9"), std::string::npos)
      << st.status().message();
}

// Two real processes: the child reads 200 batches through a 4-slot ring while the parent
// writes them.
TEST(RingTest, TwoProcessesHandOffEveryBatch) {
  auto w = MakeRing(4);
  Result<int> control = w->Attach(1);
  ASSERT_TRUE(control.ok());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto r = RingReader::Map(dup(w->data_fd()), dup(*control));
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
      if (!(*r)->Release(slot).ok()) _exit(15);
    }
  }
  for (uint64_t seq = 0; seq < 200; ++seq) {
    int slot;
    while ((slot = w->AcquireFree(1000)) < 0) {
    }
    ASSERT_TRUE(WriteBatch(*w, slot, seq).ok());
  }
  w->Close(true);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(w->released(), 200u);
  EXPECT_TRUE(w->Drained());
}

// A reader process dies holding batches: the next attach gets them first.
TEST(RingTest, BatchesHeldByADeadReaderAreDeliveredAgain) {
  auto w = MakeRing(4);
  for (uint64_t seq = 0; seq < 4; ++seq) Publish(*w, seq);
  Result<int> control = w->Attach(1);
  ASSERT_TRUE(control.ok());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto r = RingReader::Map(dup(w->data_fd()), dup(*control));
    int slot;
    BatchView v;
    (void)(*r)->Acquire(1000, &slot, &v);
    (void)(*r)->Release(slot);             // batch 0 acknowledged
    (void)(*r)->Acquire(1000, &slot, &v);  // batch 1 taken, never released
    (void)(*r)->Acquire(1000, &slot, &v);  // batch 2 too
    _exit(0);
  }
  int status;
  waitpid(child, &status, 0);
  EXPECT_EQ(w->released(), 1u);
  EXPECT_EQ(w->Detach(), 2);
  auto r = Attach(*w, 2);
  for (uint64_t seq = 1; seq < 4; ++seq) {
    int slot;
    ExpectBatch(Take(*r, &slot), seq);
    ASSERT_TRUE(r->Release(slot).ok());
  }
}

TEST(RingTest, ForeignAndDoubleReleasesAreRefused) {
  auto w = MakeRing(3);
  auto r = Attach(*w, 1);
  Publish(*w, 0);
  Publish(*w, 1);
  int slot;
  ExpectBatch(Take(*r, &slot), 0);
  int other = -1;
  for (int i = 0; i < 3; ++i)
    if (i != slot) other = i;
  EXPECT_FALSE(r->Release(other).ok()) << "a slot this reader does not hold";
  EXPECT_FALSE(r->Release(7).ok()) << "out of range";
  ASSERT_TRUE(r->Release(slot).ok());
  EXPECT_FALSE(r->Release(slot).ok()) << "released twice";
  EXPECT_EQ(w->released(), 1u);
}

// After a takeover, the old reader's late release touches only its old control area: the
// batch it held now belongs to the new reader, and stays held.
TEST(RingTest, AStaleReleaseAfterATakeoverFreesNothing) {
  auto w = MakeRing(2);
  auto old_reader = Attach(*w, 1);
  Publish(*w, 0);
  Publish(*w, 1);
  int old_slot;
  ExpectBatch(Take(*old_reader, &old_slot), 0);
  EXPECT_EQ(w->Detach(), 1);
  auto r = Attach(*w, 2);
  int slot;
  ExpectBatch(Take(*r, &slot), 0);  // delivered again
  EXPECT_EQ(slot, old_slot);
  (void)old_reader->Release(old_slot);
  EXPECT_EQ(w->released(), 0u);
  EXPECT_EQ(w->AcquireFree(20), -1) << "the new reader still holds batch 0 and batch 1 is ready";
  EXPECT_TRUE(w->TakeViolation().empty());
  ASSERT_TRUE(r->Release(slot).ok());
  EXPECT_EQ(w->released(), 1u);
}

// A reader that writes garbage over every writable byte is cut off; the ring is rebuilt from
// the writer's private state for the next attach, which gets every batch, in order.
TEST(RingTest, AScribblingReaderIsCutOffAndTheRankRebuilt) {
  auto w = MakeRing(4);
  Result<int> control = w->Attach(1);
  ASSERT_TRUE(control.ok());
  for (uint64_t seq = 0; seq < 3; ++seq) Publish(*w, seq);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto r = RingReader::Map(dup(w->data_fd()), dup(*control));
    int slot;
    BatchView v;
    (void)(*r)->Acquire(1000, &slot, &v);
    void* p = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, *control, 0);
    if (p == MAP_FAILED) _exit(1);
    std::memset(p, 0x5a, kPageBytes);
    _exit(0);
  }
  int status;
  waitpid(child, &status, 0);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(w->AcquireFree(0), 3) << "the one slot that never held a batch";
  std::string why = w->TakeViolation();
  EXPECT_NE(why.find("makes no sense"), std::string::npos) << why;
  EXPECT_EQ(w->released(), 0u);
  ASSERT_TRUE(WriteBatch(*w, 3, 3).ok());
  auto r = Attach(*w, 2);
  for (uint64_t seq = 0; seq < 4; ++seq) {
    int slot;
    ExpectBatch(Take(*r, &slot), seq);
    ASSERT_TRUE(r->Release(slot).ok());
  }
  EXPECT_TRUE(w->TakeViolation().empty());
  EXPECT_EQ(w->released(), 4u);
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

// A config reload may change a batch's tensors: the writer lays out later slots anew (within
// the slots it made) and the reader takes every tensor's place from the slot's descriptor.
TEST(RingTest, ANewLayoutThatFitsTheSlotsIsUsedForTheNextBatches) {
  auto created = RingWriter::Create(0, 1, 2, PlanSlot(64, {8000}));
  ASSERT_TRUE(created.ok());
  RingWriter& w = **created;
  auto r = Attach(w, 1);
  EXPECT_EQ(w.SetLayout(PlanSlot(64, {8000, 4096})).code(), Status::Code::kTooLarge)
      << "more than the slots hold";
  EXPECT_EQ(w.SetLayout(PlanSlot(64 * 1024, {100})).code(), Status::Code::kTooLarge)
      << "the ids would move the tensors";
  int claimed = w.AcquireFree(100);
  EXPECT_FALSE(w.SetLayout(PlanSlot(64, {2000, 1000})).ok()) << "a slot is being written";
  w.Abandon(claimed);
  ASSERT_TRUE(w.SetLayout(PlanSlot(64, {2000, 1000})).ok());
  int slot = w.AcquireFree(100);
  ASSERT_GE(slot, 0);
  std::memset(w.slot_data(slot) + w.layout().tensor_offsets[1], 7, 1000);
  BatchView view;
  view.seq = 0;
  std::string id = "a";
  view.ids.push_back(id);
  view.tensors.push_back({"x", 1, {2000}, nullptr, 2000});
  view.tensors.push_back({"y", 1, {10, 100}, nullptr, 1000});
  ASSERT_TRUE(w.Commit(slot, view).ok());
  int got_slot;
  BatchView got = Take(*r, &got_slot);
  ASSERT_EQ(got.tensors.size(), 2u);
  EXPECT_EQ(got.tensors[1].name, "y");
  EXPECT_EQ(got.tensors[1].shape, (std::vector<int64_t>{10, 100}));
  EXPECT_EQ(got.tensors[1].data[999], 7);
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

// Replicas (a model-parallel group): every member reads every batch from the one data area,
// and a slot is free only once each member released it.
TEST(RingTest, MembersEachReadEveryBatchAndASlotFreesWhenAllReleased) {
  auto made = RingWriter::Create(0, 1, 2, PlanSlot(64, {4000}), -1, /*members=*/2);
  ASSERT_TRUE(made.ok()) << made.status().message();
  RingWriter& w = **made;
  auto a = Attach(w, 1, 0), b = Attach(w, 2, 1);
  Publish(w, 0);
  Publish(w, 1);
  int sa, sb;
  const BatchView va = Take(*a, &sa), vb = Take(*b, &sb);
  ExpectBatch(va, 0);
  ExpectBatch(vb, 0);
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(va.tensors[0].data - a->data(), vb.tensors[0].data - b->data()) << "the same bytes";
  ASSERT_TRUE(a->Release(sa).ok());
  EXPECT_EQ(w.AcquireFree(0), -1) << "member 1 still holds batch 0";
  EXPECT_EQ(w.backlog(0).taken, 0u);
  EXPECT_EQ(w.backlog(1).taken, 1u);
  EXPECT_EQ(w.Unfinished(0), 1u);
  EXPECT_EQ(w.Unfinished(1), 2u);
  ASSERT_TRUE(b->Release(sb).ok());
  EXPECT_EQ(w.released(), 1u);
  EXPECT_EQ(w.acked().seq, 1u);
  EXPECT_GE(w.AcquireFree(0), 0);
  // A member cut off for scribbling leaves the other reading.
  auto* word = reinterpret_cast<std::atomic<uint64_t>*>(
      static_cast<uint8_t*>(mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                                 w.Attach(3, 1).value(), 0)) +
      sizeof(ControlHeader));
  b = nullptr;  // (its reader's mapping is gone with the attach above)
  word->store(0xdead);
  EXPECT_NE(w.TakeViolation(1), "");
  EXPECT_EQ(w.TakeViolation(0), "");
  ExpectBatch(Take(*a, &sa), 1);
}

// A member that is not attached holds its group: what it has not finished stays until its
// next reader takes and releases it. A trainer resuming drops what is before its cursor and is
// given again what it finished from the cursor on, while its peer still holds it.
TEST(RingTest, AMemberResumingGetsItsBatchesFromItsCursor) {
  auto made = RingWriter::Create(0, 1, 4, PlanSlot(64, {4000}), -1, /*members=*/2);
  ASSERT_TRUE(made.ok());
  RingWriter& w = **made;
  auto a = Attach(w, 1, 0);
  for (uint64_t seq = 0; seq < 4; ++seq) Publish(w, seq);
  for (uint64_t seq = 0; seq < 4; ++seq) {
    int slot;
    ExpectBatch(Take(*a, &slot), seq);
    ASSERT_TRUE(a->Release(slot).ok());
  }
  EXPECT_EQ(w.AcquireFree(0), -1) << "member 1 never came: every slot waits for it";
  EXPECT_EQ(w.MinReadySeq(1), 0u);
  EXPECT_EQ(w.MinReadySeq(0), UINT64_MAX);
  auto b = Attach(w, 2, 1);
  int slot;
  ExpectBatch(Take(*b, &slot), 0);
  ASSERT_TRUE(b->Release(slot).ok());
  ExpectBatch(Take(*b, &slot), 1);
  EXPECT_EQ(w.Detach(1), 1) << "its reader died holding batch 1";
  // Member 0 resumes from an earlier checkpoint (batch 2: it is given 2 and 3 again); member 1
  // from batch 2 (batch 1 finished for it, and free).
  EXPECT_EQ(w.ResumeMember(0, 2), 0);
  EXPECT_EQ(w.MinReadySeq(0), 2u);
  EXPECT_EQ(w.ResumeMember(1, 2), 1);
  EXPECT_EQ(w.MinPublishedSeq(), 2u);
  EXPECT_GE(w.AcquireFree(0), 0) << "batches 0 and 1 are free";
  a = Attach(w, 3, 0);
  b = Attach(w, 4, 1);
  for (auto* r : {a.get(), b.get()}) {
    ExpectBatch(Take(*r, &slot), 2);
    ASSERT_TRUE(r->Release(slot).ok());
  }
  EXPECT_EQ(w.acked().seq, 3u);
  // Dropping what no reader holds (a rewind) takes it from every member.
  EXPECT_EQ(w.DropReady(), 1);
  EXPECT_EQ(w.unreleased(), 0u);
}

}  // namespace
}  // namespace mmfeed::shm
