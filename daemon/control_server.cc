#include "daemon/control_server.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "client/control_protocol.h"

namespace mmfeed {
namespace {

// True if `pid` belongs to group `gid` (primary or supplementary), from /proc.
bool InGroup(int pid, unsigned gid) {
  std::ifstream f(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream in(line.substr(7));
    unsigned g;
    while (in >> g)
      if (g == gid) return true;
  }
  return false;
}

bool ProcessGone(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

}  // namespace

class ControlServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(asio::local::stream_protocol::socket socket, ControlServer& server)
      : socket_(std::move(socket)),
        server_(server),
        buffer_(kMaxRequestBytes),
        pidfd_(server.io_),
        send_deadline_(server.io_),
        hup_timer_(server.io_) {}

  // Neither attached nor answering a request: it may be closed to make room for a new one.
  bool idle() const { return attached_rank_ < 0 && !busy_ && socket_.is_open(); }

  ~Session() { Uncount(); }

  void Start() {
    ucred cred{};
    socklen_t len = sizeof(cred);
    getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len);
    pid_ = cred.pid;
    bool allowed = cred.uid == geteuid() || cred.uid == 0 ||
                   (server_.has_group_ &&
                    (cred.gid == server_.group_id_ || InGroup(cred.pid, server_.group_id_)));
    if (!allowed) {
      spdlog::warn("refused control connection from pid {} uid {}", cred.pid, cred.uid);
      Reply({{"ok", false}, {"error", "permission denied: not the daemon's user or group"}}, {},
            false);
      return;
    }
    int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd >= 0)
      pidfd_.assign(pidfd);
    else
      peer_gone_ = errno == ESRCH;  // it died before it was accepted (ENOSYS: no pidfds here)
    Read();
  }

  // Cut off by the daemon: close the connection; the trainer is detached.
  void Disconnect() {
    Detach();
    Uncount();  // its place is free now, not when its cancelled handlers have run
    std::error_code ec;
    send_deadline_.cancel(ec);
    hup_timer_.cancel(ec);
    socket_.shutdown(asio::socket_base::shutdown_both, ec);
    socket_.close(ec);
    pidfd_.close(ec);
  }

 private:
  void Read() {
    auto self = shared_from_this();
    asio::async_read_until(socket_, buffer_, '\n', [this, self](std::error_code ec, size_t n) {
      if (ec == asio::error::not_found) {  // over kMaxRequestBytes without a newline
        spdlog::warn("pid {}: control request longer than {} bytes; closing that connection", pid_,
                     kMaxRequestBytes);
        return Disconnect();
      }
      if (ec) {  // EOF or error: judge the trainer by its process and how it closed
        if (attached_rank_ >= 0 && !detached_) {
          // A live process that only shut its writing side (POLLRDHUP without POLLHUP) is
          // still attached; one that closed the connection (POLLHUP) has let the rank go.
          pollfd p{socket_.native_handle(), POLLRDHUP, 0};
          bool fully_closed = poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR));
          if (!fully_closed && pidfd_.is_open() && !ProcessGone(pidfd_.native_handle())) {
            spdlog::info(
                "rank {}: pid {} closed its connection but lives (its writing side only); it "
                "stays attached until it exits or closes the connection fully",
                attached_rank_, pid_);
            WatchFullClose();
          } else {
            Detach();
          }
        }
        return;
      }
      std::string line(asio::buffers_begin(buffer_.data()),
                       asio::buffers_begin(buffer_.data()) + n);
      buffer_.consume(n);
      Handle(line);
    });
  }

  // A half-closed connection is readable for ever (EOF): whether the peer closes it fully
  // (POLLHUP) is polled every 250 ms instead.
  void WatchFullClose() {
    hup_timer_.expires_after(std::chrono::milliseconds(250));
    auto self = shared_from_this();
    hup_timer_.async_wait([this, self](std::error_code ec) {
      if (ec || detached_ || !socket_.is_open()) return;
      pollfd p{socket_.native_handle(), POLLRDHUP, 0};
      if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR))) {
        spdlog::info("rank {}: pid {} closed its connection: the rank is free", attached_rank_,
                     pid_);
        return Disconnect();
      }
      WatchFullClose();
    });
  }

  void WatchDeath() {
    if (!pidfd_.is_open()) return;
    auto self = shared_from_this();
    pidfd_.async_wait(asio::posix::descriptor_base::wait_read, [this, self](std::error_code ec) {
      if (ec) return;
      spdlog::info("rank {}: pid {} exited", attached_rank_, pid_);
      Disconnect();
    });
  }

  void Detach() {
    if (attached_rank_ < 0 || detached_) return;
    detached_ = true;
    server_.attached_.erase(generation_);
    server_.handler_.detach(attached_rank_, pid_, generation_);
  }

  void Handle(const std::string& line) {
    busy_ = true;  // until the reply is sent
    Result<ControlCommand> req = ParseControlRequest(line);
    if (!req.ok()) return Reply({{"ok", false}, {"error", req.status().message()}});
    switch (req->cmd) {
      case ControlCommand::Cmd::kStatus:
        return Reply({{"ok", true}, {"status", server_.handler_.status()}});
      case ControlCommand::Cmd::kStop:
        Reply({{"ok", true}});
        server_.handler_.stop();
        return;
      case ControlCommand::Cmd::kReload:
        // No other request on this connection until the reload's reply is sent.
        server_.handler_.reload(req->config, req->at_batch,
                                [this, self = shared_from_this()](Result<nlohmann::json> r) {
                                  if (!r.ok())
                                    return Reply({{"ok", false}, {"error", r.status().message()}});
                                  Reply({{"ok", true}, {"reload", std::move(r.value())}});
                                });
        return;
      case ControlCommand::Cmd::kProfile:
        // No other request on this connection until the window's report is sent.
        server_.handler_.profile(req->seconds, req->trace,
                                 [this, self = shared_from_this()](Result<nlohmann::json> r) {
                                   if (!r.ok())
                                     return Reply({{"ok", false}, {"error", r.status().message()}});
                                   Reply({{"ok", true}, {"profile", std::move(r.value())}});
                                 });
        return;
      case ControlCommand::Cmd::kEndJob:
        server_.handler_.end_job([this, self = shared_from_this()](Result<nlohmann::json> r) {
          if (!r.ok()) return Reply({{"ok", false}, {"error", r.status().message()}});
          Reply({{"ok", true}, {"ended", std::move(r.value())}});
        });
        return;
      case ControlCommand::Cmd::kAttach:
        break;
    }
    if (attached_rank_ >= 0)
      return Reply({{"ok", false}, {"error", "this connection is already attached"}});
    // A process that is gone cannot hold a rank (without a pidfd its death could not be seen).
    if (peer_gone_) return Disconnect();
    Result<AttachGrant> r = server_.handler_.attach(
        req->rank, pid_, pidfd_.is_open() ? pidfd_.native_handle() : -1, req->resume, req->job);
    if (!r.ok()) return Reply({{"ok", false}, {"error", r.status().message()}});
    attached_rank_ = req->rank;
    generation_ = r->reply.value("generation", 0u);
    server_.attached_[generation_] = weak_from_this();
    nlohmann::json reply = r->reply;
    reply["ok"] = true;
    WatchDeath();
    Reply(reply, r->fds);
  }

  // Sends the whole reply (the fds ride with its first bytes), then reads the next request.
  // Never blocks the control thread: a peer that does not read is waited for asynchronously,
  // and closed after kSendSeconds.
  void Reply(const nlohmann::json& j, const std::vector<int>& fds = {}, bool then_read = true) {
    if (!socket_.is_open()) return;  // disconnected while a profile window ran
    auto text = std::make_shared<std::string>(j.dump() + "\n");
    send_deadline_.expires_after(std::chrono::seconds(kSendSeconds));
    auto self = shared_from_this();
    send_deadline_.async_wait([this, self](std::error_code ec) {
      if (ec) return;  // sent in time (cancelled)
      spdlog::warn("pid {} did not read its control reply within {}s; closing its connection", pid_,
                   kSendSeconds);
      Disconnect();
    });
    SendFirst(text, fds, then_read);
  }

  void SendFirst(std::shared_ptr<std::string> text, std::vector<int> fds, bool then_read) {
    if (!socket_.is_open()) return;
    iovec iov{text->data(), text->size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    if (!fds.empty()) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n = sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    auto self = shared_from_this();
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {  // its buffer is full: wait, not block
      socket_.async_wait(asio::socket_base::wait_write,
                         [this, self, text, fds, then_read](std::error_code ec) {
                           if (!ec) SendFirst(text, fds, then_read);
                         });
      return;
    }
    if (n <= 0) {
      spdlog::warn("control reply to pid {} failed: {}", pid_, std::strerror(errno));
      return Disconnect();  // an attach it never received is no attach
    }
    asio::async_write(socket_, asio::buffer(text->data() + n, text->size() - n),
                      [this, self, text, then_read](std::error_code ec, size_t) {
                        send_deadline_.cancel();
                        busy_ = false;
                        if (ec) {
                          spdlog::warn("control reply to pid {} failed: {}", pid_, ec.message());
                          Disconnect();
                        } else if (then_read) {
                          Read();
                        }
                      });
  }

  static constexpr int kSendSeconds = 5;

  void Uncount() {
    if (counted_) --server_.connections_;
    counted_ = false;
  }
  asio::local::stream_protocol::socket socket_;
  ControlServer& server_;
  asio::streambuf buffer_;
  asio::posix::stream_descriptor pidfd_;
  asio::steady_timer send_deadline_;
  asio::steady_timer hup_timer_;  // a half-closed attach: polls for the full close
  bool busy_ = false;             // a request is being answered
  bool counted_ = true;           // in the server's connections_
  int pid_ = 0;
  int attached_rank_ = -1;
  uint32_t generation_ = 0;
  bool detached_ = false;
  bool peer_gone_ = false;  // the peer had exited when its connection was accepted
};

