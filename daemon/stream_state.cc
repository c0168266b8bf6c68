#include "daemon/stream_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "base/atomic_file.h"

namespace mmfeed {

namespace {
constexpr size_t kMaxStateBytes = 64 << 20;  // a config's text and a cursor per rank
}

nlohmann::json StreamStateToJson(const StreamState& s) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const StreamCursor& c : s.ranks) ranks.push_back(CursorToJson(c));
  nlohmann::json origin = CursorToJson({s.origin_epoch, 0, s.origin_seq, s.origin_stream});
  if (s.origin_previous) origin["previous_stream"] = s.origin_previous;
  if (s.origin_base) origin["base"] = s.origin_base;
  if (s.origin_lanes) origin["base_lanes"] = s.origin_lanes;
  if (s.origin_nodes) origin["base_nodes"] = s.origin_nodes;
  nlohmann::json j = {{"version", 2},
                      {"pipeline", s.pipeline},
                      {"fingerprint", s.fingerprint},
                      {"origin", origin},
                      {"ranks", std::move(ranks)},
                      {"config", {{"file", s.config_file}, {"text", s.config_text}}}};
  for (const MixSwitch& w : s.mix_switches)
    j["mix_switches"].push_back(
        {{"epoch", w.epoch}, {"position", w.position}, {"weights", w.weights}});
  return j;
}

Result<StreamState> StreamStateFromJson(const nlohmann::json& j, const std::string& path) {
  auto bad = [&](const std::string& what) {
    return Status::Invalid(fmt::format(
        "{}: {}; it is not a state file this daemon wrote (move it away to start every rank at "
        "the beginning)",
        path, what));
  };
  if (!j.is_object()) return bad("not a JSON object");
  // An integer however it was made (parsed from text it is unsigned; StreamStateToJson's is
  // signed): a state written is read back, in memory as from its file.
  const int version = !j.contains("version") ? 1
                      : j["version"].is_number_integer() && j["version"].get<int64_t>() >= 1 &&
                              j["version"].get<int64_t>() <= 2
                          ? static_cast<int>(j["version"].get<int64_t>())
                          : -1;
  if (version != 1 && version != 2) return bad("unknown \"version\"");
  StreamState s;
  if (!j.contains("fingerprint") || !j["fingerprint"].is_string())
    return bad("no string \"fingerprint\"");
  s.fingerprint = j["fingerprint"].get<std::string>();
  if (j.contains("pipeline") && j["pipeline"].is_string())
    s.pipeline = j["pipeline"].get<std::string>();
  if (j.contains("origin")) {
    Result<StreamCursor> o = CursorFromJson(j["origin"]);
    if (!o.ok() || o->batch != 0) return bad("\"origin\" is not an epoch's first batch");
    s.origin_epoch = o->epoch;
    s.origin_seq = o->seq;
    s.origin_stream = o->stream;
    if (j["origin"].contains("previous_stream")) {
      const nlohmann::json& p = j["origin"]["previous_stream"];
      if (!p.is_number_unsigned() || p.get<uint64_t>() > UINT32_MAX)
        return bad("\"origin\".\"previous_stream\" is not a 32-bit tag");
      s.origin_previous = p.get<uint32_t>();
    }
    if (j["origin"].contains("base")) {
      if (!j["origin"]["base"].is_number_unsigned())
        return bad("\"origin\".\"base\" is not a position");
      s.origin_base = j["origin"]["base"].get<uint64_t>();
    }
    for (auto [key, count] :
         {std::pair{"base_lanes", &s.origin_lanes}, std::pair{"base_nodes", &s.origin_nodes}}) {
      if (!j["origin"].contains(key)) continue;
      const nlohmann::json& l = j["origin"][key];
      if (!l.is_number_unsigned() || l.get<uint64_t>() > UINT32_MAX)
        return bad(fmt::format("\"origin\".\"{}\" is not a 32-bit count", key));
      *count = l.get<uint32_t>();
    }
  }
  if (!j.contains("ranks") || !j["ranks"].is_array() || j["ranks"].empty())
    return bad("no \"ranks\" array");
  for (const auto& r : j["ranks"]) {
    Result<StreamCursor> c = CursorFromJson(r);
    if (!c.ok()) return bad(fmt::format("rank {}: {}", s.ranks.size(), c.status().message()));
    s.ranks.push_back(*c);
  }
  if (version == 2) {
    const auto& c = j.contains("config") ? j["config"] : nlohmann::json();
    if (!c.is_object() || !c.contains("file") || !c["file"].is_string() || !c.contains("text") ||
        !c["text"].is_string())
      return bad("no \"config\" with a \"file\" and a \"text\"");
    s.config_file = c["file"].get<std::string>();
    s.config_text = c["text"].get<std::string>();
  }
  if (j.contains("mix_switches")) {
    const nlohmann::json& list = j["mix_switches"];
    if (!list.is_array()) return bad("\"mix_switches\" is not an array");
    for (const nlohmann::json& w : list) {
      const bool ok = w.is_object() && w.contains("epoch") && w["epoch"].is_number_unsigned() &&
                      w["epoch"].get<uint64_t>() <= UINT32_MAX && w.contains("position") &&
                      w["position"].is_number_unsigned() && w.contains("weights") &&
                      w["weights"].is_array() && !w["weights"].empty() &&
                      std::all_of(w["weights"].begin(), w["weights"].end(),
                                  [](const nlohmann::json& x) { return x.is_number(); });
      if (!ok)
        return bad(fmt::format("mix_switches[{}] is not {{\"epoch\", \"position\", \"weights\"}}",
                               s.mix_switches.size()));
      s.mix_switches.push_back({w["epoch"].get<uint32_t>(), w["position"].get<uint64_t>(),
                                w["weights"].get<std::vector<double>>()});
    }
  }
  return s;
}

Result<std::optional<StreamState>> ReadStreamState(const std::string& path) {
  Result<std::optional<std::string>> text = ReadSmallFile(path, kMaxStateBytes);
  if (!text.ok())
    return text.status().WithContext(
        "--state-dir (move it away to start every rank at the beginning)");
  if (!*text) return std::optional<StreamState>();
  nlohmann::json j = nlohmann::json::parse(**text, nullptr, false);
  if (j.is_discarded())
    return Status::Invalid(fmt::format(
        "{}: not valid JSON (move it away to start every rank at the beginning)", path));
  MMFEED_ASSIGN_OR_RETURN(StreamState s, StreamStateFromJson(j, path));
  return std::optional<StreamState>(std::move(s));
}

}  // namespace mmfeed
