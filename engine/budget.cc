#include "engine/budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <queue>
#include <utility>

#include "source/catalog.h"
#include "source/index_file.h"

namespace mmfeed {

std::string BatchBudget::Refuses(const SampleCost& c) const {
  if (max_tokens > 0 && c.tokens > max_tokens)
    return fmt::format("{} tokens, above the batch's max_tokens {}", c.tokens, max_tokens);
  if (max_patches > 0 && c.patches > max_patches)
    return fmt::format("{} patches, above the batch's max_patches {}", c.patches, max_patches);
  return "";
}

namespace {

constexpr char kCostMagic[8] = {'M', 'M', 'F', 'C', 'O', 'S', 'T', '1'};

struct CostHeader {
  char magic[8];
  uint64_t key, count, failures;
};

void Append(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}

}  // namespace

std::string CostIndexPath(const std::string& source_path, const std::string& index_dir) {
  return index_file::IndexPath(source_path + ".costs", index_dir);
}

Result<MeasuredCatalog> ReadCostIndex(const std::string& path, uint64_t key, size_t count) {
  index_file::MappedFile f;
  if (!f.Map(path)) return Status::NotFound(fmt::format("{}: {}", path, std::strerror(errno)));
  CostHeader h;
  const size_t costs_bytes = count * sizeof(SampleCost);
  if (f.size() < sizeof h + costs_bytes) return Status::Corrupt(path + ": too short");
  std::memcpy(&h, f.data(), sizeof h);
  if (std::memcmp(h.magic, kCostMagic, sizeof kCostMagic) != 0)
    return Status::Corrupt(path + ": not a cost index");
  if (h.key != key || h.count != count)
    return Status::Invalid(path + ": measured from another source or other stage parameters");
  MeasuredCatalog m;
  m.costs.resize(count);
  std::memcpy(m.costs.data(), f.data() + sizeof h, costs_bytes);
  // Failures: entry, code, then the stage's and the message's length and bytes.
  size_t at = sizeof h + costs_bytes;
  auto take = [&](void* p, size_t n) {
    if (f.size() - at < n) return false;
    std::memcpy(p, f.data() + at, n);
    at += n;
    return true;
  };
  for (uint64_t i = 0; i < h.failures; ++i) {
    uint32_t entry, code, stage_n, message_n;
    if (!take(&entry, 4) || !take(&code, 4) || !take(&stage_n, 4) || entry >= count ||
        code > static_cast<uint32_t>(Status::Code::kResourceExhausted) || code == 0)
      return Status::Corrupt(path + ": damaged failure list");
    std::string stage(stage_n, '\0');
    if (!take(stage.data(), stage_n) || !take(&message_n, 4))
      return Status::Corrupt(path + ": cut");
    std::string message(message_n, '\0');
    if (!take(message.data(), message_n)) return Status::Corrupt(path + ": cut");
    m.failures.push_back(
        {entry, std::move(stage), Status(static_cast<Status::Code>(code), std::move(message))});
  }
  if (at != f.size()) return Status::Corrupt(path + ": trailing bytes");
  return m;
}

bool WriteCostIndex(const std::string& path, uint64_t key, const MeasuredCatalog& m) {
  CostHeader h;
  std::memcpy(h.magic, kCostMagic, sizeof kCostMagic);
  h.key = key;
  h.count = m.costs.size();
  h.failures = m.failures.size();
  std::string out;
  Append(&out, &h, sizeof h);
  Append(&out, m.costs.data(), m.costs.size() * sizeof(SampleCost));
  for (const MeasuredCatalog::Failure& f : m.failures) {
    const uint32_t code = static_cast<uint32_t>(f.status.code()),
                   stage_n = static_cast<uint32_t>(f.stage.size()),
                   message_n = static_cast<uint32_t>(f.status.message().size());
    Append(&out, &f.entry, 4);
    Append(&out, &code, 4);
    Append(&out, &stage_n, 4);
    out += f.stage;
    Append(&out, &message_n, 4);
    out += f.status.message();
  }
  return index_file::WriteAtomically(path, out);
}

EpochPlan PlanEpoch(const std::vector<SampleCost>& costs, const SourceConfig& source,
                    uint32_t epoch, int consumers, const BatchBudget& budget, bool with_ranks,
                    const Catalog* catalog, uint64_t base, const Mixture* numbering,
                    uint32_t lanes) {
  // The epoch's global order from the base: every node's positions put in their places.
  std::vector<uint32_t> global;
  for (int node = 0; node < source.num_nodes; ++node) {
    SourceConfig s = source;
    s.node_rank = node;
    const EpochOrder order = catalog
                                 ? EpochOrder(*catalog, s, epoch, consumers, base, numbering, lanes)
                                 : EpochOrder(costs.size(), s, epoch, consumers, base);
    if (node == 0) global.resize(order.size() * source.num_nodes);
    for (size_t i = 0; i < order.size(); ++i) global[order.GlobalOf(i)] = order[i];
  }
  const size_t streams = static_cast<size_t>(consumers) * source.num_nodes,
               own = static_cast<size_t>(source.node_rank) * consumers;  // this node's first
  struct Fill {
    int64_t rows = 0, tokens = 0, patches = 0;
  };
  auto fullness = [&](const Fill& f) {
    double x = static_cast<double>(f.rows) / static_cast<double>(budget.max_rows);
    if (budget.max_tokens > 0)
      x = std::max(x, static_cast<double>(f.tokens) / static_cast<double>(budget.max_tokens));
    if (budget.max_patches > 0)
      x = std::max(x, static_cast<double>(f.patches) / static_cast<double>(budget.max_patches));
    return x;
  };
  EpochPlan plan;
  plan.steps.push_back(base);
  if (with_ranks) plan.ranks.assign(consumers, RankPlan{{}, {0}});
  std::vector<Fill> fill(streams);
  std::vector<std::vector<uint32_t>> step(consumers);  // this node's ranks' rows in the step
  using Least = std::pair<double, size_t>;             // fullness, stream: the least full on top
  uint64_t usable = 0;
  for (size_t t = 0; t < global.size();) {
    std::priority_queue<Least, std::vector<Least>, std::greater<Least>> heap;
    for (size_t s = 0; s < streams; ++s) heap.emplace(0.0, s);
    fill.assign(streams, Fill{});
    for (auto& rows : step) rows.clear();
    size_t started = 0;  // streams with a row
    for (; t < global.size(); ++t) {
      const SampleCost& c = costs[global[t]];
      if (!c.usable() || !budget.Fits(1, c.tokens, c.patches)) continue;
      const size_t s = heap.top().second;
      Fill& f = fill[s];
      if (!budget.Fits(f.rows + 1, f.tokens + c.tokens, f.patches + c.patches)) break;
      heap.pop();
      started += f.rows == 0;
      ++f.rows;
      f.tokens += c.tokens;
      f.patches += c.patches;
      heap.emplace(fullness(f), s);
      ++usable;
      if (with_ranks && s >= own && s < own + consumers) step[s - own].push_back(global[t]);
    }
    if (started < streams) break;  // the order ran out: the rest waits for the next epoch
    ++plan.batches;
    plan.steps.push_back(base + t);
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      RankPlan& rp = plan.ranks[r];
      rp.entries.insert(rp.entries.end(), step[r].begin(), step[r].end());
      rp.starts.push_back(static_cast<uint32_t>(rp.entries.size()));
    }
  }
  if (plan.batches == 0) {
    plan.status = Status::Invalid(fmt::format(
        "epoch {}: {} usable sample(s) from position {} of its order, too few for a batch for "
        "each of the {} rank(s) of the job; too many samples fail or pass a budget on their own",
        epoch, usable, base, streams));
    plan.ranks.clear();
  }
  return plan;
}

}  // namespace mmfeed
