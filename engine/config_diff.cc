#include "engine/config_diff.h"

#include <fmt/format.h>

namespace mmfeed {
namespace {

const StageConfig* Find(const PipelineConfig& cfg, const std::string& name) {
  for (const StageConfig& s : cfg.stages)
    if (s.name == name) return &s;
  return nullptr;
}

std::string PlacementText(const Placement& p) {
  return fmt::format("{}/{}", p.numa_node, p.strict);
}

// What differs in a stage's definition, besides its worker count ("" if nothing).
std::string StageDifference(const StageConfig& a, const StageConfig& b) {
  std::vector<std::string> what;
  if (a.type != b.type) what.push_back(fmt::format("type {} -> {}", a.type, b.type));
  if (a.field != b.field) what.push_back(fmt::format("field {} -> {}", a.field, b.field));
  if (a.inputs != b.inputs) what.push_back("inputs");
  if (a.params.Canonical() != b.params.Canonical()) what.push_back("params");
  if (a.queue != b.queue) what.push_back(fmt::format("queue {} -> {}", a.queue, b.queue));
  if (PlacementText(a.placement) != PlacementText(b.placement)) what.push_back("placement");
  if (a.cache_max_bytes != b.cache_max_bytes)
    what.push_back(fmt::format("cache {} -> {} bytes", a.cache_max_bytes, b.cache_max_bytes));
  if (a.cache_disk_dir != b.cache_disk_dir || a.cache_disk_max_bytes != b.cache_disk_max_bytes)
    what.push_back(fmt::format("cache disk {} ({} bytes) -> {} ({} bytes)", a.cache_disk_dir,
                               a.cache_disk_max_bytes, b.cache_disk_dir, b.cache_disk_max_bytes));
  return fmt::format("{}", fmt::join(what, ", "));
}

}  // namespace

bool ConfigChanges::empty() const {
  for (const auto& [key, list] : json.items())
    if (!list.empty()) return false;
  return needs_restart.empty();
}

std::string ConfigChanges::Summary() const {
  std::vector<std::string> parts;
  for (const auto& s : json["stages_added"]) parts.push_back("added " + s.get<std::string>());
  for (const auto& s : json["stages_removed"]) parts.push_back("removed " + s.get<std::string>());
  for (const auto& s : json["stages_changed"])
    parts.push_back(
        fmt::format("{}: {}", s["stage"].get<std::string>(), s["what"].get<std::string>()));
  auto count = [](const nlohmann::json& n) {  // a number, or "auto"
    return n.is_string() ? n.get<std::string>() : n.dump();
  };
  for (const auto& w : json["workers"])
    parts.push_back(fmt::format("workers of {} {} -> {}", w["stage"].get<std::string>(),
                                count(w["from"]), count(w["to"])));
  for (const auto& s : json["settings"]) parts.push_back(s.get<std::string>() + " changed");
  return parts.empty() ? "nothing changed" : fmt::format("{}", fmt::join(parts, "; "));
}

ConfigChanges DiffConfigs(const PipelineConfig& a, const PipelineConfig& b) {
  ConfigChanges c;
  c.json = {{"stages_added", nlohmann::json::array()},
            {"stages_removed", nlohmann::json::array()},
            {"stages_changed", nlohmann::json::array()},
            {"workers", nlohmann::json::array()},
            {"settings", nlohmann::json::array()}};
  for (const StageConfig& s : b.stages)
    if (!Find(a, s.name)) c.json["stages_added"].push_back(s.name);
  for (const StageConfig& s : a.stages) {
    const StageConfig* t = Find(b, s.name);
    if (!t) {
      c.json["stages_removed"].push_back(s.name);
      continue;
    }
    std::string what = StageDifference(s, *t);
    if (!what.empty()) c.json["stages_changed"].push_back({{"stage", s.name}, {"what", what}});
    auto workers = [](const StageConfig& x) {
      return x.workers_auto ? nlohmann::json("auto") : nlohmann::json(x.workers);
    };
    if (workers(s) != workers(*t))
      c.json["workers"].push_back({{"stage", s.name}, {"from", workers(s)}, {"to", workers(*t)}});
  }
  auto setting = [&](const char* name, bool differs) {
    if (differs) c.json["settings"].push_back(name);
  };
  setting("pipeline", a.name != b.name);
  setting("source", a.source.type != b.source.type || a.source.path != b.source.path ||
                        a.source.fields != b.source.fields || a.source.keys != b.source.keys);
  // A mixture's sources and shares: what each epoch deals (the pipeline's order fingerprint
  // then differs, so the switch is at an epoch boundary).
  auto mix_text = [](const PipelineConfig& c, bool weights = true) {
    std::string out = c.mix.mode + "|" + std::to_string(c.mix.samples_per_epoch);
    for (const SourceConfig& s : c.sources) {
      out += fmt::format("|{}:{}:{}:{}:{}:{}:{}:{}", s.name, s.type, s.path,
                         weights ? s.weight : 0.0, s.repeat, s.shuffle, s.seed, s.index);
      for (const auto& [field, key] : s.keys) out += fmt::format(":{}={}", field, key);
      for (const auto& [field, exts] : s.fields)
        out += fmt::format(":{}={}", field, fmt::join(exts, ","));
    }
    return out;
  };
  setting("sources", mix_text(a) != mix_text(b));
  c.weights_only = !a.sources.empty() && a.mix.mode == "weighted" && mix_text(a) != mix_text(b) &&
                   mix_text(a, false) == mix_text(b, false) &&
                   a.source.shuffle == b.source.shuffle && a.source.seed == b.source.seed &&
                   a.source.epochs == b.source.epochs && a.consumers == b.consumers &&
                   a.batch_size == b.batch_size && a.drop_last == b.drop_last;
  setting("source.shuffle", a.source.shuffle != b.source.shuffle);
  setting("source.seed", a.source.seed != b.source.seed);
  setting("source.shuffle_window", a.source.shuffle_window != b.source.shuffle_window);
  setting("source.fetch",
          a.source.fetch.concurrency != b.source.fetch.concurrency ||
              a.source.fetch.prefetch_bytes != b.source.fetch.prefetch_bytes ||
              a.source.fetch.retries != b.source.fetch.retries ||
              a.source.fetch.timeout_s != b.source.fetch.timeout_s ||
              a.source.fetch.stall_s != b.source.fetch.stall_s ||
              a.source.fetch.max_shard_bytes != b.source.fetch.max_shard_bytes ||
              a.source.fetch.s3_endpoint != b.source.fetch.s3_endpoint ||
              a.source.fetch.s3_region != b.source.fetch.s3_region ||
              a.source.fetch.s3_credentials_file != b.source.fetch.s3_credentials_file ||
              a.source.fetch.s3_profile != b.source.fetch.s3_profile);
  setting("source.cache", a.source.fetch.cache_dir != b.source.fetch.cache_dir ||
                              a.source.fetch.cache_max_bytes != b.source.fetch.cache_max_bytes);
  setting("source.epochs", a.source.epochs != b.source.epochs);
  setting("source.max_bytes", a.source.max_bytes != b.source.max_bytes);
  setting("source.node_rank", a.source.node_rank != b.source.node_rank);
  setting("source.num_nodes", a.source.num_nodes != b.source.num_nodes);
  setting("consumers", a.consumers != b.consumers);
  setting("replicas", a.replicas != b.replicas);
  setting("batch_size", a.batch_size != b.batch_size);
  setting("drop_last", a.drop_last != b.drop_last);
  setting("output.ring_slots", a.ring_slots != b.ring_slots);
  setting("data_roots", a.data_roots != b.data_roots || a.data_roots_any != b.data_roots_any);
  setting("on_error", a.on_error != b.on_error);
  setting("placement", PlacementText(a.placement) != PlacementText(b.placement));
  setting("metrics.listen", a.metrics_listen != b.metrics_listen);
  setting("sample_timeout_s", a.sample_timeout_s != b.sample_timeout_s);
  setting("cpu_budget", a.cpu_budget != b.cpu_budget);
  setting("cache_budget", a.cache_budget != b.cache_budget);
  setting("faults", a.faults.stage != b.faults.stage ||
                        a.faults.read_delay_ms != b.faults.read_delay_ms ||
                        a.faults.leak_bytes_per_item != b.faults.leak_bytes_per_item);

  // What the rings or every rank's batch numbering are made from cannot change under
  // attached trainers.
  auto restart = [&](bool differs, const std::string& why) {
    if (differs && c.needs_restart.empty()) c.needs_restart = why;
  };
  restart(a.ring_slots != b.ring_slots,
          fmt::format("output.ring_slots {} -> {} changes the rings", a.ring_slots, b.ring_slots));
  restart(a.replicas != b.replicas,
          fmt::format("replicas {} -> {} changes which trainer ranks share a ring", a.replicas,
                      b.replicas));
  restart(a.placement.numa_node != b.placement.numa_node,
          "placement.numa_node changes the NUMA node the rings' memory is bound to");
  restart(a.source.node_rank != b.source.node_rank || a.source.num_nodes != b.source.num_nodes,
          "source.node_rank and num_nodes decide this node's share of the data");
  const StageConfig* pa = a.packed_stage >= 0 ? &a.stages[a.packed_stage] : nullptr;
  const StageConfig* pb = b.packed_stage >= 0 ? &b.stages[b.packed_stage] : nullptr;
  restart((pa == nullptr) != (pb == nullptr) ||
              (pa && (pa->name != pb->name || pa->params.Canonical() != pb->params.Canonical())),
          "a packed text stream's rows cross batches: its packing cannot change mid-stream");
  return c;
}

}  // namespace mmfeed
