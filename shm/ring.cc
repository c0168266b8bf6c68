#include "shm/ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>

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

Result<std::unique_ptr<RingWriter>> RingWriter::Create(uint32_t rank, uint32_t num_ranks,
                                                       uint32_t slot_count, const SlotLayout& layout) {
  std::unique_ptr<RingWriter> w(new RingWriter());
  w->layout_ = layout;
  uint64_t stride = AlignUp(layout.slot_bytes, kPageBytes);
  w->size_ = kPageBytes + stride * slot_count;
  std::string name = fmt::format("mmfeed-ring-{}", rank);
  w->fd_ = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (w->fd_ < 0) return Status::Io(fmt::format("memfd_create: {}", std::strerror(errno)));
  if (ftruncate(w->fd_, static_cast<off_t>(w->size_)) != 0)
    return Status::Io(fmt::format("ftruncate ring {} to {} bytes: {}", rank, w->size_, std::strerror(errno)));
  int rc = posix_fallocate(w->fd_, 0, static_cast<off_t>(w->size_));
  if (rc != 0)
    return Status::Io(fmt::format("reserving {} bytes for ring {}: {}", w->size_, rank, std::strerror(rc)));
  if (fcntl(w->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return Status::Io(fmt::format("sealing ring {}: {}", rank, std::strerror(errno)));
  void* p = mmap(nullptr, w->size_, PROT_READ | PROT_WRITE, MAP_SHARED, w->fd_, 0);
  if (p == MAP_FAILED) return Status::Io(fmt::format("mmap ring {}: {}", rank, std::strerror(errno)));
  w->base_ = static_cast<uint8_t*>(p);
  RingHeader* h = w->header();
  new (h) RingHeader();
  h->magic = kRingMagic;
  h->layout_version = kRingLayoutVersion;
  h->header_bytes = sizeof(RingHeader);
  h->total_bytes = w->size_;
  h->slots_offset = kPageBytes;
  h->slot_stride = stride;
  h->payload_offset = AlignUp(sizeof(SlotDescriptor) + layout.ids_capacity, kPageBytes);
  h->slot_count = slot_count;
  h->rank = rank;
  h->num_ranks = num_ranks;
  for (uint32_t i = 0; i < slot_count; ++i) new (w->slot(static_cast<int>(i))) SlotDescriptor();
  return w;
}

RingWriter::~RingWriter() {
  if (base_) munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

SlotDescriptor* RingWriter::slot(int i) const {
  return reinterpret_cast<SlotDescriptor*>(base_ + header()->slots_offset + header()->slot_stride * i);
}

int RingWriter::AcquireFree(int timeout_ms) {
  RingHeader* h = header();
  uint32_t seen = h->release_futex.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < h->slot_count; ++i) {
    uint32_t expected = kSlotFree;
    if (slot(i)->state.compare_exchange_strong(expected, kSlotWriting, std::memory_order_acquire))
      return static_cast<int>(i);
  }
  if (timeout_ms > 0) FutexWait(&h->release_futex, seen, timeout_ms);
  return -1;
}

uint8_t* RingWriter::slot_data(int index) const { return reinterpret_cast<uint8_t*>(slot(index)); }

Status RingWriter::Commit(int index, const BatchView& batch) {
  RingHeader* h = header();
  SlotDescriptor* d = slot(index);
  uint8_t* slot_base = reinterpret_cast<uint8_t*>(d);
  if (batch.tensors.size() > kMaxTensors || batch.tensors.size() > layout_.tensor_offsets.size())
    return Status::Invalid(fmt::format("batch has {} tensors, the ring planned {} (at most {})", batch.tensors.size(),
                                       layout_.tensor_offsets.size(), kMaxTensors));
  uint64_t ids_bytes = 0;
  for (auto id : batch.ids) ids_bytes += id.size() + 1;
  if (ids_bytes > layout_.ids_capacity)
    return Status::TooLarge(fmt::format("batch ids need {} bytes, slots hold {}", ids_bytes, layout_.ids_capacity));
  for (size_t i = 0; i < batch.tensors.size(); ++i)
    if (batch.tensors[i].nbytes > layout_.tensor_capacity[i] || batch.tensors[i].shape.size() > kMaxDims)
      return Status::TooLarge(fmt::format("tensor '{}' ({} bytes) exceeds its planned {} bytes", batch.tensors[i].name,
                                          batch.tensors[i].nbytes, layout_.tensor_capacity[i]));
  d->seq = batch.seq;
  d->epoch = batch.epoch;
  d->num_samples = static_cast<uint32_t>(batch.ids.size());
  d->num_tensors = static_cast<uint32_t>(batch.tensors.size());
  d->ids_offset = sizeof(SlotDescriptor);
  d->ids_bytes = ids_bytes;
  uint8_t* p = slot_base + d->ids_offset;
  for (auto id : batch.ids) {
    std::memcpy(p, id.data(), id.size());
    p[id.size()] = 0;
    p += id.size() + 1;
  }
  uint64_t end = h->payload_offset;
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
  d->payload_bytes = end - h->payload_offset;
  d->reader_mask = 1;
  d->state.store(kSlotReady, std::memory_order_release);
  h->published.fetch_add(1, std::memory_order_release);
  h->publish_futex.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&h->publish_futex);
  return Status::Ok();
}

void RingWriter::Abandon(int index) {
  slot(index)->state.store(kSlotFree, std::memory_order_release);
  header()->release_futex.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&header()->release_futex);
}

void RingWriter::Close() {
  header()->closed.store(1, std::memory_order_release);
  header()->publish_futex.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&header()->publish_futex);
}

