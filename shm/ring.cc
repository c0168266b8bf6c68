#include "shm/ring.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/clock.h"
#include "base/tensor.h"

namespace mmfeed::shm {
namespace {

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

SlotLayout PlanSlot(uint64_t ids_capacity, const std::vector<uint64_t>& tensor_bytes) {
  SlotLayout l;
  l.ids_capacity = ids_capacity;
  uint64_t off = AlignUp(sizeof(SlotDescriptor) + ids_capacity, kPageBytes);
  for (uint64_t b : tensor_bytes) {
    l.tensor_offsets.push_back(off);
    l.tensor_capacity.push_back(b);
    off += AlignUp(std::max<uint64_t>(b, 1), kPageBytes);
  }
  l.slot_bytes = off;
  return l;
}

// ---------------------------------------------------------------- writer

namespace {

// Binds [addr, addr + len) to NUMA node `node` (MPOL_BIND), before its pages exist.
Status BindToNode(void* addr, uint64_t len, int node) {
  constexpr int kMpolBind = 2;  // <linux/mempolicy.h>
  constexpr int kMaxNodes = 1024;
  if (node < 0 || node >= kMaxNodes)
    return Status::Invalid(fmt::format("NUMA node {} out of range", node));
  unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long))] = {};
  mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
  if (syscall(SYS_mbind, addr, len, kMpolBind, mask, kMaxNodes + 1, 0) != 0)
    return Status::Io(
        fmt::format("binding ring memory to NUMA node {}: {}", node, std::strerror(errno)));
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<RingWriter>> RingWriter::Create(uint32_t rank, uint32_t num_ranks,
                                                       uint32_t slot_count,
                                                       const SlotLayout& layout, int numa_node,
                                                       uint32_t members) {
  if (slot_count == 0 || slot_count > kMaxSlots)
    return Status::Invalid(fmt::format("ring_slots must be 1..{}, not {}", kMaxSlots, slot_count));
  if (members == 0 || members > kMaxMembers)
    return Status::Invalid(fmt::format("a ring has 1..{} members, not {}", kMaxMembers, members));
  std::unique_ptr<RingWriter> w(new RingWriter());
  w->layout_ = layout;
  w->slot_count_ = slot_count;
  w->slot_stride_ = AlignUp(layout.slot_bytes, kPageBytes);
  w->payload_offset_ = AlignUp(sizeof(SlotDescriptor) + layout.ids_capacity, kPageBytes);
  w->size_ = kPageBytes + w->slot_stride_ * slot_count;
  w->state_.assign(slot_count, Slot::kFree);
  w->members_.resize(members);
  for (Member& m : w->members_) m.marks.assign(slot_count, Mark::kDone);
  std::string name = fmt::format("mmfeed-ring-{}", rank);
  w->fd_ = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (w->fd_ < 0) return Status::Io(fmt::format("memfd_create: {}", std::strerror(errno)));
  if (ftruncate(w->fd_, static_cast<off_t>(w->size_)) != 0)
    return Status::Io(
        fmt::format("ftruncate ring {} to {} bytes: {}", rank, w->size_, std::strerror(errno)));
  void* p = mmap(nullptr, w->size_, PROT_READ | PROT_WRITE, MAP_SHARED, w->fd_, 0);
  if (p == MAP_FAILED)
    return Status::Io(fmt::format("mmap ring {}: {}", rank, std::strerror(errno)));
  w->base_ = static_cast<uint8_t*>(p);
  if (numa_node >= 0) MMFEED_RETURN_IF_ERROR(BindToNode(p, w->size_, numa_node));
  int rc = posix_fallocate(w->fd_, 0, static_cast<off_t>(w->size_));
  if (rc != 0)
    return Status::Io(
        fmt::format("reserving {} bytes for ring {}: {}", w->size_, rank, std::strerror(rc)));
  // The daemon's mapping stays writable; no one can make a new writable one, resize it, or
  // write() to it.
  if (fcntl(w->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) !=
      0)
    return Status::Io(fmt::format("sealing ring {}: {}", rank, std::strerror(errno)));
  w->ro_fd_ = open(fmt::format("/proc/self/fd/{}", w->fd_).c_str(), O_RDONLY | O_CLOEXEC);
  if (w->ro_fd_ < 0)
    return Status::Io(
        fmt::format("read-only descriptor of ring {}: {}", rank, std::strerror(errno)));
  RingHeader* h = w->header();
  new (h) RingHeader();
  h->magic = kRingMagic;
  h->layout_version = kRingLayoutVersion;
  h->header_bytes = sizeof(RingHeader);
  h->total_bytes = w->size_;
  h->slots_offset = kPageBytes;
  h->slot_stride = w->slot_stride_;
  h->payload_offset = w->payload_offset_;
  h->slot_count = slot_count;
  h->rank = rank;
  h->num_ranks = num_ranks;
  for (uint32_t i = 0; i < slot_count; ++i) new (w->slot(static_cast<int>(i))) SlotDescriptor();
  return w;
}

Status RingWriter::Fits(const SlotLayout& layout) const {
  if (AlignUp(sizeof(SlotDescriptor) + layout.ids_capacity, kPageBytes) != payload_offset_ ||
      layout.slot_bytes > slot_stride_)
    return Status::TooLarge(
        fmt::format("the batches need {:.2f} MiB slots, tensors from byte {}; the ring's slots "
                    "hold {:.2f} MiB, tensors from byte {}",
                    layout.slot_bytes / 1048576.0,
                    AlignUp(sizeof(SlotDescriptor) + layout.ids_capacity, kPageBytes),
                    slot_stride_ / 1048576.0, payload_offset_));
  return Status::Ok();
}

Status RingWriter::SetLayout(const SlotLayout& layout) {
  MMFEED_RETURN_IF_ERROR(Fits(layout));
  std::lock_guard<std::mutex> lock(mu_);
  if (std::count(state_.begin(), state_.end(), Slot::kWriting))
    return Status::Invalid("the ring's slots are being written");
  layout_ = layout;
  return Status::Ok();
}

RingWriter::~RingWriter() {
  for (Member& m : members_) DetachLocked(m);
  if (base_) munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
  if (ro_fd_ >= 0) ::close(ro_fd_);
}

SlotDescriptor* RingWriter::slot(int i) const {
  return reinterpret_cast<SlotDescriptor*>(base_ + kPageBytes + slot_stride_ * i);
}

SlotControl* RingWriter::control(const Member& m, int i) const {
  return reinterpret_cast<SlotControl*>(m.control_base + sizeof(ControlHeader)) + i;
}

Result<int> RingWriter::Attach(uint32_t generation, uint32_t member) {
  if (generation == 0) return Status::Invalid("attach generation 0 is reserved");
  if (member >= members_.size())
    return Status::Invalid(fmt::format("member {} of a ring of {}", member, members_.size()));
  int fd = memfd_create("mmfeed-ring-control", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::Io(fmt::format("memfd_create: {}", std::strerror(errno)));
  void* p = MAP_FAILED;
  if (ftruncate(fd, kPageBytes) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
      (p = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    int e = errno;
    ::close(fd);
    return Status::Io(fmt::format("ring control area: {}", std::strerror(e)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  Member& m = members_[member];
  SyncMemberLocked(m);  // what the previous reader released before it went is not delivered again
  DetachLocked(m);
  // The previous generation is gone with its control area: whatever it scribbled there was
  // reported when it detached and must not cut off this reader.
  m.violation.clear();
  m.control_fd = fd;
  m.control_base = static_cast<uint8_t*>(p);
  m.generation = generation;
  auto* ch = new (m.control_base) ControlHeader();
  ch->magic = kControlMagic;
  ch->layout_version = kRingLayoutVersion;
  ch->slot_count = slot_count_;
  ch->generation = generation;
  for (uint32_t i = 0; i < slot_count_; ++i) {
    SlotControl* c = new (control(m, static_cast<int>(i))) SlotControl();
    const bool ready = state_[i] == Slot::kPublished && m.marks[i] == Mark::kReady;
    c->word.store(ready ? ControlWord(kSlotReady, generation) : 0, std::memory_order_release);
  }
  return fd;
}

int RingWriter::Detach(uint32_t member) {
  std::lock_guard<std::mutex> lock(mu_);
  Member& m = members_.at(member);
  SyncMemberLocked(m);
  return DetachLocked(m);
}

int RingWriter::DetachLocked(Member& m) {
  if (!m.control_base) return 0;
  int held = 0;
  for (Mark& k : m.marks)
    if (k == Mark::kTaken) {
      k = Mark::kReady;
      ++held;
    }
  munmap(m.control_base, kPageBytes);
  ::close(m.control_fd);
  m.control_base = nullptr;
  m.control_fd = -1;
  return held;
}

std::string RingWriter::TakeViolation(uint32_t member) {
  std::lock_guard<std::mutex> lock(mu_);
  Member& m = members_.at(member);
  SyncMemberLocked(m);
  return std::exchange(m.violation, std::string());
}

void RingWriter::CutOff(Member& m, std::string why) {
  m.violation = std::move(why);
  DetachLocked(m);
}

void RingWriter::FinishLocked(Member& m, uint32_t i, bool released) {
  m.marks[i] = Mark::kDone;
  FreeIfFinishedLocked(i, released);
}

void RingWriter::FreeIfFinishedLocked(uint32_t i, bool released) {
  for (const Member& m : members_)
    if (m.marks[i] != Mark::kDone) return;
  state_[i] = Slot::kFree;
  if (!released) {
    ++dropped_;
    return;
  }
  ++released_;
  const SlotDescriptor* d = slot(static_cast<int>(i));
  if (d->next_seq > acked_.seq)
    acked_ = {d->next_epoch, d->next_batch, d->next_seq, d->next_stream};
}

void RingWriter::OfferLocked(Member& m, uint32_t i) {
  m.marks[i] = Mark::kReady;
  if (m.control_base)
    control(m, static_cast<int>(i))
        ->word.store(ControlWord(kSlotReady, m.generation), std::memory_order_release);
}

bool RingWriter::WithdrawLocked(Member& m, uint32_t i) {
  if (m.marks[i] != Mark::kReady) return false;
  uint64_t ready = ControlWord(kSlotReady, m.generation);
  if (!m.control_base || control(m, static_cast<int>(i))->word.compare_exchange_strong(ready, 0))
    return true;
  SyncMemberLocked(m);  // just taken: seen as such now, so its floor is past it
  return false;
}

void RingWriter::Took(Member& m, uint32_t i) {
  m.last_take = std::chrono::steady_clock::now();
  m.floor = std::max(m.floor, slot(static_cast<int>(i))->seq + 1);
}

void RingWriter::SyncLocked() {
  for (Member& m : members_) SyncMemberLocked(m);
}

// Reads every control word of the member's reader. The reader may only have moved a slot
// READY(g) -> TAKEN(g) -> RELEASED(g) for its generation g; anything else cuts it off.
void RingWriter::SyncMemberLocked(Member& m) {
  if (!m.control_base) return;
  const uint64_t ready = ControlWord(kSlotReady, m.generation),
                 taken = ControlWord(kSlotTaken, m.generation),
                 released = ControlWord(kSlotReleased, m.generation);
  for (uint32_t i = 0; i < slot_count_; ++i) {
    SlotControl* c = control(m, static_cast<int>(i));
    uint64_t w = c->word.load(std::memory_order_acquire);
    Mark& k = m.marks[i];
    const bool published = state_[i] == Slot::kPublished;
    bool ok = true;
    if (!published || k == Mark::kDone) {
      ok = w == 0;
    } else if (w == taken) {
      if (k == Mark::kReady) Took(m, i);
      k = Mark::kTaken;
    } else if (w == released) {
      // Finish it only if the reader does not change the word meanwhile.
      ok = c->word.compare_exchange_strong(w, 0, std::memory_order_acq_rel);
      if (ok) {
        if (k == Mark::kReady) Took(m, i);
        FinishLocked(m, i, /*released=*/true);
      }
    } else {
      ok = w == ready && k == Mark::kReady;
    }
    if (!ok)
      return CutOff(m, fmt::format("the reader of generation {} wrote {:#x} into the control "
                                   "word of slot {}, which makes no sense there",
                                   m.generation, w, i));
  }
}

int RingWriter::AcquireFree(int timeout_ms) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      SyncLocked();
      for (uint32_t i = 0; i < slot_count_; ++i)
        if (state_[i] == Slot::kFree) {
          state_[i] = Slot::kWriting;
          return static_cast<int>(i);
        }
    }
    // The readers' futex words are untrusted memory that may go away with them: poll instead.
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

uint8_t* RingWriter::slot_data(int index) const { return reinterpret_cast<uint8_t*>(slot(index)); }

Status RingWriter::Commit(int index, const BatchView& batch) {
  SlotDescriptor* d = slot(index);
  uint8_t* slot_base = reinterpret_cast<uint8_t*>(d);
  if (batch.tensors.size() > kMaxTensors || batch.tensors.size() > layout_.tensor_offsets.size())
    return Status::Invalid(fmt::format("batch has {} tensors, the ring planned {} (at most {})",
                                       batch.tensors.size(), layout_.tensor_offsets.size(),
                                       kMaxTensors));
  uint64_t ids_bytes = 0;
  for (auto id : batch.ids) ids_bytes += id.size() + 1;
  if (ids_bytes > layout_.ids_capacity)
    return Status::TooLarge(
        fmt::format("batch ids need {} bytes, slots hold {}", ids_bytes, layout_.ids_capacity));
  for (size_t i = 0; i < batch.tensors.size(); ++i)
    if (batch.tensors[i].nbytes > layout_.tensor_capacity[i] ||
        batch.tensors[i].shape.size() > kMaxDims)
      return Status::TooLarge(fmt::format("tensor '{}' ({} bytes) exceeds its planned {} bytes",
                                          batch.tensors[i].name, batch.tensors[i].nbytes,
                                          layout_.tensor_capacity[i]));
  std::lock_guard<std::mutex> lock(mu_);
  if (state_[index] != Slot::kWriting)
    return Status::Invalid(fmt::format("slot {} was not claimed", index));
  d->seq = batch.seq;
  d->epoch = batch.epoch;
  d->num_samples = static_cast<uint32_t>(batch.ids.size());
  d->num_tensors = static_cast<uint32_t>(batch.tensors.size());
  d->ids_offset = sizeof(SlotDescriptor);
  d->ids_bytes = ids_bytes;
  d->next_epoch = batch.next.epoch;
  d->next_batch = batch.next.batch;
  d->next_seq = batch.next.seq;
  d->next_stream = batch.next.stream;
  d->next_position =
      batch.next.position <= UINT32_MAX ? static_cast<uint32_t>(batch.next.position) : 0;
  uint8_t* p = slot_base + d->ids_offset;
  for (auto id : batch.ids) {
    std::memcpy(p, id.data(), id.size());
    p[id.size()] = 0;
    p += id.size() + 1;
  }
  uint64_t end = payload_offset_;
  for (size_t i = 0; i < batch.tensors.size(); ++i) {
    const TensorView& t = batch.tensors[i];
    TensorDesc& td = d->tensors[i];
    std::memset(&td, 0, sizeof(td));
    std::strncpy(td.name, t.name.c_str(), kTensorNameBytes - 1);
    td.dtype = t.dtype;
    td.ndim = static_cast<uint32_t>(t.shape.size());
    for (uint32_t k = 0; k < td.ndim; ++k) td.shape[k] = t.shape[k];
    td.offset = layout_.tensor_offsets[i];
    td.nbytes = t.nbytes;
    end = td.offset + t.nbytes;
  }
  d->payload_bytes = end - payload_offset_;
  state_[index] = Slot::kPublished;
  for (Member& m : members_) {
    // A batch made again after a rewind is not delivered again to a member past it.
    if (batch.seq < m.floor)
      m.marks[index] = Mark::kDone;
    else
      OfferLocked(m, index);
  }
  FreeIfFinishedLocked(index, /*released=*/false);
  RingHeader* h = header();
  h->published.fetch_add(1, std::memory_order_release);
  h->publish_futex.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&h->publish_futex);
  return Status::Ok();
}

void RingWriter::Abandon(int index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_[index] == Slot::kWriting) state_[index] = Slot::kFree;
}

void RingWriter::Close(bool complete) { SetClosed(complete ? kClosedAtEnd : kClosedStopped); }

void RingWriter::CloseMoved() { SetClosed(kClosedMoved); }

void RingWriter::SetClosed(uint32_t how) {
  header()->closed.store(how, std::memory_order_release);
  header()->publish_futex.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&header()->publish_futex);
}

bool RingWriter::Drained() {
  if (!header()->closed.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  SyncLocked();
  for (Slot s : state_)
    if (s != Slot::kFree) return false;
  return true;
}

uint64_t RingWriter::published() const {
  return header()->published.load(std::memory_order_acquire);
}

uint64_t RingWriter::released() {
  std::lock_guard<std::mutex> lock(mu_);
  SyncLocked();
  return released_;
}

RingWriter::Backlog RingWriter::backlog(uint32_t member) {
  std::lock_guard<std::mutex> lock(mu_);
  SyncLocked();
  const Member& m = members_.at(member);
  Backlog b;
  for (uint32_t i = 0; i < slot_count_; ++i) {
    if (state_[i] != Slot::kPublished) continue;
    b.ready += m.marks[i] == Mark::kReady;
    b.taken += m.marks[i] == Mark::kTaken;
  }
  if (m.control_base) {
    const auto* ch = reinterpret_cast<const ControlHeader*>(m.control_base);
    b.generation = m.generation;
    b.wait_ns = ch->wait_ns.load(std::memory_order_relaxed);
    b.hold_ns = ch->hold_ns.load(std::memory_order_relaxed);
  }
  if (m.last_take.time_since_epoch().count())
    b.seconds_since_take =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - m.last_take).count();
  return b;
}

uint64_t RingWriter::unreleased() {
  std::lock_guard<std::mutex> lock(mu_);
  SyncLocked();
  return published() - released_ - dropped_;
}

uint64_t RingWriter::Unfinished(uint32_t member) {
  std::lock_guard<std::mutex> lock(mu_);
  SyncLocked();
  const Member& m = members_.at(member);
  uint64_t n = 0;
  for (uint32_t i = 0; i < slot_count_; ++i)
    n += state_[i] == Slot::kPublished && m.marks[i] != Mark::kDone;
  return n;
}

int RingWriter::DropReady(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  SyncLocked();
  int n = 0;
  for (uint32_t i = 0; i < slot_count_; ++i) {
    if (state_[i] != Slot::kPublished || slot(static_cast<int>(i))->seq >= seq) continue;
    // Withdrawn from each member waiting for it; a reader that took it meanwhile (or before)
    // keeps it, and the batch made again is not delivered to it a second time (its floor).
    for (Member& m : members_)
      if (WithdrawLocked(m, i)) FinishLocked(m, i, /*released=*/false);
    n += state_[i] == Slot::kFree;
  }
  return n;
}

int RingWriter::ResumeMember(uint32_t member, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  SyncLocked();
  Member& m = members_.at(member);
  m.floor = seq;
  int n = 0;
  for (uint32_t i = 0; i < slot_count_; ++i) {
    if (state_[i] != Slot::kPublished) continue;
    if (slot(static_cast<int>(i))->seq >= seq) {
      // Finished before: delivered again from the cursor on.
      if (m.marks[i] == Mark::kDone) OfferLocked(m, i);
    } else if (WithdrawLocked(m, i)) {
      FinishLocked(m, i, /*released=*/false);
      ++n;
    }
  }
  return n;
}

uint64_t RingWriter::MinPublishedSeq() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t best = UINT64_MAX;
  for (uint32_t i = 0; i < slot_count_; ++i)
    if (state_[i] == Slot::kPublished) best = std::min(best, slot(static_cast<int>(i))->seq);
  return best;
}

uint64_t RingWriter::MinReadySeq(int member) {
  std::lock_guard<std::mutex> lock(mu_);
  SyncLocked();
  uint64_t best = UINT64_MAX;
  for (uint32_t i = 0; i < slot_count_; ++i) {
    if (state_[i] != Slot::kPublished) continue;
    bool ready = false;
    for (uint32_t k = 0; k < members_.size(); ++k)
      ready |= (member < 0 || k == static_cast<uint32_t>(member)) &&
               members_[k].marks[i] == Mark::kReady;
    if (ready) best = std::min(best, slot(static_cast<int>(i))->seq);
  }
  return best;
}

StreamCursor RingWriter::acked() {
  std::lock_guard<std::mutex> lock(mu_);
  SyncLocked();
  return acked_;
}

void RingWriter::set_acked(const StreamCursor& c) {
  std::lock_guard<std::mutex> lock(mu_);
  SyncLocked();
  for (uint32_t i = 0; i < slot_count_; ++i)
    if (state_[i] == Slot::kPublished && slot(static_cast<int>(i))->seq < c.seq) return;
  acked_ = c;
}

// ---------------------------------------------------------------- reader

Result<std::unique_ptr<RingReader>> RingReader::Map(int data_fd, int control_fd) {
  std::unique_ptr<RingReader> r(new RingReader());
  r->fd_ = data_fd;
  r->control_fd_ = control_fd;
  struct stat st;
  if (fstat(data_fd, &st) != 0)
    return Status::Io(fmt::format("fstat ring: {}", std::strerror(errno)));
  r->size_ = static_cast<uint64_t>(st.st_size);
  if (r->size_ < kPageBytes)
    return Status::Corrupt(fmt::format("ring is {} bytes, smaller than its header", r->size_));
  void* p = mmap(nullptr, r->size_, PROT_READ, MAP_SHARED, data_fd, 0);
  if (p == MAP_FAILED) return Status::Io(fmt::format("mmap ring: {}", std::strerror(errno)));
  r->base_ = static_cast<const uint8_t*>(p);
  r->shared_ = reinterpret_cast<const RingHeader*>(r->base_);
  std::memcpy(static_cast<void*>(&r->header_copy_), r->base_, sizeof(RingHeader));
  const RingHeader& h = r->header_copy_;
  if (h.magic != kRingMagic) return Status::Corrupt("not an mmfeed ring (bad magic)");
  if (h.layout_version != kRingLayoutVersion)
    return Status::Unsupported(fmt::format("ring layout version {}, this client speaks {}",
                                           h.layout_version, kRingLayoutVersion));
  if (h.header_bytes != sizeof(RingHeader)) return Status::Corrupt("ring header size mismatch");
  if (h.total_bytes != r->size_)
    return Status::Corrupt(
        fmt::format("ring says {} bytes, mapping has {}", h.total_bytes, r->size_));
  if (h.slots_offset % kPageBytes || h.slot_stride % kPageBytes || h.payload_offset % kPageBytes ||
      h.slot_stride == 0 || h.slot_count == 0 || h.slot_count > kMaxSlots ||
      h.payload_offset >= h.slot_stride)
    return Status::Corrupt("ring geometry is not page aligned");
  __uint128_t end = static_cast<__uint128_t>(h.slot_stride) * h.slot_count + h.slots_offset;
  if (end != h.total_bytes) return Status::Corrupt("ring slots do not fill the mapping");

  if (fstat(control_fd, &st) != 0)
    return Status::Io(fmt::format("fstat ring control: {}", std::strerror(errno)));
  if (static_cast<uint64_t>(st.st_size) != kPageBytes)
    return Status::Corrupt(
        fmt::format("ring control area is {} bytes, not {}", st.st_size, kPageBytes));
  p = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, control_fd, 0);
  if (p == MAP_FAILED)
    return Status::Io(fmt::format("mmap ring control: {}", std::strerror(errno)));
  r->control_base_ = static_cast<uint8_t*>(p);
  ControlHeader ch;
  std::memcpy(static_cast<void*>(&ch), r->control_base_, sizeof(ch));
  if (ch.magic != kControlMagic || ch.layout_version != kRingLayoutVersion ||
      ch.slot_count != h.slot_count || ch.generation == 0)
    return Status::Corrupt("ring control area does not match its ring");
  r->generation_ = ch.generation;
  r->taken_at_ns_ = std::make_unique<std::atomic<uint64_t>[]>(h.slot_count);
  return r;
}

