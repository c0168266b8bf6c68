#include "client/cuda_feeder.h"

#include <fmt/format.h>

#include <algorithm>

namespace mmfeed {

std::string CudaErrorText(const char* what, cudaError_t e) {
  return fmt::format("{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

Status CudaAvailable(int device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0))
    return Status::Unavailable("no CUDA device on this machine (" +
                               CudaErrorText("cudaGetDeviceCount", e) + ")");
  if (e == cudaErrorInsufficientDriver)
    return Status::Unavailable("no usable NVIDIA driver: " +
                               CudaErrorText("cudaGetDeviceCount", e));
  if (e != cudaSuccess) return Status::Unavailable(CudaErrorText("cudaGetDeviceCount", e));
  if (device < 0 || device >= count)
    return Status::Invalid(
        fmt::format("CUDA device {} does not exist ({} device(s))", device, count));
  return Status::Ok();
}

const DeviceTensor* DeviceBatch::tensor(std::string_view name) const {
  for (const DeviceTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

#define MMFEED_CUDA_RETURN(what, call)                                 \
  do {                                                                 \
    cudaError_t e_ = (call);                                           \
    if (e_ != cudaSuccess) return Status::Io(CudaErrorText(what, e_)); \
  } while (0)

Result<std::unique_ptr<CudaFeeder>> CudaFeeder::Create(Client* client, Options options) {
  MMFEED_RETURN_IF_ERROR(CudaAvailable(options.device));
  std::unique_ptr<CudaFeeder> f(new CudaFeeder(client, options));
  MMFEED_RETURN_IF_ERROR(f->Init());
  return f;
}

Status CudaFeeder::Init() {
  MMFEED_CUDA_RETURN("cudaSetDevice", cudaSetDevice(opt_.device));
  MMFEED_CUDA_RETURN("cudaStreamCreate",
                     cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  for (Buffers& s : sets_) {
    MMFEED_CUDA_RETURN("cudaEventCreate",
                       cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    MMFEED_CUDA_RETURN("cudaEventCreate",
                       cudaEventCreateWithFlags(&s.consumed, cudaEventDisableTiming));
  }
  return Status::Ok();
}

CudaFeeder::~CudaFeeder() {
  if (stream_) cudaStreamSynchronize(stream_);  // every copy done before the leases go
  in_flight_.clear();
  for (Buffers& s : sets_) {
    for (void* p : s.device) cudaFree(p);
    if (s.copied) cudaEventDestroy(s.copied);
    if (s.consumed) cudaEventDestroy(s.consumed);
  }
  for (const Registration& r : registrations_) cudaHostUnregister(const_cast<void*>(r.base));
  if (stream_) cudaStreamDestroy(stream_);
}

// Registers the batch's ring mapping once; mappings no lease refers to any more (a re-attach
// made a new one) are unregistered first.
Status CudaFeeder::Register(const Batch& b) {
  Batch::Mapping m = b.mapping();
  for (auto it = registrations_.begin(); it != registrations_.end();) {
    if (it->base != m.base && it->owner.use_count() == 1) {
      cudaHostUnregister(const_cast<void*>(it->base));
      it = registrations_.erase(it);
    } else {
      ++it;
    }
  }
  if (!opt_.register_ring || !stats_.registration_error.empty()) return Status::Ok();
  for (const Registration& r : registrations_)
    if (r.base == m.base) return Status::Ok();
  // The mapping is read-only: register it so (CUDA 11.1+), else the runtime would refuse it.
  cudaError_t e = cudaHostRegister(const_cast<void*>(m.base), m.size,
                                   cudaHostRegisterPortable | cudaHostRegisterReadOnly);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    stats_.registration_error = fmt::format(
        "{} for the {:.1f} MiB ring; copies go from pageable memory (check the locked-memory "
        "limit, ulimit -l, and that the device supports read-only registration)",
        CudaErrorText("cudaHostRegister", e), m.size / 1048576.0);
    return Status::Ok();
  }
  registrations_.push_back({m.base, m.owner});
  ++stats_.registered_mappings;
  return Status::Ok();
}

Status CudaFeeder::StartCopy(std::shared_ptr<Batch> b, Buffers* to) {
  MMFEED_RETURN_IF_ERROR(Register(*b));
  // The consumer's work on these buffers (queued before it asked for the next batch) first.
  if (to->consumer_pending) {
    MMFEED_CUDA_RETURN("cudaStreamWaitEvent", cudaStreamWaitEvent(stream_, to->consumed, 0));
    to->consumer_pending = false;
  }
  DeviceBatch& out = to->batch;
  out.seq = b->seq();
  out.epoch = b->epoch();
  out.cursor = b->cursor();
  out.ids.assign(b->ids().begin(), b->ids().end());
  out.tensors.clear();
  const auto& tensors = b->tensors();
  to->device.resize(std::max(to->device.size(), tensors.size()), nullptr);
  to->capacity.resize(to->device.size(), 0);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const shm::TensorView& t = tensors[k];
    if (to->capacity[k] < t.nbytes) {  // grows once; the old buffer's copies are ordered before
      if (to->device[k]) {
        MMFEED_CUDA_RETURN("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
        cudaFree(to->device[k]);
        to->device[k] = nullptr;
        to->capacity[k] = 0;
      }
      MMFEED_CUDA_RETURN("cudaMalloc", cudaMalloc(&to->device[k], t.nbytes));
      to->capacity[k] = t.nbytes;
    }
    MMFEED_CUDA_RETURN("cudaMemcpyAsync", cudaMemcpyAsync(to->device[k], t.data, t.nbytes,
                                                          cudaMemcpyHostToDevice, stream_));
    out.tensors.push_back({t.name, t.dtype, t.shape, to->device[k], t.nbytes});
    stats_.bytes += t.nbytes;
  }
  MMFEED_CUDA_RETURN("cudaEventRecord", cudaEventRecord(to->copied, stream_));
  in_flight_.push_back({std::move(b), to->copied});
  return Status::Ok();
}

// Releases, in order, the leases whose copy has completed.
void CudaFeeder::ReleaseCopied() {
  while (!in_flight_.empty() && cudaEventQuery(in_flight_.front().copied) == cudaSuccess)
    in_flight_.pop_front();
}

Result<const DeviceBatch*> CudaFeeder::Next(int timeout_ms) {
  if (!deferred_.ok()) {  // the client's error met while prefetching, after the batch returned
    Status st = deferred_;
    deferred_ = Status::Ok();
    return st;
  }
  // The consumer is done queueing work on the batch returned last time.
  if (returned_ >= 0) {
    Buffers& done = sets_[returned_];
    MMFEED_CUDA_RETURN("cudaEventRecord", cudaEventRecord(done.consumed, opt_.consumer_stream));
    done.consumer_pending = true;
  }
  if (prefetched_ < 0) {  // nothing under way: wait for the next batch and copy it
    MMFEED_ASSIGN_OR_RETURN(std::shared_ptr<Batch> b, client_->Next(timeout_ms));
    if (!b) {
      returned_ = -1;
      return static_cast<const DeviceBatch*>(nullptr);
    }
    prefetched_ = returned_ == 0 ? 1 : 0;
    MMFEED_RETURN_IF_ERROR(StartCopy(std::move(b), &sets_[prefetched_]));
  }
  const int now = prefetched_;
  prefetched_ = -1;
  MMFEED_CUDA_RETURN("cudaStreamWaitEvent",
                     cudaStreamWaitEvent(opt_.consumer_stream, sets_[now].copied, 0));
  // Start the following batch's copy into the other set, if one is ready (never waits here).
  Result<std::shared_ptr<Batch>> following = client_->Next(0);
  if (following.ok() && *following) {
    prefetched_ = 1 - now;
    MMFEED_RETURN_IF_ERROR(StartCopy(std::move(following.value()), &sets_[prefetched_]));
  } else if (!following.ok() && following.status().code() != Status::Code::kTimeout) {
    deferred_ = following.status();
  }
  returned_ = now;
  ReleaseCopied();
  ++stats_.batches;
  return static_cast<const DeviceBatch*>(&sets_[now].batch);
}

}  // namespace mmfeed
