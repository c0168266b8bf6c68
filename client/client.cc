#include "client/client.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace mmfeed {
namespace {

Result<int> Connect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Io(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    ::close(fd);
    return Status::Invalid(fmt::format("socket path too long: {}", path));
  }
  std::strcpy(addr.sun_path, path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    ::close(fd);
    return Status::Io(fmt::format("cannot connect to mmfeedd at {}: {}", path, std::strerror(e)));
  }
  return fd;
}

Status SendLine(int fd, const nlohmann::json& j) {
  std::string s = j.dump() + "\n";
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Io(fmt::format("send to mmfeedd: {}", std::strerror(errno)));
    off += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Reads one reply line; a file descriptor passed with it lands in *fd_out.
Result<nlohmann::json> RecvLine(int fd, int* fd_out) {
  std::string line;
  while (line.empty() || line.back() != '\n') {
    char buf[65536];
    iovec iov{buf, sizeof(buf)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Io("mmfeedd closed the connection");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && fd_out)
        std::memcpy(fd_out, CMSG_DATA(c), sizeof(int));
    line.append(buf, static_cast<size_t>(n));
  }
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded()) return Status::Corrupt("mmfeedd sent a malformed reply");
  if (!j.value("ok", false)) return Status::Invalid(j.value("error", std::string("request refused")));
  return j;
}

}  // namespace

ClientBatch& ClientBatch::operator=(ClientBatch&& o) noexcept {
  if (this != &o) {
    Release();
    ring_ = o.ring_;
    slot_ = o.slot_;
    view_ = std::move(o.view_);
    o.ring_ = nullptr;
    o.slot_ = -1;
  }
  return *this;
}

const shm::TensorView* ClientBatch::tensor(std::string_view name) const {
  for (const auto& t : view_.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void ClientBatch::Release() {
  if (ring_ && slot_ >= 0) ring_->Release(slot_);
  ring_ = nullptr;
  slot_ = -1;
}

Result<std::unique_ptr<Client>> Client::Attach(const std::string& socket_path, int rank) {
  Result<int> fd = Connect(socket_path);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<Client> c(new Client());
  c->sock_ = *fd;
  MMFEED_RETURN_IF_ERROR(SendLine(c->sock_, {{"cmd", "attach"}, {"rank", rank}}));
  int ring_fd = -1;
  Result<nlohmann::json> reply = RecvLine(c->sock_, &ring_fd);
  if (!reply.ok()) {
    if (ring_fd >= 0) ::close(ring_fd);
    return reply.status().WithContext(fmt::format("attach rank {}", rank));
  }
  if (ring_fd < 0) return Status::Io("mmfeedd did not pass the ring's file descriptor");
  Result<std::unique_ptr<shm::RingReader>> ring = shm::RingReader::Map(ring_fd);
  if (!ring.ok()) return ring.status();
  c->ring_ = std::move(ring.value());
  c->info_ = *reply;
  return c;
}

Client::~Client() {
  ring_.reset();
  if (sock_ >= 0) ::close(sock_);
}

Result<bool> Client::Next(ClientBatch* batch, int timeout_ms) {
  batch->Release();
  while (true) {
    int slot = -1;
    Result<shm::RingReader::Wait> w = ring_->Acquire(timeout_ms < 0 ? 1000 : timeout_ms, &slot, &batch->view_);
    if (!w.ok()) return w.status();
    if (*w == shm::RingReader::Wait::kGot) {
      batch->ring_ = ring_.get();
      batch->slot_ = slot;
      return true;
    }
    if (*w == shm::RingReader::Wait::kEnd) return false;
    // Nothing yet: make sure the daemon is still there (its end of the socket closes if not).
    pollfd p{sock_, POLLRDHUP, 0};
    if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
      return Status::Io("mmfeedd went away: the connection closed before the end of the data");
    if (timeout_ms >= 0) return Status::Timeout("no batch within the timeout");
  }
}

Result<nlohmann::json> ControlRequest(const std::string& socket_path, const nlohmann::json& request) {
  Result<int> fd = Connect(socket_path);
  if (!fd.ok()) return fd.status();
  Status st = SendLine(*fd, request);
  Result<nlohmann::json> reply = st.ok() ? RecvLine(*fd, nullptr) : Result<nlohmann::json>(st);
  ::close(*fd);
  return reply;
}

}  // namespace mmfeed