RingReader::~RingReader() {
  if (uint8_t* cow = cow_.load()) munmap(cow, size_);
  if (pagemap_fd_ >= 0) ::close(pagemap_fd_);
  if (control_base_) munmap(control_base_, kPageBytes);
  if (base_) munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
  if (control_fd_ >= 0) ::close(control_fd_);
}

Result<uint8_t*> RingReader::CopyOnWriteView() {
  std::lock_guard<std::mutex> lock(cow_mu_);
  if (uint8_t* cow = cow_.load()) return cow;
  int pagemap = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pagemap < 0)
    return Status::Io(fmt::format("open /proc/self/pagemap: {}", std::strerror(errno)));
  // MAP_NORESERVE: only the pages a caller writes take memory, so the view is not charged
  // against the commit limit at the ring's full size.
  void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd_, 0);
  if (p == MAP_FAILED) {
    ::close(pagemap);
    return Status::Io(fmt::format("mmap copy-on-write view of the ring: {}", std::strerror(errno)));
  }
  pagemap_fd_ = pagemap;
  cow_.store(static_cast<uint8_t*>(p));
  return static_cast<uint8_t*>(p);
}

namespace {

// /proc/self/pagemap: one 64-bit entry per page (the system's, which may be larger than the
// ring's 4 KiB alignment). A written page of a private file mapping is an anonymous copy:
// present without the file bit, or swapped out.
constexpr uint64_t kPagePresent = 1ull << 63, kPageSwapped = 1ull << 62, kPageFile = 1ull << 61;
const uint64_t kSystemPage = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));

