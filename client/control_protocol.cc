#include "client/control_protocol.h"

#include <fmt/format.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/clock.h"

namespace mmfeed {

std::string JobShape::Describe() const {
  return fmt::format("{} node(s) x {} rank(s), this node {}{}", num_nodes, local_world_size,
                     node_rank,
                     replicas ? fmt::format(", in groups of {} (replicas)", replicas) : "");
}

nlohmann::json JobShape::ToJson() const {
  nlohmann::json j = {{"rank", rank},
                      {"world_size", world_size},
                      {"local_rank", local_rank},
                      {"local_world_size", local_world_size},
                      {"node_rank", node_rank},
                      {"num_nodes", num_nodes},
                      {"from", from}};
  if (replicas) j["replicas"] = replicas;
  return j;
}

Result<JobShape> JobShape::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) return Status::Invalid("\"job\" must be an object");
  JobShape s;
  auto field = [&](const char* name, int* out, int64_t least, int64_t most) -> Status {
    if (!j.contains(name)) return Status::Invalid(fmt::format("\"job\" needs \"{}\"", name));
    const nlohmann::json& v = j[name];
    if (!v.is_number_integer() || v.get<int64_t>() < least || v.get<int64_t>() > most)
      return Status::Invalid(fmt::format("job's \"{}\" must be an integer from {} to {}, not {}",
                                         name, least, most, v.dump()));
    *out = static_cast<int>(v.get<int64_t>());
    return Status::Ok();
  };
  constexpr int64_t kMost = 1 << 24;
  MMFEED_RETURN_IF_ERROR(field("world_size", &s.world_size, 1, kMost));
  MMFEED_RETURN_IF_ERROR(field("rank", &s.rank, 0, s.world_size - 1));
  MMFEED_RETURN_IF_ERROR(field("local_world_size", &s.local_world_size, 1, kMost));
  MMFEED_RETURN_IF_ERROR(field("local_rank", &s.local_rank, 0, s.local_world_size - 1));
  MMFEED_RETURN_IF_ERROR(field("num_nodes", &s.num_nodes, 1, kMost));
  MMFEED_RETURN_IF_ERROR(field("node_rank", &s.node_rank, 0, s.num_nodes - 1));
  if (static_cast<int64_t>(s.num_nodes) * s.local_world_size != s.world_size)
    return Status::Invalid(fmt::format(
        "job: world_size {} is not num_nodes {} x local_world_size {} (every node must run as "
        "many trainers)",
        s.world_size, s.num_nodes, s.local_world_size));
  if (j.contains("replicas")) {
    MMFEED_RETURN_IF_ERROR(field("replicas", &s.replicas, 1, s.local_world_size));
    if (s.local_world_size % s.replicas != 0)
      return Status::Invalid(fmt::format(
          "job: replicas {} does not divide local_world_size {} (each group of {} consecutive "
          "local ranks receives the same batches)",
          s.replicas, s.local_world_size, s.replicas));
  }
  if (j.contains("from") && j["from"].is_string()) s.from = j["from"].get<std::string>();
  return s;
}

Result<ControlCommand> ParseControlRequest(std::string_view line) {
  nlohmann::json req = nlohmann::json::parse(line, nullptr, false);
  if (req.is_discarded() || !req.is_object() || !req.contains("cmd") || !req["cmd"].is_string())
    return Status::Invalid("expected one JSON object per line with a \"cmd\"");
  const std::string& cmd = req["cmd"].get_ref<const std::string&>();
  ControlCommand r;
  if (cmd == "status") {
    r.cmd = ControlCommand::Cmd::kStatus;
  } else if (cmd == "stop") {
    r.cmd = ControlCommand::Cmd::kStop;
  } else if (cmd == "end_job") {
    r.cmd = ControlCommand::Cmd::kEndJob;
  } else if (cmd == "reload") {
    r.cmd = ControlCommand::Cmd::kReload;
    if (req.contains("config")) {
      if (!req["config"].is_string() || req["config"].get_ref<const std::string&>().empty())
        return Status::Invalid("reload's \"config\" must be a file path");
      r.config = req["config"].get<std::string>();
    }
    if (req.contains("at")) {
      const nlohmann::json& at = req["at"];
      if (!at.is_string() || (at != "batch" && at != "epoch"))
        return Status::Invalid("reload's \"at\" must be \"batch\" or \"epoch\"");
      r.at_batch = at == "batch";
    }
  } else if (cmd == "profile") {
    r.cmd = ControlCommand::Cmd::kProfile;
    if (req.contains("seconds")) {
      const nlohmann::json& s = req["seconds"];
      if (!s.is_number() || !(s.get<double>() > 0 && s.get<double>() <= kMaxProfileSeconds))
        return Status::Invalid(fmt::format(
            "profile's \"seconds\" must be a number above 0 and at most {}", kMaxProfileSeconds));
      r.seconds = s.get<double>();
    }
    if (req.contains("trace")) {
      if (!req["trace"].is_boolean())
        return Status::Invalid("profile's \"trace\" must be true or false");
      r.trace = req["trace"].get<bool>();
    }
  } else if (cmd == "attach") {
    r.cmd = ControlCommand::Cmd::kAttach;
    if (!req.contains("rank") || !req["rank"].is_number_integer())
      return Status::Invalid("attach needs an integer \"rank\"");
    // Signed and unsigned JSON integers alike; anything outside [0, 2^31) is out of range.
    const nlohmann::json& rank = req["rank"];
    bool in_range = rank.is_number_unsigned()
                        ? rank.get<uint64_t>() <= INT32_MAX
                        : rank.get<int64_t>() >= 0 && rank.get<int64_t>() <= INT32_MAX;
    if (!in_range) return Status::Invalid(fmt::format("rank {} out of range", rank.dump()));
    r.rank = static_cast<int>(rank.get<int64_t>());
    if (req.contains("resume")) {
      Result<StreamCursor> c = CursorFromJson(req["resume"]);
      if (!c.ok()) return c.status().WithContext("resume");
      r.resume = *c;
    }
    if (req.contains("job")) {
      Result<JobShape> job = JobShape::FromJson(req["job"]);
      if (!job.ok()) return job.status();
      if (job->local_rank != r.rank)
        return Status::Invalid(fmt::format(
            "attach: rank {} is not the job's local_rank {} (a node's trainers attach with their "
            "local rank)",
            r.rank, job->local_rank));
      r.job = *job;
    }
  } else {
    return Status::Invalid(
        fmt::format("unknown command '{}'; expected attach, status, profile, reload or stop", cmd));
  }
  return r;
}

