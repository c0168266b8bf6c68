// Prometheus metrics: the text exposition format (PromText) and the HTTP endpoint that serves
// GET /metrics (MetricsServer). The supervisor renders the page on its control thread
// (Supervisor::MetricsText) and publishes it here every 500 ms; the endpoint runs on that same
// Asio io_context, asynchronously: a scrape only copies the latest page, and a client that
// trickles its request (slowloris) holds nothing but its own connection, closed after 5 s.
#pragma once

#include <asio.hpp>
#include <list>
#include <map>
#include <memory>
#include <string>

#include "base/status.h"

namespace mmfeed {

// Writes families of samples in the text format (version 0.0.4): HELP and TYPE once per
// family, label values escaped.
class PromText {
 public:
  // type: counter | gauge. Starts a family; its samples follow.
  void Family(const std::string& name, const std::string& type, const std::string& help);
  void Sample(const std::string& name, const std::map<std::string, std::string>& labels,
              double value);
  void Sample(const std::string& name, double value) { Sample(name, {}, value); }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

class MetricsServer {
 public:
  // Listens on `listen` (PORT: every interface; HOST:PORT or [IPV6]:PORT) and serves on `io`'s
  // thread: an error says why not. At most kMaxConnections at once: a new one closes the oldest.
  static Result<std::unique_ptr<MetricsServer>> Start(asio::io_context& io,
                                                      const std::string& listen);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  // The page served from now on (until the first, GET /metrics answers 503). On io's thread.
  void Publish(std::string page);

  static constexpr size_t kMaxConnections = 256;
  static constexpr size_t kMaxRequestBytes = 8192;
  static constexpr std::chrono::seconds kRequestTimeout{5};

 private:
  class Connection;
  explicit MetricsServer(asio::io_context& io) : acceptor_(io), retry_(io) {}
  void Accept();
  asio::ip::tcp::acceptor acceptor_;
  asio::steady_timer retry_;  // after an accept error (EMFILE): accept again in 100 ms
  std::shared_ptr<std::string> page_ = std::make_shared<std::string>();
  std::list<std::weak_ptr<Connection>> connections_;  // oldest first
};

}  // namespace mmfeed