bool PrivateCopy(uint64_t entry) {
  return (entry & kPageSwapped) || ((entry & kPagePresent) && !(entry & kPageFile));
}

// Calls f(first_page, page_count) for each run of privately copied pages among the `pages`
// system pages from `addr` (system page aligned). False if the pagemap could not be read.
template <typename F>
bool ForEachPrivateRun(int pagemap, uintptr_t addr, uint64_t pages, F f) {
  uint64_t entries[512];
  uint64_t run_start = 0, run = 0;
  for (uint64_t done = 0; done < pages;) {
    uint64_t n = std::min<uint64_t>(pages - done, 512);
    off_t at = static_cast<off_t>((addr / kSystemPage + done) * sizeof(uint64_t));
    if (pread(pagemap, entries, n * sizeof(uint64_t), at) != static_cast<ssize_t>(n * 8))
      return false;
    for (uint64_t k = 0; k < n; ++k) {
      if (PrivateCopy(entries[k])) {
        if (run == 0) run_start = done + k;
        ++run;
      } else if (run) {
        f(run_start, run);
        run = 0;
      }
    }
    done += n;
  }
  if (run) f(run_start, run);
  return true;
}

}  // namespace

Result<bool> RingReader::Written(const void* p, uint64_t n) const {
  const uint8_t* cow = cow_.load();
  const auto* b = static_cast<const uint8_t*>(p);
  if (!cow || b < cow || n > size_ || static_cast<uint64_t>(b - cow) > size_ - n)
    return Status::Invalid("the range is not inside the ring's copy-on-write view");
  if (n == 0) return false;
  uintptr_t first = reinterpret_cast<uintptr_t>(b) / kSystemPage * kSystemPage;
  uint64_t pages = (reinterpret_cast<uintptr_t>(b) + n - first + kSystemPage - 1) / kSystemPage;
  bool written = false;
  if (!ForEachPrivateRun(pagemap_fd_, first, pages, [&](uint64_t, uint64_t) { written = true; }))
    return Status::Io(fmt::format("read /proc/self/pagemap: {}", std::strerror(errno)));
  return written;
}

