// Prometheus metrics: the text exposition format (PromText) and the HTTP endpoint that serves
// GET /metrics (MetricsServer, on civetweb). The supervisor renders the page on its control
// thread (Supervisor::MetricsText) and publishes it here every 500 ms; civetweb's threads
// only copy the latest page, so a scrape never touches the pipeline.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/status.h"

struct mg_context;
struct mg_connection;

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
  // Listens on `listen` (PORT, HOST:PORT or [IPV6]:PORT): an error says why not.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& listen);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  // The page served from now on.
  void Publish(std::string page);

 private:
  MetricsServer() = default;
  static int Handle(mg_connection* conn, void* self);
  mg_context* ctx_ = nullptr;
  std::mutex mu_;
  std::string page_;
};

}  // namespace mmfeed