ControlServer::ControlServer(asio::io_context& io, std::string path, std::string group,
                             Handler handler)
    : io_(io),
      path_(std::move(path)),
      group_(std::move(group)),
      handler_(std::move(handler)),
      acceptor_(io),
      retry_(io) {}

ControlServer::~ControlServer() {
  std::error_code ec;
  acceptor_.close(ec);
  if (listening_) ::unlink(path_.c_str());
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

namespace {

// The lock file could not be opened. The common case on a shared machine: another user's daemon
// made it (a lock file outlives its daemon, and /tmp keeps other users' files).
Status LockFileError(const std::string& lock_path, int err) {
  struct stat st;
  if ((err == EACCES || err == EPERM) && lstat(lock_path.c_str(), &st) == 0 &&
      st.st_uid != geteuid()) {
    auto name = [](uid_t uid) {  // getpwuid's answer lives only until its next call
      const passwd* pw = getpwuid(uid);
      return pw ? std::string(pw->pw_name) : std::to_string(uid);
    };
    const std::string socket = lock_path.substr(0, lock_path.size() - 5);
    return Status::Io(fmt::format(
        "lock file {} belongs to user {} (uid {}): a daemon of that user serves, or served, on {}; "
        "start this one on a socket of your own (e.g. --socket /tmp/mmfeed-{}.sock, and "
        "MMFEED_SOCKET set to it for the trainers), or have that user remove {}",
        lock_path, name(st.st_uid), st.st_uid, socket, name(geteuid()), lock_path));
  }
  return Status::Io(fmt::format("lock file {}: {}", lock_path, std::strerror(err)));
}

}  // namespace

Status ControlServer::Listen() {
  // sockaddr_un holds 108 bytes, the lock file's name is the path plus ".lock".
  if (path_.empty() || path_.size() >= sizeof(sockaddr_un::sun_path))
    return Status::Invalid(
        fmt::format("--socket {}: a unix socket path has 1 to {} characters, this one has {}",
                    path_, sizeof(sockaddr_un::sun_path) - 1, path_.size()));
  if (!group_.empty()) {
    group* g = getgrnam(group_.c_str());
    if (!g) return Status::Invalid(fmt::format("--socket-group: no group named '{}'", group_));
    group_id_ = g->gr_gid;
    has_group_ = true;
  }
  // The lock proves a live daemon on this path; the kernel drops it when that daemon dies.
  std::string lock_path = path_ + ".lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  // Another user's lock file (sticky /tmp keeps it; Linux refuses even root an O_CREAT open of
  // it there): if no daemon holds it, its daemon is gone, and whoever may remove it (root, the
  // folder's owner) takes the path over. The old lock stays held until the new one is.
  int stale = -1;
  if (lock_fd_ < 0 && (errno == EACCES || errno == EPERM)) {
    const int err = errno;
    stale = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat old {};
    if (stale >= 0 && flock(stale, LOCK_EX | LOCK_NB) == 0 && fstat(stale, &old) == 0 &&
        ::unlink(lock_path.c_str()) == 0) {
      lock_fd_ =
          ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (lock_fd_ >= 0)
        spdlog::info("took over {}: the lock file of uid {}'s daemon, which is gone", lock_path,
                     old.st_uid);
    }
    if (lock_fd_ < 0) {
      if (stale >= 0) ::close(stale);
      return LockFileError(lock_path, err);
    }
  }
  const bool locked = flock(lock_fd_, LOCK_EX | LOCK_NB) == 0;
  if (stale >= 0) ::close(stale);
  if (!locked)
    return Status::Invalid(
        fmt::format("another mmfeedd is serving on {} (it holds {})", path_, lock_path));
  struct stat st;
  if (lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return Status::Invalid(
          fmt::format("{} exists and is not a socket; refusing to replace it", path_));
    spdlog::info("taking over the stale socket {} of a daemon that is gone", path_);
    ::unlink(path_.c_str());
  }
  std::error_code ec;
  asio::local::stream_protocol::endpoint ep(path_);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (ec) return Status::Io(fmt::format("control socket {}: {}", path_, ec.message()));
  listening_ = true;
  if (has_group_) {
    if (chown(path_.c_str(), static_cast<uid_t>(-1), group_id_) != 0 ||
        chmod(path_.c_str(), 0660) != 0)
      return Status::Io(fmt::format("control socket {}: giving it to group {}: {}", path_, group_,
                                    std::strerror(errno)));
  }
  acceptor_.listen(64, ec);
  if (ec) return Status::Io(fmt::format("control socket {}: {}", path_, ec.message()));
  Accept();
  return Status::Ok();
}

void ControlServer::Shutdown() {
  std::error_code ec;
  acceptor_.close(ec);
  retry_.cancel();
  for (auto& w : sessions_)
    if (auto s = w.lock()) s->Disconnect();
  sessions_.clear();
  // Run the cancelled handlers now, while everything they touch is alive; they drop the
  // sessions' last references.
  io_.restart();
  io_.poll();
}

void ControlServer::Disconnect(uint32_t generation) {
  auto it = attached_.find(generation);
  if (it == attached_.end()) return;
  if (auto s = it->second.lock()) s->Disconnect();
}

void ControlServer::Accept() {
  acceptor_.async_accept([this](std::error_code ec, asio::local::stream_protocol::socket s) {
    if (ec == asio::error::operation_aborted) return;  // closed
    if (ec) {
      // EMFILE and friends: keep serving once descriptors are back.
      if (!emfile_logged_)
        spdlog::warn("accepting a control connection: {}; retrying", ec.message());
      emfile_logged_ = true;
      retry_.expires_after(std::chrono::milliseconds(100));
      retry_.async_wait([this](std::error_code e) {
        if (!e) Accept();
      });
      return;
    }
    emfile_logged_ = false;
    sessions_.erase(
        std::remove_if(sessions_.begin(), sessions_.end(), [](auto& w) { return w.expired(); }),
        sessions_.end());
    if (connections_ >= kMaxConnections) {
      // A reserve for new connections: the oldest idle one (not attached, no request under
      // way) makes room, so idle clients cannot lock status, attach and stop out.
      for (auto& w : sessions_) {
        auto old = w.lock();
        if (!old || !old->idle()) continue;
        spdlog::warn("{} control connections: closing the oldest idle one", kMaxConnections);
        old->Disconnect();
        break;
      }
    }
    if (connections_ >= kMaxConnections) {
      spdlog::warn("more than {} control connections; refusing one", kMaxConnections);
    } else {
      ++connections_;
      auto session = std::make_shared<Session>(std::move(s), *this);
      sessions_.push_back(session);
      session->Start();
    }
    Accept();
  });
}

}  // namespace mmfeed