void RingReader::DropWrites(uint64_t off, uint64_t n) {
  uint8_t* cow = cow_.load();
  if (!cow) return;
  // The system pages the range touches. Where they are larger than the ring's 4 KiB
  // alignment, one may hold the ends of two slots: dropping it also drops a write into the
  // neighbouring slot's batch (that write is lost; no batch ever reads another's writes).
  const uintptr_t start = reinterpret_cast<uintptr_t>(cow + off) / kSystemPage * kSystemPage;
  const uint64_t pages =
      (reinterpret_cast<uintptr_t>(cow + off) + n - start + kSystemPage - 1) / kSystemPage;
  bool read = ForEachPrivateRun(pagemap_fd_, start, pages, [&](uint64_t page, uint64_t k) {
    madvise(reinterpret_cast<void*>(start + page * kSystemPage), k * kSystemPage, MADV_DONTNEED);
  });
  // Without the pagemap, drop the whole range: correct, the next batch faults its pages in.
  if (!read) madvise(cow + off, n, MADV_DONTNEED);
}

const SlotDescriptor* RingReader::slot(int i) const {
  return reinterpret_cast<const SlotDescriptor*>(base_ + header_copy_.slots_offset +
                                                 header_copy_.slot_stride * i);
}

SlotControl* RingReader::control(int i) const {
  return reinterpret_cast<SlotControl*>(control_base_ + sizeof(ControlHeader)) + i;
}

