// The mmfeed client: what a trainer process links to receive batches. It depends on shm/ and
// base/ only.
//
// Client::Attach connects to the daemon's unix socket, asks for a consumer rank, receives the
// rank's ring (a read-only data area and a control area of its own) and maps it. Next() yields
// batches as zero-copy views into the ring. A batch is a lease: its slot stays held, and the
// ring mapped, for as long as any shared_ptr to it lives (a numpy array, a torch tensor or an
// in-flight copy can hold one), so a recycled slot can never be read as data. Dropping the
// last reference releases the slot, from any thread. Destroying the Client while batches are
// outstanding is safe: the mapping lives until the last of them goes.
//
// Keep the Client alive while training: the daemon serves the rank to this process until it
// exits. A client used in a forked child (a DataLoader worker) refuses with a clear error, and
// a batch dropped in a child does not release the parent's slot.
//
// Next() is for one thread at a time. A batch it takes from the ring is the caller's once Next()
// returns it: nothing in C++ can interrupt between the take and the return (the Python binding,
// where a signal handler's exception can, hands such a batch back: client/python/
// mmfeed_module.cc, Delivery).
#pragma once

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/cursor.h"
#include "base/status.h"
#include "client/control_protocol.h"
#include "shm/ring.h"

namespace mmfeed {

class Connection;  // the socket and the mapped ring of one attach

class Batch {
 public:
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  uint64_t seq() const { return view_.seq; }
  uint32_t epoch() const { return view_.epoch; }
  const std::vector<std::string_view>& ids() const { return view_.ids; }
  const std::vector<shm::TensorView>& tensors() const { return view_.tensors; }
  // nullptr if there is no tensor of that name.
  const shm::TensorView* tensor(std::string_view name) const;
  // The rank's cursor after this batch: attach with it to be served the batch after this one.
  // With the job's position (StreamCursor::order, position) when the daemon's order has one.
  StreamCursor cursor() const;
  // The ring mapping the batch lives in (one per attach: every batch of it shares it), with a
  // reference that keeps it mapped while held: what registering the ring with the CUDA runtime
  // needs (client/cuda_feeder.h).
  struct Mapping {
    const void* base = nullptr;
    uint64_t size = 0;
    std::shared_ptr<const void> owner;
    shm::RingReader* ring = nullptr;  // the ring's reader, alive while owner is held
  };
  Mapping mapping() const;
  // The same ring mapped copy-on-write (shm::RingReader::CopyOnWriteView), at the same offsets:
  // for handing tensors to code that may write into them. A write stays in this process and is
  // dropped when the batch is released.
  Result<Mapping> copy_on_write_mapping() const;

 private:
  friend class Client;
  Batch(std::shared_ptr<Connection> conn, int slot) : conn_(std::move(conn)), slot_(slot) {}
  std::shared_ptr<Connection> conn_;
  int slot_;
  shm::BatchView view_;
};

// The job shape the launcher put in this process's environment: torchrun's RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK (the node's rank; the node count is WORLD_SIZE /
// LOCAL_WORLD_SIZE), else Slurm's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
// SLURM_NNODES and SLURM_NTASKS_PER_NODE (else SLURM_NTASKS / SLURM_NNODES); with either,
// MMFEED_REPLICAS declares the model-parallel group size (JobShape::replicas). nullopt unless
// one launcher's five variables are all set (other launchers set some of them); an error names
// a variable that is malformed or inconsistent with the others.
Result<std::optional<JobShape>> JobShapeFromEnvironment();

struct AttachOptions {
  // Serve from the batch after this one (the cursor of the last batch the trainer finished);
  // without it the daemon's own acknowledged position is used.
  std::optional<StreamCursor> resume;
  // When the daemon goes away, keep trying to re-attach for this long (0: report it at once).
  double reconnect_s = 0;
  // The trainer's job, sent with the attach (a daemon with `consumers: auto` adopts it). Unset:
  // JobShapeFromEnvironment(), sent when its local rank is the rank attached.
  std::optional<JobShape> job;
};

class Client {
 public:
  // `rank` < 0: the job's local rank (AttachOptions::job, or the launcher's environment).
  static Result<std::unique_ptr<Client>> Attach(const std::string& socket_path, int rank,
                                                AttachOptions options = {});
  ~Client();

  // Waits up to `timeout_ms` (< 0: forever) for the next batch. Returns the batch, or nullptr
  // at the end of the data. Errors: kTimeout (with `explain_timeout`, saying why when the
  // daemon knows: its storage answering no request, WhyNoBatch); kUnavailable once the daemon
  // is gone (after the batches it had published were delivered) and could not be re-attached;
  // kInvalid in a forked child.
  Result<std::shared_ptr<Batch>> Next(int timeout_ms = -1, bool explain_timeout = true);
  // Why no batch came within `timeout_ms`, as the daemon's status tells (a request on the
  // control socket): its storage stalled, with the failing requests; else just that.
  std::string WhyNoBatch(int timeout_ms) const;
  const nlohmann::json& info() const { return info_; }
  int rank() const { return rank_; }

 private:
  Client() = default;
  Status Connect(const std::optional<StreamCursor>& resume);

  std::string socket_path_;
  int rank_ = 0;
  AttachOptions options_;
  int pid_ = 0;  // the attaching process
  std::shared_ptr<Connection> conn_;
  nlohmann::json info_;
  std::optional<StreamCursor> last_;  // cursor after the last batch Next() returned
};

}  // namespace mmfeed
