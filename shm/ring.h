// RingWriter (daemon side) and RingReader (client side): the process-local classes that operate
// on the shared ring described in ring_format.h / ring_format.md.
//
// A RingWriter is shared by the daemon's threads; a RingReader lives in one trainer process.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/cursor.h"
#include "base/status.h"
#include "shm/ring_format.h"

namespace mmfeed::shm {

// A tensor as read out of a slot (or, for the writer, described: data unused).
struct TensorView {
  std::string name;
  uint32_t dtype = 0;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
};

// One batch: as seen in a slot (pointers into the mapping) or as committed by the writer.
struct BatchView {
  uint64_t seq = 0;
  uint32_t epoch = 0;
  std::vector<std::string_view> ids;
  std::vector<TensorView> tensors;
  StreamCursor next;  // the rank's cursor after this batch (SlotDescriptor::next_*)
};

// Where things go in every slot: ids first, then each tensor at a fixed, page-aligned offset
// with room for its largest (full-batch) size. Fixed so that workers can write samples into a
// slot before the batch is complete.
struct SlotLayout {
  uint64_t ids_capacity = 0;
  std::vector<uint64_t> tensor_offsets;  // from the slot's start
  std::vector<uint64_t> tensor_capacity;
  uint64_t slot_bytes = 0;
};
SlotLayout PlanSlot(uint64_t ids_capacity, const std::vector<uint64_t>& tensor_bytes);

// The most readers one ring serves (`replicas:`).
inline constexpr uint32_t kMaxMembers = 64;

// The daemon's side. It keeps the geometry and every slot's true state to itself and reads the
// readers' control areas only as untrusted input: a value that makes no sense cuts that reader
// off (its control area is dropped, the batches it held become READY again for the next
// attach), never the daemon. Thread-safe: the ring-sink threads and the control thread may
// call any method at any time.
//
// A ring has `members` readers (model-parallel peers, `replicas:`; 1 by default), each with
// its own control area and attach generation: every batch is delivered to each member, and
// its slot is free once every member released it (or finished it: DropFinished). A member
// that is not attached holds the slots it has not finished, as one reader does.
class RingWriter {
 public:
  // Creates both memfds, reserves the data area's memory (bound to `numa_node` first when it
  // is >= 0), maps it, and seals it so that no one else can ever map it writable.
  static Result<std::unique_ptr<RingWriter>> Create(uint32_t rank, uint32_t num_ranks,
                                                    uint32_t slot_count, const SlotLayout& layout,
                                                    int numa_node = -1, uint32_t members = 1);
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  // A read-only descriptor of the data area, for readers.
  int data_fd() const { return ro_fd_; }
  uint64_t size() const { return size_; }
  uint32_t members() const { return static_cast<uint32_t>(members_.size()); }

  // A new reader for `member` with attach generation `generation` (> 0): makes a fresh control
  // area in which every published batch the member has not finished is READY (including those
  // its previous reader held) and returns its fd (owned by the writer until the member's next
  // Attach or Detach). REQUIRES: member < members().
  Result<int> Attach(uint32_t generation, uint32_t member = 0);
  // The member's reader is gone: drops its control area. Returns how many batches it held;
  // they will be delivered to the member's next reader.
  int Detach(uint32_t member = 0);
  // Non-empty once the member's reader was cut off for writing nonsense (and the reason);
  // cleared by reading it.
  std::string TakeViolation(uint32_t member = 0);

