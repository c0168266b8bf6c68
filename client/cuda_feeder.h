// CudaFeeder: the last hop, from a ring slot to GPU memory. Built when CMake finds the CUDA
// toolkit (target mmfeed_cuda_feeder); everything else builds without it.
//
// Each ring mapping is registered once with cudaHostRegister (read-only, as the mapping is),
// so copies from it run at pinned-memory speed without a staging copy. Every batch's tensors
// are copied with cudaMemcpyAsync on the feeder's own stream into device buffers that are
// reused (two sets: double buffering; a set grows only when a larger tensor arrives, never a
// cudaMalloc per batch). Next() returns batch k, whose copy was started during the previous
// call, and starts the copy of batch k+1 before returning, so that copy overlaps the
// consumer's work on batch k. The consumer's stream waits on batch k's copy (an event: the
// host never blocks on the consumer's stream), and a buffer set is overwritten only after the
// work the consumer queued on its stream before its next Next() call. A ring slot is released
// only once its copy's event has completed (checked at each call).
//
// Errors name their cause: no GPU, no driver, a registration refused (the copies then go on
// from pageable memory, and stats() says why). The Client and its CPU batches are unaffected.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "client/client.h"

namespace mmfeed {

// "cudaHostRegister: invalid argument (cudaErrorInvalidValue)".
std::string CudaErrorText(const char* what, cudaError_t e);
// Ok if `device` can be used; otherwise why not (no device, no driver, out of range).
Status CudaAvailable(int device = 0);

struct DeviceTensor {
  std::string name;
  uint32_t dtype = 0;  // mmfeed::DType value
  std::vector<int64_t> shape;
  void* data = nullptr;  // device memory
  uint64_t nbytes = 0;
};

struct DeviceBatch {
  uint64_t seq = 0;
  uint32_t epoch = 0;
  StreamCursor cursor;  // the rank's cursor after this batch (checkpoint it)
  std::vector<std::string> ids;
  std::vector<DeviceTensor> tensors;
  const DeviceTensor* tensor(std::string_view name) const;
};

class CudaFeeder {
 public:
  struct Options {
    int device = 0;
    // Where the consumer works on the batches; the default (legacy) stream if null.
    cudaStream_t consumer_stream = nullptr;
    // Register each ring mapping with the CUDA runtime (false: copy from pageable memory, for
    // comparison).
    bool register_ring = true;
  };
  struct Stats {
    uint64_t batches = 0, bytes = 0;
    int registered_mappings = 0;
    std::string registration_error;  // why copies go from pageable memory; empty if they do not
  };

  // `client` must outlive the feeder.
  static Result<std::unique_ptr<CudaFeeder>> Create(Client* client, Options options);
  ~CudaFeeder();
  CudaFeeder(const CudaFeeder&) = delete;
  CudaFeeder& operator=(const CudaFeeder&) = delete;

  // The next batch in device memory, for work the caller queues on the consumer stream after
  // this returns; valid until the next call. nullptr at the end of the data. Errors: the
  // client's (kTimeout, kUnavailable, ...) and CUDA's.
  Result<const DeviceBatch*> Next(int timeout_ms = -1);
  const Stats& stats() const { return stats_; }
  cudaStream_t copy_stream() const { return stream_; }

 private:
  struct Buffers {
    std::vector<void*> device;
    std::vector<uint64_t> capacity;
    cudaEvent_t copied = nullptr;    // the copy into these buffers is done
    cudaEvent_t consumed = nullptr;  // the consumer's work on them is done
    bool consumer_pending = false;   // `consumed` was recorded and not yet waited on
    DeviceBatch batch;
  };
  struct Registration {
    const void* base;
    std::shared_ptr<const void> owner;  // keeps the mapping alive while registered
  };
  struct InFlight {
    std::shared_ptr<Batch> lease;
    cudaEvent_t copied;  // the event of the buffers its copy went to, recorded after it
  };

  CudaFeeder(Client* client, Options options) : client_(client), opt_(options) {}
  Status Init();
  Status Register(const Batch& b);
  Status StartCopy(std::shared_ptr<Batch> b, Buffers* to);
  void ReleaseCopied();

  Client* client_;
  Options opt_;
  cudaStream_t stream_ = nullptr;
  Buffers sets_[2];
  int returned_ = -1;               // the set Next() returned last, or -1
  int prefetched_ = -1;             // the set holding the next batch (its copy under way), or -1
  std::deque<InFlight> in_flight_;  // leases kept until their copy completed
  std::vector<Registration> registrations_;
  Status deferred_;  // an error of the prefetch, returned by the next call
  Stats stats_;
};

}  // namespace mmfeed