Status RingReader::ParseSlot(int i, BatchView* batch) const {
  const SlotDescriptor* d = slot(i);
  const uint8_t* base = reinterpret_cast<const uint8_t*>(d);
  const uint64_t stride = header_copy_.slot_stride;
  auto inside = [&](uint64_t off, uint64_t n) { return off <= stride && n <= stride - off; };
  if (d->num_tensors > kMaxTensors)
    return Status::Corrupt(fmt::format("slot {}: {} tensors", i, d->num_tensors));
  if (!inside(d->ids_offset, d->ids_bytes))
    return Status::Corrupt(fmt::format("slot {}: ids out of bounds", i));
  batch->seq = d->seq;
  batch->epoch = d->epoch;
  batch->next = {d->next_epoch, d->next_batch, d->next_seq, d->next_stream};
  batch->next.position = d->next_position;
  batch->ids.clear();
  const char* ids = reinterpret_cast<const char*>(base + d->ids_offset);
  uint64_t pos = 0;
  for (uint32_t k = 0; k < d->num_samples; ++k) {
    const void* nul = pos < d->ids_bytes ? std::memchr(ids + pos, 0, d->ids_bytes - pos) : nullptr;
    if (!nul) return Status::Corrupt(fmt::format("slot {}: ids not terminated", i));
    uint64_t len = static_cast<const char*>(nul) - (ids + pos);
    batch->ids.emplace_back(ids + pos, len);
    pos += len + 1;
  }
  batch->tensors.clear();
  for (uint32_t k = 0; k < d->num_tensors; ++k) {
    const TensorDesc& td = d->tensors[k];
    if (td.ndim > kMaxDims || !inside(td.offset, td.nbytes))
      return Status::Corrupt(fmt::format("slot {}: tensor {} out of bounds", i, k));
    if (td.dtype < static_cast<uint32_t>(DType::kUInt8) ||
        td.dtype > static_cast<uint32_t>(kLastDType))
      return Status::Corrupt(
          fmt::format("slot {}: tensor {} has unknown dtype {}", i, k, td.dtype));
    __uint128_t bytes = DTypeSize(static_cast<DType>(td.dtype));
    for (uint32_t n = 0; n < td.ndim; ++n) {
      if (td.shape[n] < 0)
        return Status::Corrupt(fmt::format("slot {}: tensor {} has a negative dimension", i, k));
      bytes = bytes * static_cast<uint64_t>(td.shape[n]);
      if (bytes > stride) break;
    }
    if (bytes != td.nbytes)
      return Status::Corrupt(fmt::format(
          "slot {}: tensor {}: shape x element size is not its {} bytes", i, k, td.nbytes));
    TensorView t;
    t.name.assign(td.name, strnlen(td.name, kTensorNameBytes));
    t.dtype = td.dtype;
    t.shape.assign(td.shape, td.shape + td.ndim);
    t.data = base + td.offset;
    t.nbytes = td.nbytes;
    batch->tensors.push_back(std::move(t));
  }
  return Status::Ok();
}