  // Takes the readers' releases, then claims a free slot for writing and returns its index;
  // waits up to `timeout_ms` for one, else returns -1.
  int AcquireFree(int timeout_ms);
  // Start of a claimed slot; tensor k lives at layout().tensor_offsets[k].
  uint8_t* slot_data(int slot) const;
  const SlotLayout& layout() const { return layout_; }
  // Lays out the batches published from now on by `layout` (a config reload changed their
  // tensors; readers take every tensor's place from its slot's descriptor). Refused while a
  // slot is claimed, or when the layout does not fit the slots as they were made.
  Status SetLayout(const SlotLayout& layout);
  // Whether `layout` fits the slots as they were made (SetLayout's check, without the change).
  Status Fits(const SlotLayout& layout) const;
  // Publishes a claimed slot whose tensors were written in place: writes the descriptor (seq,
  // epoch, ids, cursor, the tensors' names, dtypes, shapes and sizes) and hands it to every
  // member. An error (too many tensors, ids or a tensor larger than planned) publishes nothing
  // and leaves the slot claimed.
  Status Commit(int slot, const BatchView& batch);
  // Gives a claimed slot back unpublished.
  void Abandon(int slot);
  // No more batches: readers drain what is published, then see the end: of the data when
  // `complete`, else a stop before it (RingHeader::closed 1 or 2).
  void Close(bool complete);
  // No more batches here: the rank goes on in a new ring (kClosedMoved). Readers drain this
  // one and attach again.
  void CloseMoved();
  // Closed and every published batch released.
  bool Drained();
  uint64_t published() const;
  // Batches released by every member.
  uint64_t released();
  // Published batches not yet released or dropped.
  uint64_t unreleased();
  // Published batches `member` has not finished (not released, not dropped for it).
  uint64_t Unfinished(uint32_t member);
  // What waits for a member's reader: batches published and not taken, and how long ago the
  // reader last took one (-1: never); what the reader holds; and the reader's own stall
  // accounting from its control area (untrusted: for the profile only), with the attach
  // generation it belongs to (0: no reader; the counts start at 0 with every attach).
  struct Backlog {
    uint32_t ready = 0;
    uint32_t taken = 0;
    double seconds_since_take = -1;
    uint32_t generation = 0;
    uint64_t wait_ns = 0, hold_ns = 0;
  };
  Backlog backlog(uint32_t member = 0);
  // Drops the published batches below `seq` (all of them for UINT64_MAX) that no reader holds:
  // they will not be delivered to any member (a rewind makes them again). A batch a member's
  // reader holds stays with it and is withdrawn from the others. Returns how many slots freed.
  int DropReady(uint64_t seq = UINT64_MAX);
  // `member`'s trainer resumes at `seq` (its reader detached): the batches below it that it
  // has not taken are finished for it (a slot every member finished is free), and those from
  // `seq` on that it had finished are delivered to it again, as are batches made again from
  // `seq` on after a rewind. Returns how many were finished.
  int ResumeMember(uint32_t member, uint64_t seq);
  // The smallest seq among the published batches, or UINT64_MAX.
  uint64_t MinPublishedSeq();
  // The smallest seq among the published batches waiting for `member` (any member: -1) and
  // not held by it, or UINT64_MAX.
  uint64_t MinReadySeq(int member = -1);
  // The cursor after the last batch every member released, in seq order.
  StreamCursor acked();
  // A trainer resumes at `c`: the acknowledged cursor, unless a batch before it is still
  // published (another member has not finished it).
  void set_acked(const StreamCursor& c);

 private:
  // A slot's state, private: free, being written, or published (then each member's Mark).
  enum class Slot : uint8_t { kFree, kWriting, kPublished };
  // A published slot as one member stands with it: finished (released or dropped), waiting for
  // it, or held by its reader.
  enum class Mark : uint8_t { kDone, kReady, kTaken };
  struct Member {
    int control_fd = -1;
    uint8_t* control_base = nullptr;  // the current reader's control area, or null
    uint32_t generation = 0;
    std::vector<Mark> marks;  // per slot, meaningful while the slot is published
    // The member finished every batch below it (took them, or resumed after them): a batch
    // published again after a rewind below it is not delivered to it.
    uint64_t floor = 0;
    std::chrono::steady_clock::time_point last_take{};
    std::string violation;
  };
  RingWriter() = default;
  RingHeader* header() const { return reinterpret_cast<RingHeader*>(base_); }
  SlotDescriptor* slot(int i) const;
  SlotControl* control(const Member& m, int i) const;
  void SyncLocked();
  // The member's reader took published slot i.
  void Took(Member& m, uint32_t i);
  void SyncMemberLocked(Member& m);
  int DetachLocked(Member& m);
  void CutOff(Member& m, std::string why);
  // Member `m` is done with published slot i; frees it once every member is. `released`: by a
  // release (the acknowledged cursor moves on), not a drop.
  void FinishLocked(Member& m, uint32_t i, bool released);
  // The one way a published slot becomes free: once every member is done with it.
  void FreeIfFinishedLocked(uint32_t i, bool released);
  // Offers published slot i to member `m` (READY in its control word when its reader is there).
  void OfferLocked(Member& m, uint32_t i);
  // Takes back slot i's offer from `m`; false when it was not offered or its reader took it
  // meanwhile.
  bool WithdrawLocked(Member& m, uint32_t i);
  void SetClosed(uint32_t how);

