// ControlServer: the daemon's unix socket, served on one Asio io_context thread.
//
// Protocol: one JSON object per line each way.
//   {"cmd":"attach","rank":R}  -> {"ok":true,...} with the ring's memfd in SCM_RIGHTS.
//                                 The connection stays open while the trainer is attached;
//                                 EOF on it means the trainer is gone (Handler::Detach).
//   {"cmd":"status"}           -> {"ok":true,"status":{...}}
//   {"cmd":"stop"}             -> {"ok":true}, then the daemon drains and exits.
// Errors: {"ok":false,"error":"..."}. Only processes of the daemon's user (or root) are served.
#pragma once

#include <asio.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"

namespace mmfeed {

class ControlServer {
 public:
  struct Handler {
    // Returns the ring fd (owned by the daemon; the server sends a copy) and reply fields.
    std::function<Result<std::pair<int, nlohmann::json>>(int rank, int pid)> attach;
    std::function<void(int rank, int pid)> detach;
    std::function<nlohmann::json()> status;
    std::function<void()> stop;
  };

  ControlServer(asio::io_context& io, std::string path, Handler handler);
  ~ControlServer();
  Status Listen();

 private:
  class Session;
  void Accept();

  asio::io_context& io_;
  std::string path_;
  Handler handler_;
  asio::local::stream_protocol::acceptor acceptor_;
};

}  // namespace mmfeed