Result<RingReader::Wait> RingReader::Acquire(int timeout_ms, int* out_slot, BatchView* batch) {
  auto* ch = reinterpret_cast<ControlHeader*>(control_base_);
  const uint64_t t0 = NowNs();
  // The time spent here is the trainer's data stall, whatever the outcome.
  struct AddWait {
    ControlHeader* ch;
    uint64_t t0;
    ~AddWait() { ch->wait_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed); }
  } add_wait{ch, t0};
  const uint64_t ready = ControlWord(kSlotReady, generation_),
                 taken = ControlWord(kSlotTaken, generation_);
  auto* futex = const_cast<std::atomic<uint32_t>*>(&shared_->publish_futex);
  for (int attempt = 0; attempt < 2; ++attempt) {
    uint32_t seen = futex->load(std::memory_order_acquire);
    bool closed = shared_->closed.load(std::memory_order_acquire);
    int best = -1;
    uint64_t best_seq = 0;
    for (uint32_t i = 0; i < header_copy_.slot_count; ++i) {
      if (control(static_cast<int>(i))->word.load(std::memory_order_acquire) != ready) continue;
      uint64_t seq = slot(static_cast<int>(i))->seq;
      if (best < 0 || seq < best_seq) {
        best = static_cast<int>(i);
        best_seq = seq;
      }
    }
    if (best >= 0) {
      uint64_t expected = ready;
      if (control(best)->word.compare_exchange_strong(expected, taken, std::memory_order_acquire)) {
        taken_at_ns_[best].store(NowNs(), std::memory_order_relaxed);
        Status st = ParseSlot(best, batch);
        if (!st.ok()) {
          (void)Release(best);
          return st;
        }
        *out_slot = best;
        return Wait::kGot;
      }
      continue;
    }
    if (closed) return Wait::kEnd;
    if (attempt == 0) FutexWait(futex, seen, timeout_ms);
  }
  return Wait::kTimeout;
}

Status RingReader::Release(int i) {
  if (i < 0 || static_cast<uint32_t>(i) >= header_copy_.slot_count)
    return Status::Invalid(fmt::format("slot {} out of range", i));
  // Before the slot goes back (the daemon may publish its next batch at once, and another
  // thread of this process take it): that batch must read the daemon's bytes, not our writes.
  DropWrites(header_copy_.slots_offset + header_copy_.slot_stride * i, header_copy_.slot_stride);
  uint64_t expected = ControlWord(kSlotTaken, generation_);
  if (!control(i)->word.compare_exchange_strong(expected, ControlWord(kSlotReleased, generation_),
                                                std::memory_order_acq_rel))
    return Status::Invalid(fmt::format(
        "slot {} is not held by this reader (generation {}): release refused", i, generation_));
  auto* ch = reinterpret_cast<ControlHeader*>(control_base_);
  ch->hold_ns.fetch_add(NowNs() - taken_at_ns_[i].load(std::memory_order_relaxed),
                        std::memory_order_relaxed);
  ch->released.fetch_add(1, std::memory_order_relaxed);
  ch->release_futex.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&ch->release_futex);
  return Status::Ok();
}

}  // namespace mmfeed::shm
