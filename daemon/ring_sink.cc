#include "daemon/ring_sink.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "engine/mailbox.h"
#include "engine/trace.h"

namespace mmfeed {

RingSink::RingSink(uint32_t rank, std::vector<TensorSpec> specs,
                   std::unique_ptr<shm::RingWriter> ring)
    : rank_(rank),
      name_(fmt::format("ring{}", rank)),
      specs_(std::move(specs)),
      ring_(std::move(ring)) {}

Reservation RingSink::Reserve(BatchMemory* memory, int timeout_ms) {
  if (abort_.load(std::memory_order_acquire)) return Reservation::kClosed;
  uint64_t t0 = NowNs();
  int slot = ring_->AcquireFree(timeout_ms);
  if (slot < 0) {
    // Time without a free slot is the back-pressure this stage shows as "blocked".
    uint64_t now = NowNs(), since = full_since_ns_.exchange(0);
    counters_.blocked_ns.fetch_add(now - (since ? since : t0), std::memory_order_relaxed);
    full_since_ns_.store(now);
    return Reservation::kFull;
  }
  full_since_ns_.store(0);
  memory->handle = slot;
  memory->base.clear();
  for (uint64_t off : ring_->layout().tensor_offsets)
    memory->base.push_back(ring_->slot_data(slot) + off);
  return Reservation::kReserved;
}

void RingSink::Commit(const BatchMemory& memory, const BatchInfo& info) {
  WorkTimer timer(WorkTimer::Clocks::kPerItem);  // inside the batch stage's item
  shm::BatchView view;
  view.seq = info.seq;
  view.epoch = info.epoch;
  view.next = info.next;
  for (const std::string& id : info.ids) view.ids.emplace_back(id);
  for (size_t k = 0; k < specs_.size(); ++k) {
    const TensorSpec c = CommittedTensor(specs_[k], info, k);
    shm::TensorView t;
    t.name = c.name;
    t.dtype = static_cast<uint32_t>(c.dtype);
    t.shape = c.shape;
    t.nbytes = c.NumBytes();
    view.tensors.push_back(std::move(t));
  }
  Status st = ring_->Commit(memory.handle, view);
  if (!st.ok()) {  // the layout was planned from the same specs: this is a bug, not bad data
    spdlog::error("rank {}: batch {} not published: {}", rank_, info.seq, st.message());
    ring_->Abandon(memory.handle);
  }
  counters_.items.fetch_add(1, std::memory_order_relaxed);
  timer.AddTo(&counters_);
  if (trace::On())
    trace::Span(name_, "work", fmt::format("batch {}", info.seq), timer.start_ns(), NowNs());
}

Status RingSink::Reshape(std::vector<TensorSpec> specs, const shm::SlotLayout& layout) {
  MMFEED_RETURN_IF_ERROR(ring_->SetLayout(layout));
  specs_ = std::move(specs);
  return Status::Ok();
}

void RingSink::Discard(const BatchMemory& memory) { ring_->Abandon(memory.handle); }

void RingSink::Finish(bool complete) { ring_->Close(complete); }

}  // namespace mmfeed
