#include "daemon/metrics.h"

#include <civetweb.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>

namespace mmfeed {
namespace {

std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"')
      out += {'\\', c};
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.0f}", v);
  return fmt::format("{}", v);
}

}  // namespace

void PromText::Family(const std::string& name, const std::string& type, const std::string& help) {
  text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void PromText::Sample(const std::string& name, const std::map<std::string, std::string>& labels,
                      double value) {
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    bool first = true;
    for (const auto& [k, v] : labels) {
      text_ += fmt::format("{}{}=\"{}\"", first ? "" : ",", k, EscapeLabel(v));
      first = false;
    }
    text_ += '}';
  }
  text_ += ' ' + Number(value) + '\n';
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen) {
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  mg_init_library(0);
  const char* options[] = {
      "listening_ports", listen.c_str(),      "num_threads", "2",    "request_timeout_ms",
      "10000",           "enable_keep_alive", "no",          nullptr};
  mg_callbacks callbacks{};
  // Set before it listens (a handler registered after mg_start2 leaves a window of 404s).
  callbacks.begin_request = [](mg_connection* conn) -> int {
    const mg_request_info* req = mg_get_request_info(conn);
    if (!req->local_uri || std::strcmp(req->local_uri, "/metrics") != 0) return 0;
    return Handle(conn, mg_get_user_data(mg_get_context(conn)));
  };
  mg_init_data init{&callbacks, s.get(), options};
  char text[256] = "";
  unsigned code = 0;
  mg_error_data error{&code, text, sizeof text};
  s->ctx_ = mg_start2(&init, &error);
  if (!s->ctx_)
    return Status::Io(fmt::format("metrics.listen {}: cannot serve /metrics: {}", listen,
                                  text[0] ? text : "civetweb failed to start"));
  return s;
}

MetricsServer::~MetricsServer() {
  if (ctx_) mg_stop(ctx_);
}

void MetricsServer::Publish(std::string page) {
  std::lock_guard<std::mutex> lock(mu_);
  page_ = std::move(page);
}

int MetricsServer::Handle(mg_connection* conn, void* self) {
  const mg_request_info* req = mg_get_request_info(conn);
  if (std::strcmp(req->request_method, "GET") != 0 &&
      std::strcmp(req->request_method, "HEAD") != 0) {
    mg_send_http_error(conn, 405, "only GET /metrics");
    return 405;
  }
  std::string page;
  {
    auto* server = static_cast<MetricsServer*>(self);
    std::lock_guard<std::mutex> lock(server->mu_);
    page = server->page_;
  }
  if (page.empty()) {  // never an empty 200: a scraper would mark every series stale
    mg_response_header_start(conn, 503);
    mg_response_header_add(conn, "Retry-After", "1", -1);
    mg_response_header_add(conn, "Content-Length", "0", -1);
    mg_response_header_send(conn);
    return 503;
  }
  mg_send_http_ok(conn, "text/plain; version=0.0.4; charset=utf-8",
                  static_cast<long long>(page.size()));
  if (std::strcmp(req->request_method, "GET") == 0) mg_write(conn, page.data(), page.size());
  return 200;
}

}  // namespace mmfeed
