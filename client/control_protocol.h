// The control protocol (docs/reference/control_protocol.md), both ends: one JSON object per line on
// a Unix socket, one reply line per request, file descriptors passed with an attach's reply. The
// daemon parses requests here (daemon/control_server.cc; apart from the server so that it can be
// fuzzed on its own: any line yields a command or a message saying what is wrong with it, never an
// exception); the client library and mmfeedctl send them through the functions below. Needs base/
// only.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/cursor.h"
#include "base/status.h"

namespace mmfeed {

// Where mmfeedd listens unless told otherwise (--socket), and where the systemd service's
// listens (daemon/systemd/mmfeed.service.in).
inline constexpr char kDefaultSocket[] = "/tmp/mmfeed.sock";
inline constexpr char kServiceSocket[] = "/run/mmfeed/mmfeed.sock";

// The job a trainer process belongs to, as its launcher says (torchrun's or Slurm's variables,
// or explicit arguments; client/client.h, JobShapeFromEnvironment): what a daemon with
// `consumers: auto` adopts. A node runs `local_world_size` trainers, one per
// consumer rank; the job has `num_nodes` such nodes, this one is `node_rank`.
struct JobShape {
  int rank = 0, world_size = 1;              // the trainer's global rank, of world_size
  int local_rank = 0, local_world_size = 1;  // on this node
  int node_rank = 0, num_nodes = 1;
  // The model-parallel group size the trainers declare ($MMFEED_REPLICAS, mmfeed-consume --job's
  // fourth field): that many consecutive local ranks receive the same batches, as `replicas:`
  // says; 0: not declared. A divisor of local_world_size.
  int replicas = 0;
  std::string from;  // "torchrun", "slurm" or "arguments"

  bool operator==(const JobShape& o) const {  // the shape, not who said it (nor replicas)
    return world_size == o.world_size && local_world_size == o.local_world_size &&
           node_rank == o.node_rank && num_nodes == o.num_nodes;
  }
  // "2 node(s) x 2 rank(s), this node 1" (", in groups of 2 (replicas)" when declared).
  std::string Describe() const;
  nlohmann::json ToJson() const;
  // Refuses fields out of range or inconsistent (world_size != num_nodes x local_world_size).
  static Result<JobShape> FromJson(const nlohmann::json& j);
};

struct ControlCommand {
  enum class Cmd { kAttach, kStatus, kStop, kReload, kProfile, kEndJob };
  Cmd cmd = Cmd::kStatus;
  int rank = -1;                       // attach
  std::optional<StreamCursor> resume;  // attach: serve from this cursor
  std::optional<JobShape> job;         // attach: the trainer's job, when it declares one
  std::string config;                  // reload: the config file; empty: the running one's
  bool at_batch = false;               // reload: "at": "batch" (a mixture's weights only)
  double seconds = 5;                  // profile: the window
  bool trace = false;                  // profile: record a trace of the window too
};

// The longest profile window a request may ask for.
constexpr double kMaxProfileSeconds = 600;

Result<ControlCommand> ParseControlRequest(std::string_view line);

// The sending end. ConnectControl: a connected socket (close it), or why not: the daemon must
// run as the caller's user, as root, as MMFEED_DAEMON_USER (a name or uid) when set, or as the
// user owning the folder the socket lies in when no one else can write that folder (the
// service's /run/mmfeed): a socket another user put in /tmp is refused, naming its user
// (CheckDaemonUser).
Result<int> ConnectControl(const std::string& socket_path);
Status CheckDaemonUser(int connected_fd, const std::string& socket_path);
// Writes `request` as one line.
Status SendControlLine(int fd, const nlohmann::json& request);
// Reads one reply line within `timeout_ms`: the reply when its "ok" is true, else its "error".
// File descriptors passed with it are appended to *fds (closed if fds is null).
Result<nlohmann::json> RecvControlReply(int fd, std::vector<int>* fds, int timeout_ms);
// One request/response on the control socket (used by mmfeedctl). Gives up after timeout_ms.
Result<nlohmann::json> ControlRequest(const std::string& socket_path, const nlohmann::json& request,
                                      int timeout_ms = 10000);

}  // namespace mmfeed
