// ControlServer: the daemon's unix socket, served on one Asio io_context thread.
//
// The protocol (one JSON object per line each way) is documented in
// docs/reference/control_protocol.md.
//
// Who may connect: the daemon's user, root, and members of `group` when one is given (the
// socket is then mode 0660 and owned by that group); checked with SO_PEERCRED.
// A trainer is dead when its process is (a pidfd on the pid from SO_PEERCRED), not when its
// connection closes: a process that half-closes its socket, or whose forked child still holds
// it, is judged by its own life.
// One daemon per socket path: a lock file beside the socket (PATH.lock, flock) proves a live
// daemon; a socket left by a killed daemon is taken over.
#pragma once

#include <asio.hpp>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/cursor.h"
#include "base/status.h"
#include "client/control_protocol.h"

namespace mmfeed {

struct AttachGrant {
  std::vector<int> fds;  // sent along with the reply; owned by the daemon
  nlohmann::json reply;
};

class ControlServer {
 public:
  struct Handler {
    // `pidfd` refers to the peer process (-1 if pidfd_open failed); the daemon may keep a dup.
    // `job`: the trainer's job, when it declared one.
    std::function<Result<AttachGrant>(int rank, int pid, int pidfd,
                                      const std::optional<StreamCursor>& resume,
                                      const std::optional<JobShape>& job)>
        attach;
    // The attached trainer died (or was disconnected): `generation` is the one attach gave.
    std::function<void(int rank, int pid, uint32_t generation)> detach;
    std::function<nlohmann::json()> status;
    std::function<void()> stop;
    // Reloads `config` (empty: the running config's file), then calls `done` with the reply, or
    // why not, on the io_context's thread. Returns at once.
    std::function<void(const std::string& config, bool at_batch,
                       std::function<void(Result<nlohmann::json>)> done)>
        reload;
    // Measures a window of `seconds` (and traces it when `trace`), then calls `done` with the
    // report, or why not, on the io_context's thread. Returns at once.
    std::function<void(double seconds, bool trace,
                       std::function<void(Result<nlohmann::json>)> done)>
        profile;
    // Ends the job a `consumers: auto` daemon adopted (no trainer attached), then calls `done`
    // with what ended, or why not, on the io_context's thread. Returns at once.
    std::function<void(std::function<void(Result<nlohmann::json>)> done)> end_job;
  };

  // `group`: a group name whose members may connect; empty for the daemon's user only.
  ControlServer(asio::io_context& io, std::string path, std::string group, Handler handler);
  ~ControlServer();
  Status Listen();
  // Closes the connection of the trainer attached with `generation` (it was cut off).
  void Disconnect(uint32_t generation);
  // Closes the socket and every connection, and runs their cancelled handlers. Call after
  // io_context::run() returned, before destroying the server or what its handler uses.
  void Shutdown();
  static constexpr size_t kMaxRequestBytes = 1 << 20;
  static constexpr int kMaxConnections = 256;

 private:
  class Session;
  void Accept();

  asio::io_context& io_;
  std::string path_, group_;
  Handler handler_;
  asio::local::stream_protocol::acceptor acceptor_;
  asio::steady_timer retry_;
  int lock_fd_ = -1;
  bool listening_ = false;
  unsigned group_id_ = 0;
  bool has_group_ = false;
  std::map<uint32_t, std::weak_ptr<Session>> attached_;  // by generation
  std::vector<std::weak_ptr<Session>> sessions_;         // every open connection
  int connections_ = 0;
  bool emfile_logged_ = false;
};

}  // namespace mmfeed
