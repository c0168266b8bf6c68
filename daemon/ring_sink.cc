#include "daemon/ring_sink.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "stages/runtime/numa.h"

namespace mmfeed {

RingSink::RingSink(uint32_t rank, std::unique_ptr<shm::RingWriter> ring, size_t pending)
    : rank_(rank), name_(fmt::format("ring{}", rank)), ring_(std::move(ring)), inbox_(pending) {}

RingSink::~RingSink() {
  Abort();
  Join();
}

void RingSink::Put(std::unique_ptr<Batch> batch) { inbox_.Push(std::move(batch), &unused_.blocked_ns); }

void RingSink::Finish() { inbox_.Close(1); }

void RingSink::Start() { thread_ = std::thread([this] { Loop(); }); }

void RingSink::Abort() { abort_.store(true, std::memory_order_release); }

void RingSink::Join() {
  if (thread_.joinable()) thread_.join();
}

StageInfo RingSink::info() const { return {name_, "ring", 1, inbox_.capacity(), &counters_}; }

void RingSink::Loop() {
  PinAndNameThisThread({}, "mmf:" + name_);
  while (true) {
    std::unique_ptr<Batch> batch = inbox_.Pop(&counters_.starved_ns);
    if (!batch) break;
    counters_.fill_sum.fetch_add(inbox_.SizeApprox(), std::memory_order_relaxed);
    counters_.fill_samples.fetch_add(1, std::memory_order_relaxed);
    if (abort_.load(std::memory_order_acquire)) {
      undelivered_.fetch_add(1);
      continue;
    }
    uint64_t t0 = NowNs();
    int slot = -1;
    while (slot < 0 && !abort_.load(std::memory_order_acquire)) slot = ring_->AcquireFree(100);
    counters_.blocked_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
    if (slot < 0) {
      undelivered_.fetch_add(1);
      continue;
    }
    t0 = NowNs();
    uint64_t c0 = ThreadCpuNs();
    shm::BatchView view;
    view.seq = batch->seq;
    view.epoch = batch->epoch;
    for (const std::string& id : batch->ids) view.ids.emplace_back(id);
    for (size_t k = 0; k < batch->specs.size(); ++k) {
      shm::TensorView t{batch->specs[k].name, static_cast<uint32_t>(batch->specs[k].dtype), batch->BatchShape(k)};
      t.row_bytes = batch->specs[k].NumBytes();
      t.nbytes = t.row_bytes * batch->rows.size();
      for (const auto& row : batch->rows) t.rows.push_back(row[k].data.data());
      view.tensors.push_back(std::move(t));
    }
    Status st = ring_->Publish(slot, view);
    if (!st.ok()) {
      spdlog::error("rank {}: batch {} not delivered: {}", rank_, batch->seq, st.message());
      undelivered_.fetch_add(1);
    } else {
      written_.fetch_add(1);
    }
    counters_.busy_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
    counters_.cpu_ns.fetch_add(ThreadCpuNs() - c0, std::memory_order_relaxed);
    counters_.items.fetch_add(1, std::memory_order_relaxed);
  }
  ring_->Close();
  done_.store(true, std::memory_order_release);
}

}  // namespace mmfeed
