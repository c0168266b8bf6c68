#include "daemon/control_protocol.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace mmfeed {

Result<ControlRequest> ParseControlRequest(std::string_view line) {
  nlohmann::json req = nlohmann::json::parse(line, nullptr, false);
  if (req.is_discarded() || !req.is_object() || !req.contains("cmd") || !req["cmd"].is_string())
    return Status::Invalid("expected one JSON object per line with a \"cmd\"");
  const std::string& cmd = req["cmd"].get_ref<const std::string&>();
  ControlRequest r;
  if (cmd == "status") {
    r.cmd = ControlRequest::Cmd::kStatus;
  } else if (cmd == "stop") {
    r.cmd = ControlRequest::Cmd::kStop;
  } else if (cmd == "reload") {
    r.cmd = ControlRequest::Cmd::kReload;
    if (req.contains("config")) {
      if (!req["config"].is_string() || req["config"].get_ref<const std::string&>().empty())
        return Status::Invalid("reload's \"config\" must be a file path");
      r.config = req["config"].get<std::string>();
    }
  } else if (cmd == "profile") {
    r.cmd = ControlRequest::Cmd::kProfile;
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
    r.cmd = ControlRequest::Cmd::kAttach;
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
  } else {
    return Status::Invalid(
        fmt::format("unknown command '{}'; expected attach, status, profile, reload or stop", cmd));
  }
  return r;
}

}  // namespace mmfeed