  int fd_ = -1, ro_fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  // Private truth: the geometry below and the slot states, never read back from shared memory.
  uint32_t slot_count_ = 0;
  uint64_t slot_stride_ = 0, payload_offset_ = 0;
  SlotLayout layout_;
  std::mutex mu_;
  std::vector<Slot> state_;
  std::vector<Member> members_;
  uint64_t released_ = 0, dropped_ = 0;
  StreamCursor acked_;
};

// The trainer's side. Acquire is used by one thread; Release may be called from any thread.
class RingReader {
 public:
  // Maps the data area read-only and the control area read-write (takes ownership of both
  // fds) and validates both headers.
  static Result<std::unique_ptr<RingReader>> Map(int data_fd, int control_fd);
  ~RingReader();
  RingReader(const RingReader&) = delete;
  RingReader& operator=(const RingReader&) = delete;

  enum class Wait { kGot, kTimeout, kEnd };
  // Takes the published batch with the smallest seq. On kGot, *slot and *batch are set and
  // stay valid until Release(*slot). A descriptor that does not check out (bounds, dtype,
  // shape x element size != nbytes) is an error.
  Result<Wait> Acquire(int timeout_ms, int* slot, BatchView* batch);
  // Hands a taken slot back. Refused unless the slot is TAKEN by this reader's generation: a
  // stale release (after a takeover) or a foreign one frees nothing.
  Status Release(int slot);

  const RingHeader& header() const { return header_copy_; }
  // The read-only mapping of the data area (every batch's tensors lie inside it).
  const uint8_t* data() const { return base_; }
  uint64_t size() const { return size_; }
  // A second, copy-on-write mapping of the data area (mapped on first use), for handing
  // tensors to code that may write into them (torch): a write lands in a private page of this
  // process, never in the ring, and Release() drops a slot's private pages so the slot's next
  // batch reads the daemon's bytes again. Same offsets as data().
  Result<uint8_t*> CopyOnWriteView();
  // Whether a byte of [p, p + n) inside the copy-on-write view was written (its page is a
  // private copy, seen in /proc/self/pagemap). Pages not written are the ring's own.
  Result<bool> Written(const void* p, uint64_t n) const;
  // After kEnd: the daemon stopped before the end of the data.
  bool stopped_early() const {
    return shared_->closed.load(std::memory_order_acquire) == kClosedStopped;
  }
  // After kEnd: the rank goes on in a new ring; attach again, resuming after the last batch.
  bool moved() const { return shared_->closed.load(std::memory_order_acquire) == kClosedMoved; }

 private:
  RingReader() = default;
  // Drops the private pages of [off, off + n) of the copy-on-write view, if any.
  void DropWrites(uint64_t off, uint64_t n);
  Status ParseSlot(int i, BatchView* batch) const;
  const SlotDescriptor* slot(int i) const;
  SlotControl* control(int i) const;

  int fd_ = -1, control_fd_ = -1;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint8_t* control_base_ = nullptr;
  const RingHeader* shared_ = nullptr;
  RingHeader header_copy_;  // validated; the geometry is read from here, never from shared_
  uint32_t generation_ = 0;
  std::unique_ptr<std::atomic<uint64_t>[]> taken_at_ns_;  // per slot: when it was taken
  std::mutex cow_mu_;                                     // guards mapping the copy-on-write view
  std::atomic<uint8_t*> cow_{nullptr};                    // the copy-on-write view, once mapped
  int pagemap_fd_ = -1;  // /proc/self/pagemap, open while cow_ is mapped
};

// Futex helpers on a 32-bit word in a MAP_SHARED mapping (no FUTEX_PRIVATE_FLAG).
// Wait returns when *word != expected, on a wake, or after timeout_ms.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms);
void FutexWakeAll(std::atomic<uint32_t>* word);

}  // namespace mmfeed::shm