using Clock = std::chrono::steady_clock;

namespace {

std::string UserName(uid_t uid) {
  passwd pw{}, *found = nullptr;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found) return pw.pw_name;
  return std::to_string(uid);
}

}  // namespace

Status CheckDaemonUser(int fd, const std::string& path) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return Status::Io(
        fmt::format("{}: who serves it cannot be told ({})", path, std::strerror(errno)));
  const uid_t me = geteuid();
  if (cred.uid == me || cred.uid == 0) return Status::Ok();
  if (const char* want = std::getenv("MMFEED_DAEMON_USER"); want && *want) {
    passwd pw{}, *found = nullptr;
    char buf[1024];
    char* end = nullptr;
    const unsigned long n = std::strtoul(want, &end, 10);
    const bool named =
        *end != 0 ? getpwnam_r(want, &pw, buf, sizeof buf, &found) == 0 && found : true;
    const uid_t uid =
        *end != 0 ? (named ? pw.pw_uid : static_cast<uid_t>(-1)) : static_cast<uid_t>(n);
    if (named && uid == cred.uid) return Status::Ok();
    return Status::Invalid(fmt::format(
        "the daemon on {} runs as user {} (uid {}), not as MMFEED_DAEMON_USER={}: refused", path,
        UserName(cred.uid), cred.uid, want));
  }
  // The service's layout: the socket in a folder of the daemon's user that nobody else can
  // write (/run/mmfeed, 0750), so nobody else can have put it there.
  const size_t slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : path.substr(0, slash);
  struct stat st {};
  if (stat(folder.c_str(), &st) == 0 && st.st_uid == cred.uid &&
      (st.st_mode & (S_IWGRP | S_IWOTH)) == 0)
    return Status::Ok();
  return Status::Invalid(fmt::format(
      "the daemon on {} runs as user {} (uid {}), not as you ({}) or root, and {} is not that "
      "user's own folder: anyone may have put a socket there. If {}'s daemon is the one you "
      "mean, set MMFEED_DAEMON_USER={} (or serve from a folder of that user's that others "
      "cannot write, as the service's /run/mmfeed)",
      path, UserName(cred.uid), cred.uid, UserName(me), folder, UserName(cred.uid),
      UserName(cred.uid)));
}

Result<int> ConnectControl(const std::string& path) {
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
    return Status::Unavailable(fmt::format(
        "cannot connect to mmfeedd at {}: {}{}", path, std::strerror(e),
        e == ENOENT || e == ECONNREFUSED
            ? fmt::format(". Is mmfeedd running? It listens on its --socket (by default {}; "
                          "the systemd service: {}); give the same path here (--socket, or "
                          "MMFEED_SOCKET)",
                          kDefaultSocket, kServiceSocket)
            : ""));
  }
  if (Status st = CheckDaemonUser(fd, path); !st.ok()) {
    ::close(fd);
    return st;
  }
  return fd;
}

Status SendControlLine(int fd, const nlohmann::json& j) {
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

Result<nlohmann::json> RecvControlReply(int fd, std::vector<int>* fds, int timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string line;
  while (line.empty() || line.back() != '\n') {
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, RemainingMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0)
      return Status::Timeout(
          fmt::format("mmfeedd did not answer within {:.1f}s", timeout_ms / 1000.0));
    char buf[65536];
    iovec iov{buf, sizeof(buf)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Unavailable("mmfeedd closed the connection");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t k = 0; k < count; ++k) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(c) + k * sizeof(int), sizeof(int));
        if (fds)
          fds->push_back(passed);
        else
          ::close(passed);
      }
    }
    line.append(buf, static_cast<size_t>(n));
  }
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded()) return Status::Corrupt("mmfeedd sent a malformed reply");
  if (!j.value("ok", false))
    return Status::Invalid(j.value("error", std::string("request refused")));
  return j;
}

Result<nlohmann::json> ControlRequest(const std::string& socket_path, const nlohmann::json& request,
                                      int timeout_ms) {
  MMFEED_ASSIGN_OR_RETURN(int fd, ConnectControl(socket_path));
  Status st = SendControlLine(fd, request);
  Result<nlohmann::json> reply =
      st.ok() ? RecvControlReply(fd, nullptr, timeout_ms) : Result<nlohmann::json>(st);
  ::close(fd);
  return reply;
}

}  // namespace mmfeed
