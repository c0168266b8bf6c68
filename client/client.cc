#include "client/client.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "client/control_protocol.h"

namespace mmfeed {

// One attach: the socket to the daemon and the mapped ring. Shared by the Client and every
// batch leased from it, so the mapping outlives whichever goes last.
class Connection {
 public:
  ~Connection() {
    ring.reset();
    if (sock >= 0) ::close(sock);
  }
  int sock = -1;
  std::unique_ptr<shm::RingReader> ring;
  int owner_pid = 0;
  // The attach reply's "position" rule (docs/reference/control_protocol.md): how a cursor of epoch
  // >= `epoch` maps to the job's position. Unset when the daemon's order has none.
  struct PositionRule {
    uint32_t order = 0, epoch = 0;
    uint64_t streams = 0, batch_size = 0, base = 0;
    // A mixture's or shard windows': the lanes numbering the positions of epoch `epoch` from
    // `base` on, and of the other epochs (0: an order independent of the shape); a mixture's
    // with a source in shard windows: the nodes of those shapes too.
    uint32_t base_lanes = 0, lanes = 0, base_nodes = 0, nodes = 0;
    // Token-budget batches (the reply's "step_position"): the position is where the next step
    // starts, which each slot carries (SlotDescriptor::next_position), not batch x batch_size x
    // streams.
    bool budgeted = false;
  };
  std::optional<PositionRule> position;
};

namespace {

using Clock = std::chrono::steady_clock;

// How long a client whose ring moved (kClosedMoved) tries to attach again.
constexpr double kMovedReattachSeconds = 10;

// The daemon's end of the socket closed: it exited or was killed.
bool DaemonGone(int sock) {
  pollfd p{sock, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

Status ForkedChild(int owner) {
  return Status::Invalid(
      fmt::format("this mmfeed client was attached by pid {}; a forked process (pid {}) cannot use "
                  "it: attach again in the child",
                  owner, getpid()));
}

}  // namespace

StreamCursor Batch::cursor() const {
  StreamCursor c = view_.next;
  if (const auto& p = conn_->position; p && c.epoch >= p->epoch) {
    c.order = p->order;
    const bool from_base = c.epoch == p->epoch && p->base;
    if (!p->budgeted)  // else the slot's own (view_.next.position)
      c.position = (from_base ? p->base : 0) + c.batch * p->batch_size * p->streams;
    c.lanes = from_base ? p->base_lanes : p->lanes;
    c.nodes = from_base ? p->base_nodes : p->nodes;
  }
  return c;
}

Batch::~Batch() {
  // A forked child's copy of a lease is not the parent's slot to free.
  if (conn_->owner_pid == getpid()) (void)conn_->ring->Release(slot_);
}

Batch::Mapping Batch::mapping() const {
  return {conn_->ring->data(), conn_->ring->size(), conn_, conn_->ring.get()};
}

Result<Batch::Mapping> Batch::copy_on_write_mapping() const {
  MMFEED_ASSIGN_OR_RETURN(uint8_t * cow, conn_->ring->CopyOnWriteView());
  return Mapping{cow, conn_->ring->size(), conn_, conn_->ring.get()};
}

const shm::TensorView* Batch::tensor(std::string_view name) const {
  for (const auto& t : view_.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

// A launcher's variable: a non-negative integer, or -1 when it is not set.
Result<int> EnvCount(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (*end || errno || x < 0 || x > (1 << 24))
    return Status::Invalid(fmt::format("${} is '{}', not a rank or a count", name, v));
  return static_cast<int>(x);
}

// $MMFEED_REPLICAS: the model-parallel group size the trainer declares (0 when unset).
Result<int> EnvReplicas() {
  MMFEED_ASSIGN_OR_RETURN(int k, EnvCount("MMFEED_REPLICAS"));
  if (k == 0)
    return Status::Invalid(
        "$MMFEED_REPLICAS is 0: it is the number of consecutive local ranks that receive the "
        "same batches (1 or more)");
  return std::max(k, 0);
}

}  // namespace

Result<std::optional<JobShape>> JobShapeFromEnvironment() {
  // One launcher's five variables, or nullopt unless all are set: other launchers set some of
  // them (RANK, WORLD_SIZE and LOCAL_RANK alone are not torchrun's job, and a LOCAL_RANK set by
  // hand is not a job at all).
  using Five = std::array<int, 5>;
  auto read = [&](const std::array<const char*, 5>& names) -> Result<std::optional<Five>> {
    Five v;
    for (size_t k = 0; k < names.size(); ++k) {
      MMFEED_ASSIGN_OR_RETURN(v[k], EnvCount(names[k]));
      if (v[k] < 0) return std::optional<Five>();
    }
    return std::optional<Five>(v);
  };
  JobShape s;
  MMFEED_ASSIGN_OR_RETURN(std::optional<Five> torchrun, read({"RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                              "LOCAL_WORLD_SIZE", "GROUP_RANK"}));
  if (torchrun) {
    const auto [rank, world, local_rank, local_world, node] = *torchrun;
    if (local_world == 0 || world % local_world)
      return Status::Invalid(fmt::format(
          "$WORLD_SIZE {} is not a multiple of $LOCAL_WORLD_SIZE {}: mmfeed needs as many "
          "trainers on every node",
          world, local_world));
    s = {rank, world, local_rank, local_world, node, world / local_world, 0, "torchrun"};
  } else {
    MMFEED_ASSIGN_OR_RETURN(
        std::optional<Five> slurm,
        read({"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES"}));
    if (!slurm) return std::optional<JobShape>();
    const auto [rank, tasks, local_rank, node, nodes] = *slurm;
    MMFEED_ASSIGN_OR_RETURN(int per_node, EnvCount("SLURM_NTASKS_PER_NODE"));
    if (per_node < 0 && nodes > 0 && tasks % nodes == 0) per_node = tasks / nodes;
    if (per_node <= 0)
      return Status::Invalid(fmt::format(
          "$SLURM_NTASKS {} is not a multiple of $SLURM_NNODES {}: run as many tasks on every "
          "node (srun --ntasks-per-node)",
          tasks, nodes));
    s = {rank, tasks, local_rank, per_node, node, nodes, 0, "slurm"};
  }
  // The model-parallel group size, which no launcher says: the trainer's own variable.
  MMFEED_ASSIGN_OR_RETURN(s.replicas, EnvReplicas());
  MMFEED_ASSIGN_OR_RETURN(JobShape checked, JobShape::FromJson(s.ToJson()));
  return std::optional<JobShape>(checked);
}

Result<std::unique_ptr<Client>> Client::Attach(const std::string& socket_path, int rank,
                                               AttachOptions options) {
  if (!options.job) {
    // With an explicit rank the environment only adds the job, when it is one and of that rank:
    // it never stops an attach that worked without it.
    Result<std::optional<JobShape>> env = JobShapeFromEnvironment();
    if (!env.ok() && rank < 0) return env.status();
    if (env.ok() && *env && (rank < 0 || rank == (*env)->local_rank)) options.job = **env;
  }
  // A declared model-parallel group is never dropped: a group fed other batches than its peers
  // trains on garbage. A job declared without one takes it; with no job to carry it, refused.
  MMFEED_ASSIGN_OR_RETURN(const int replicas, EnvReplicas());
  if (replicas && !options.job)
    return Status::Invalid(fmt::format(
        "$MMFEED_REPLICAS is {} but this attach declares no job to carry it: run the trainer "
        "under torchrun or srun (their variables give the job, with this rank as the local "
        "rank), or declare the job (mmfeed-consume --job NODES,NODE,PER_NODE,{})",
        replicas, replicas));
  if (replicas && options.job->replicas == 0) {
    options.job->replicas = replicas;
    MMFEED_ASSIGN_OR_RETURN(options.job, JobShape::FromJson(options.job->ToJson()));
  }
  if (rank < 0 && options.job) rank = options.job->local_rank;
  if (const char* local = std::getenv("LOCAL_RANK"); rank < 0 && local && *local) {
    char* end = nullptr;
    const long r = std::strtol(local, &end, 10);
    if (*end || r < 0 || r > INT32_MAX)
      return Status::Invalid(fmt::format("$LOCAL_RANK is '{}', not a rank", local));
    rank = static_cast<int>(r);
  }
  if (rank < 0)
    return Status::Invalid(
        "no rank given and no launcher's variables to take it from (torchrun's LOCAL_RANK, "
        "Slurm's SLURM_LOCALID...): give the trainer's consumer rank");
  std::unique_ptr<Client> c(new Client());
  c->socket_path_ = socket_path;
  c->rank_ = rank;
  c->options_ = options;
  c->pid_ = getpid();
  // With reconnect_s, a daemon that is restarting (no socket yet, or killed during the
  // attach) is waited for as Next() waits for one; a refusal is returned at once.
  const auto until =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.reconnect_s * 1000));
  while (true) {
    Status st = c->Connect(options.resume);
    if (st.ok()) break;
    const bool unreachable =
        st.code() == Status::Code::kUnavailable || st.code() == Status::Code::kIo;
    if (!unreachable || Clock::now() >= until) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return c;
}

Status Client::Connect(const std::optional<StreamCursor>& resume) {
  MMFEED_ASSIGN_OR_RETURN(int fd, ConnectControl(socket_path_));
  auto conn = std::make_shared<Connection>();
  conn->sock = fd;
  conn->owner_pid = pid_;
  nlohmann::json req = {{"cmd", "attach"}, {"rank", rank_}};
  if (resume) req["resume"] = CursorToJson(*resume);
  if (options_.job) req["job"] = options_.job->ToJson();
  MMFEED_RETURN_IF_ERROR(SendControlLine(conn->sock, req));
  std::vector<int> fds;
  Result<nlohmann::json> reply = RecvControlReply(conn->sock, &fds, 10000);
  if (!reply.ok() || fds.size() != 2) {
    for (int f : fds) ::close(f);
    if (!reply.ok()) return reply.status().WithContext(fmt::format("attach rank {}", rank_));
    return Status::Io("mmfeedd did not pass the ring's two file descriptors");
  }
  Result<std::unique_ptr<shm::RingReader>> ring = shm::RingReader::Map(fds[0], fds[1]);
  if (!ring.ok()) return ring.status();
  conn->ring = std::move(ring.value());
  // A token budget's rule comes as "step_position": the positions are the slots'.
  const bool budgeted = reply->contains("step_position");
  if (const nlohmann::json& p =
          reply->value(budgeted ? "step_position" : "position", nlohmann::json());
      p.is_object()) {
    try {
      conn->position = Connection::PositionRule{p.at("order").get<uint32_t>(),
                                                p.at("epoch").get<uint32_t>(),
                                                p.at("streams").get<uint64_t>(),
                                                p.at("batch_size").get<uint64_t>(),
                                                p.at("base").get<uint64_t>(),
                                                p.value("base_lanes", 0u),
                                                p.value("lanes", 0u),
                                                p.value("base_nodes", 0u),
                                                p.value("nodes", 0u),
                                                budgeted};
    } catch (const nlohmann::json::exception& e) {
      return Status::Invalid(fmt::format("mmfeedd's attach reply has a malformed \"{}\": {}",
                                         budgeted ? "step_position" : "position", e.what()));
    }
  }
  conn_ = std::move(conn);
  info_ = *reply;
  return Status::Ok();
}

Client::~Client() = default;

std::string Client::WhyNoBatch(int timeout_ms) const {
  std::string why = fmt::format("no batch within {:.1f} s", timeout_ms / 1000.0);
  // The daemon says whether its storage answers (a short request: the trainer waited already).
  Result<nlohmann::json> status = ControlRequest(socket_path_, {{"cmd", "status"}}, 2000);
  if (!status.ok() || !(*status)["status"].contains("storage_stalled") ||
      (*status)["status"]["storage_stalled"].is_null())
    return why;
  const nlohmann::json& st = (*status)["status"]["storage_stalled"];
  why += fmt::format(": the daemon's storage has answered no request for {:.0f} s",
                     st["stalled_seconds"].get<double>());
  for (const auto& r : st["requests"])
    why += fmt::format("; {}: {}", r["url"].get<std::string>(), r["error"].get<std::string>());
  return why + " (the daemon waits for it, skipping no sample, and goes on when it answers)";
}

Result<std::shared_ptr<Batch>> Client::Next(int timeout_ms, bool explain_timeout) {
  if (getpid() != pid_) return ForkedChild(pid_);
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  auto reconnect_until = Clock::time_point::min();
  while (true) {
    if (!conn_) {  // the daemon went away: re-attach after the last batch delivered
      Status st = Connect(last_);
      if (!st.ok()) {
        if (Clock::now() >= reconnect_until)
          return Status::Unavailable(
              fmt::format("mmfeedd went away before the end of the data and did not come back "
                          "within {:.0f}s ({})",
                          options_.reconnect_s, st.message()));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
    }
    // Wait in short steps so that a dead daemon is noticed within 100 ms.
    int step = timeout_ms < 0 ? 100 : std::min(100, RemainingMs(deadline));
    int slot = -1;
    shm::BatchView view;
    MMFEED_ASSIGN_OR_RETURN(shm::RingReader::Wait w, conn_->ring->Acquire(step, &slot, &view));
    if (w == shm::RingReader::Wait::kGot) {
      std::shared_ptr<Batch> b(new Batch(conn_, slot));
      b->view_ = std::move(view);
      last_ = b->cursor();
      return b;
    }
    if (w == shm::RingReader::Wait::kEnd) {
      if (conn_->ring->moved()) {  // a reload made a larger ring: attach again, right after last_
        conn_.reset();
        reconnect_until =
            Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(
                               std::max(options_.reconnect_s, kMovedReattachSeconds) * 1000));
        continue;
      }
      if (conn_->ring->stopped_early())
        return Status::Closed("mmfeedd stopped before the end of the data");
      return std::shared_ptr<Batch>();
    }
    if (DaemonGone(conn_->sock)) {  // and every batch it had published was delivered
      if (options_.reconnect_s <= 0)
        return Status::Unavailable(
            "mmfeedd went away before the end of the data (the connection closed)");
      conn_.reset();  // outstanding batches keep the old mapping alive
      reconnect_until = Clock::now() + std::chrono::milliseconds(
                                           static_cast<int64_t>(options_.reconnect_s * 1000));
      continue;
    }
    if (timeout_ms >= 0 && Clock::now() >= deadline)
      return Status::Timeout(explain_timeout ? WhyNoBatch(timeout_ms)
                                             : "no batch within the timeout");
  }
}

}  // namespace mmfeed
