#include "daemon/control_server.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace mmfeed {

class ControlServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(asio::local::stream_protocol::socket socket, Handler& handler)
      : socket_(std::move(socket)), handler_(handler) {}

  void Start() {
    ucred cred{};
    socklen_t len = sizeof(cred);
    getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len);
    pid_ = cred.pid;
    if (cred.uid != geteuid() && cred.uid != 0) {
      spdlog::warn("refused control connection from pid {} uid {}", cred.pid, cred.uid);
      Reply({{"ok", false}, {"error", "permission denied: not the daemon's user"}}, -1);
      return;
    }
    Read();
  }

 private:
  void Read() {
    auto self = shared_from_this();
    asio::async_read_until(socket_, buffer_, '\n', [this, self](std::error_code ec, size_t n) {
      if (ec) {  // EOF or error: the peer is gone
        if (attached_rank_ >= 0) handler_.detach(attached_rank_, pid_);
        return;
      }
      std::string line(asio::buffers_begin(buffer_.data()), asio::buffers_begin(buffer_.data()) + n);
      buffer_.consume(n);
      Handle(line);
      Read();
    });
  }

  void Handle(const std::string& line) {
    nlohmann::json req = nlohmann::json::parse(line, nullptr, false);
    if (req.is_discarded() || !req.is_object() || !req.contains("cmd") || !req["cmd"].is_string()) {
      Reply({{"ok", false}, {"error", "expected one JSON object per line with a \"cmd\""}}, -1);
      return;
    }
    std::string cmd = req["cmd"];
    if (cmd == "status") {
      Reply({{"ok", true}, {"status", handler_.status()}}, -1);
    } else if (cmd == "stop") {
      Reply({{"ok", true}}, -1);
      handler_.stop();
    } else if (cmd == "attach") {
      if (attached_rank_ >= 0) {
        Reply({{"ok", false}, {"error", "this connection is already attached"}}, -1);
        return;
      }
      if (!req.contains("rank") || !req["rank"].is_number_integer()) {
        Reply({{"ok", false}, {"error", "attach needs an integer \"rank\""}}, -1);
        return;
      }
      int rank = req["rank"];
      Result<std::pair<int, nlohmann::json>> r = handler_.attach(rank, pid_);
      if (!r.ok()) {
        Reply({{"ok", false}, {"error", r.status().message()}}, -1);
        return;
      }
      attached_rank_ = rank;
      nlohmann::json reply = r->second;
      reply["ok"] = true;
      Reply(reply, r->first);
    } else {
      Reply({{"ok", false}, {"error", fmt::format("unknown command '{}'; expected attach, status or stop", cmd)}}, -1);
    }
  }

  // Replies are small; they are sent with one blocking sendmsg so an fd can ride along.
  void Reply(const nlohmann::json& j, int fd) {
    std::string text = j.dump() + "\n";
    iovec iov{text.data(), text.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    if (sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL) < 0)
      spdlog::warn("control reply to pid {} failed: {}", pid_, std::strerror(errno));
  }

  asio::local::stream_protocol::socket socket_;
  Handler& handler_;
  asio::streambuf buffer_;
  int pid_ = 0;
  int attached_rank_ = -1;
};

ControlServer::ControlServer(asio::io_context& io, std::string path, Handler handler)
    : io_(io), path_(std::move(path)), handler_(std::move(handler)), acceptor_(io) {}

ControlServer::~ControlServer() {
  std::error_code ec;
  acceptor_.close(ec);
  ::unlink(path_.c_str());
}

Status ControlServer::Listen() {
  std::error_code ec;
  ::unlink(path_.c_str());  // a stale socket from a previous run
  asio::local::stream_protocol::endpoint ep(path_);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(64, ec);
  if (ec) return Status::Io(fmt::format("control socket {}: {}", path_, ec.message()));
  Accept();
  return Status::Ok();
}

void ControlServer::Accept() {
  acceptor_.async_accept([this](std::error_code ec, asio::local::stream_protocol::socket s) {
    if (ec) return;  // closed
    std::make_shared<Session>(std::move(s), handler_)->Start();
    Accept();
  });
}

}  // namespace mmfeed