int RingWriter::Reclaim() {
  int n = 0;
  for (uint32_t i = 0; i < header()->slot_count; ++i) {
    uint32_t expected = kSlotTaken;
    if (slot(i)->state.compare_exchange_strong(expected, kSlotReady, std::memory_order_acq_rel)) ++n;
  }
  if (n) {
    header()->publish_futex.fetch_add(1, std::memory_order_release);
    FutexWakeAll(&header()->publish_futex);
  }
  return n;
}

bool RingWriter::Drained() const {
  if (!header()->closed.load(std::memory_order_acquire)) return false;
  for (uint32_t i = 0; i < header()->slot_count; ++i)
    if (slot(i)->state.load(std::memory_order_acquire) != kSlotFree) return false;
  return true;
}

uint64_t RingWriter::published() const { return header()->published.load(std::memory_order_acquire); }
uint64_t RingWriter::released() const { return header()->released.load(std::memory_order_acquire); }

// ---------------------------------------------------------------- reader

Result<std::unique_ptr<RingReader>> RingReader::Map(int fd) {
  std::unique_ptr<RingReader> r(new RingReader());
  r->fd_ = fd;
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::Io(fmt::format("fstat ring: {}", std::strerror(errno)));
  r->size_ = static_cast<uint64_t>(st.st_size);
  if (r->size_ < kPageBytes) return Status::Corrupt(fmt::format("ring is {} bytes, smaller than its header", r->size_));
  void* p = mmap(nullptr, r->size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::Io(fmt::format("mmap ring: {}", std::strerror(errno)));
  r->base_ = static_cast<uint8_t*>(p);
  r->shared_ = reinterpret_cast<RingHeader*>(r->base_);
  std::memcpy(static_cast<void*>(&r->header_copy_), r->base_, sizeof(RingHeader));
  const RingHeader& h = r->header_copy_;
  if (h.magic != kRingMagic) return Status::Corrupt("not an mmfeed ring (bad magic)");
  if (h.layout_version != kRingLayoutVersion)
    return Status::Unsupported(fmt::format("ring layout version {}, this client speaks {}", h.layout_version, kRingLayoutVersion));
  if (h.header_bytes != sizeof(RingHeader)) return Status::Corrupt("ring header size mismatch");
  if (h.total_bytes != r->size_) return Status::Corrupt(fmt::format("ring says {} bytes, mapping has {}", h.total_bytes, r->size_));
  if (h.slots_offset % kPageBytes || h.slot_stride % kPageBytes || h.payload_offset % kPageBytes ||
      h.slot_stride == 0 || h.slot_count == 0 || h.payload_offset >= h.slot_stride)
    return Status::Corrupt("ring geometry is not page aligned");
  __uint128_t end = static_cast<__uint128_t>(h.slot_stride) * h.slot_count + h.slots_offset;
  if (end != h.total_bytes) return Status::Corrupt("ring slots do not fill the mapping");
  return r;
}

RingReader::~RingReader() {
  if (base_) munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

SlotDescriptor* RingReader::slot(int i) const {
  return reinterpret_cast<SlotDescriptor*>(base_ + header_copy_.slots_offset + header_copy_.slot_stride * i);
}

Status RingReader::ParseSlot(int i, BatchView* batch) const {
  const SlotDescriptor* d = slot(i);
  const uint8_t* base = reinterpret_cast<const uint8_t*>(d);
  const uint64_t stride = header_copy_.slot_stride;
  auto inside = [&](uint64_t off, uint64_t n) { return off <= stride && n <= stride - off; };
  if (d->num_tensors > kMaxTensors) return Status::Corrupt(fmt::format("slot {}: {} tensors", i, d->num_tensors));
  if (!inside(d->ids_offset, d->ids_bytes)) return Status::Corrupt(fmt::format("slot {}: ids out of bounds", i));
  batch->seq = d->seq;
  batch->epoch = d->epoch;
  batch->ids.clear();
  const char* ids = reinterpret_cast<const char*>(base + d->ids_offset);
  uint64_t pos = 0;
  for (uint32_t k = 0; k < d->num_samples; ++k) {
    const void* nul = std::memchr(ids + pos, 0, d->ids_bytes - pos);
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
  for (int attempt = 0; attempt < 2; ++attempt) {
    uint32_t seen = shared_->publish_futex.load(std::memory_order_acquire);
    bool closed = shared_->closed.load(std::memory_order_acquire);
    int best = -1;
    uint64_t best_seq = 0;
    for (uint32_t i = 0; i < header_copy_.slot_count; ++i) {
      SlotDescriptor* d = slot(static_cast<int>(i));
      if (d->state.load(std::memory_order_acquire) == kSlotReady && (best < 0 || d->seq < best_seq)) {
        best = static_cast<int>(i);
        best_seq = d->seq;
      }
    }
    if (best >= 0) {
      uint32_t expected = kSlotReady;
      if (slot(best)->state.compare_exchange_strong(expected, kSlotTaken, std::memory_order_acquire)) {
        Status st = ParseSlot(best, batch);
        if (!st.ok()) {
          Release(best);
          return st;
        }
        *out_slot = best;
        return Wait::kGot;
      }
      continue;
    }
    if (closed) return Wait::kEnd;
    if (attempt == 0) FutexWait(&shared_->publish_futex, seen, timeout_ms);
  }
  return Wait::kTimeout;
}

void RingReader::Release(int i) {
  SlotDescriptor* d = slot(i);
  d->reader_mask = 0;
  d->state.store(kSlotFree, std::memory_order_release);
  shared_->released.fetch_add(1, std::memory_order_release);
  shared_->release_futex.fetch_add(1, std::memory_order_release);
  FutexWakeAll(&shared_->release_futex);
}

}  // namespace mmfeed::shm
