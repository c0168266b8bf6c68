#include "daemon/metrics.h"

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
  // HELP escapes a backslash and a line break (the text format's rule for it).
  std::string escaped;
  for (char c : help) escaped += c == '\\' ? "\\\\" : c == '\n' ? "\\n" : std::string(1, c);
  text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escaped, name, type);
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

// One HTTP/1.x request, answered, then the connection is closed.
class MetricsServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(asio::ip::tcp::socket socket, std::shared_ptr<std::string> page)
      : socket_(std::move(socket)),
        page_(std::move(page)),
        buffer_(kMaxRequestBytes),
        deadline_(socket_.get_executor()) {}

  void Start() {
    auto self = shared_from_this();
    deadline_.expires_after(kRequestTimeout);
    deadline_.async_wait([this, self](std::error_code ec) {
      if (!ec) Close();  // a request that does not come whole in time
    });
    asio::async_read_until(socket_, buffer_, "\r\n\r\n",
                           [this, self](std::error_code ec, size_t n) {
                             if (ec) return Close();  // closed, too long, or timed out
                             std::string head(asio::buffers_begin(buffer_.data()),
                                              asio::buffers_begin(buffer_.data()) + n);
                             Answer(head);
                           });
  }

  void Close() {
    std::error_code ec;
    deadline_.cancel(ec);
    socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

 private:
  void Answer(const std::string& head) {
    // "GET /metrics HTTP/1.1": the method, then the path (its query, if any, ignored).
    const size_t sp = head.find(' '), sp2 = head.find(' ', sp + 1);
    const std::string method = head.substr(0, sp);
    std::string path = sp == std::string::npos ? "" : head.substr(sp + 1, sp2 - sp - 1);
    path = path.substr(0, path.find('?'));
    std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
    if (path != "/metrics") {
      status = "404 Not Found";
    } else if (method != "GET" && method != "HEAD") {
      status = "405 Method Not Allowed";
    } else if (page_->empty()) {  // never an empty 200: a scraper would mark every series stale
      status = "503 Service Unavailable";
    } else {
      body = *page_;
    }
    if (status[0] != '2') {
      type = "text/plain; charset=utf-8";
      body = status.substr(4) + "\n";
    }
    auto reply = std::make_shared<std::string>(
        fmt::format("HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: "
                    "close\r\n\r\n",
                    status, type, body.size(), status[0] == '5' ? "Retry-After: 1\r\n" : ""));
    if (method != "HEAD") *reply += body;
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(*reply),
                      [this, self, reply](std::error_code, size_t) { Close(); });
  }

  asio::ip::tcp::socket socket_;
  std::shared_ptr<std::string> page_;
  asio::streambuf buffer_;
  asio::steady_timer deadline_;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(asio::io_context& io,
                                                            const std::string& listen) {
  auto fail = [&](const std::string& why) {
    return Status::Io(fmt::format("metrics.listen {}: cannot serve /metrics: {}", listen, why));
  };
  // PORT, HOST:PORT or [IPV6]:PORT.
  std::string host = "0.0.0.0", port = listen;
  if (!listen.empty() && listen[0] == '[') {
    const size_t close = listen.find("]:");
    if (close == std::string::npos) return fail("expected [IPV6]:PORT");
    host = listen.substr(1, close - 1);
    port = listen.substr(close + 2);
  } else if (const size_t colon = listen.rfind(':'); colon != std::string::npos) {
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
  }
  std::unique_ptr<MetricsServer> s(new MetricsServer(io));
  std::error_code ec;
  asio::ip::tcp::resolver resolver(io);
  auto found = resolver.resolve(host, port, asio::ip::tcp::resolver::passive, ec);
  if (ec || found.empty()) return fail(ec ? ec.message() : "no such address");
  const asio::ip::tcp::endpoint at = *found.begin();
  s->acceptor_.open(at.protocol(), ec);
  if (!ec) s->acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) s->acceptor_.bind(at, ec);
  if (!ec) s->acceptor_.listen(64, ec);
  if (ec) return fail(ec.message());
  s->Accept();
  return s;
}

MetricsServer::~MetricsServer() {
  std::error_code ec;
  acceptor_.close(ec);
  retry_.cancel(ec);
  for (auto& w : connections_)
    if (auto c = w.lock()) c->Close();
}

void MetricsServer::Publish(std::string page) { *page_ = std::move(page); }

void MetricsServer::Accept() {
  acceptor_.async_accept([this](std::error_code ec, asio::ip::tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;  // closed: `this` may be gone
    if (!ec) {
      connections_.remove_if([](const auto& w) { return w.expired(); });
      if (connections_.size() >= kMaxConnections) {  // the oldest makes room
        if (auto oldest = connections_.front().lock()) oldest->Close();
        connections_.pop_front();
      }
      auto c = std::make_shared<Connection>(std::move(socket), page_);
      connections_.push_back(c);
      c->Start();
    }
    if (!ec) return Accept();
    retry_.expires_after(std::chrono::milliseconds(100));  // EMFILE and friends: not a spin
    retry_.async_wait([this](std::error_code e) {
      if (!e) Accept();
    });
  });
}

}  // namespace mmfeed
