#include "engine/budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <queue>
#include <tuple>

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

std::vector<uint32_t> PackGreedy(const std::vector<SampleCost>& stream, const BatchBudget& budget) {
  std::vector<uint32_t> starts;
  int64_t rows = 0, tokens = 0, patches = 0;
  for (size_t i = 0; i < stream.size(); ++i) {
    const SampleCost& c = stream[i];
    if (rows == 0 || !budget.Fits(rows + 1, tokens + c.tokens, patches + c.patches)) {
      starts.push_back(static_cast<uint32_t>(i));
      rows = tokens = patches = 0;
    }
    ++rows;
    tokens += c.tokens;
    patches += c.patches;
  }
  starts.push_back(static_cast<uint32_t>(stream.size()));
  return starts;
}

void SplitFullest(const std::vector<SampleCost>& stream, const BatchBudget& budget, uint64_t count,
                  std::vector<uint32_t>* starts) {
  // How full a batch is: its largest share of a budget.
  auto fullness = [&](uint32_t begin, uint32_t end) {
    int64_t tokens = 0, patches = 0;
    for (uint32_t i = begin; i < end; ++i) {
      tokens += stream[i].tokens;
      patches += stream[i].patches;
    }
    double f = static_cast<double>(end - begin) / static_cast<double>(budget.max_rows);
    if (budget.max_tokens > 0)
      f = std::max(f, static_cast<double>(tokens) / static_cast<double>(budget.max_tokens));
    if (budget.max_patches > 0)
      f = std::max(f, static_cast<double>(patches) / static_cast<double>(budget.max_patches));
    return f;
  };
  // The fullest first; among equals the earliest (so the plan is one function of its input).
  using Batch = std::tuple<double, int64_t, uint32_t, uint32_t>;  // fullness, -begin, begin, end
  std::priority_queue<Batch> heap;
  std::vector<uint32_t> single;  // one-sample batches: cannot be split
  for (size_t b = 0; b + 1 < starts->size(); ++b) {
    const uint32_t begin = (*starts)[b], end = (*starts)[b + 1];
    if (end - begin > 1)
      heap.emplace(fullness(begin, end), -static_cast<int64_t>(begin), begin, end);
    else
      single.push_back(begin);
  }
  uint64_t batches = starts->size() - 1;
  while (batches < count && !heap.empty()) {
    auto [f, key, begin, end] = heap.top();
    heap.pop();
    const uint32_t mid = begin + (end - begin) / 2;
    for (auto [b, e] : {std::pair{begin, mid}, std::pair{mid, end}}) {
      if (e - b > 1)
        heap.emplace(fullness(b, e), -static_cast<int64_t>(b), b, e);
      else
        single.push_back(b);
    }
    ++batches;
  }
  starts->assign(single.begin(), single.end());
  for (; !heap.empty(); heap.pop()) starts->push_back(std::get<2>(heap.top()));
  std::sort(starts->begin(), starts->end());
  starts->push_back(static_cast<uint32_t>(stream.size()));
}

EpochPlan PlanEpoch(const std::vector<SampleCost>& costs, const SourceConfig& source,
                    uint32_t epoch, int consumers, uint64_t per_rank, const BatchBudget& budget,
                    bool with_ranks, const Catalog* catalog) {
  EpochPlan plan;
  // Stream (node, rank)'s usable samples in order: their positions in the share and costs.
  std::vector<uint32_t> positions;
  std::vector<SampleCost> stream;
  auto gather = [&](const EpochOrder& order, int rank) {
    positions.clear();
    stream.clear();
    for (uint64_t k = 0; k < per_rank; ++k) {
      const SampleCost& c = costs[order[k * consumers + rank]];
      if (!c.usable()) continue;
      positions.push_back(static_cast<uint32_t>(k));
      stream.push_back(c);
    }
  };
  uint64_t fewest = UINT64_MAX;              // usable samples of the poorest stream
  std::vector<std::vector<SampleCost>> own;  // this node's streams, by rank, for the splits
  for (int node = 0; node < source.num_nodes; ++node) {
    SourceConfig s = source;
    s.node_rank = node;
    const EpochOrder order = catalog ? EpochOrder(*catalog, s, epoch, consumers)
                                     : EpochOrder(costs.size(), s, epoch, consumers);
    for (int r = 0; r < consumers; ++r) {
      gather(order, r);
      std::vector<uint32_t> starts = PackGreedy(stream, budget);
      plan.batches = std::max<uint64_t>(plan.batches, starts.size() - 1);
      fewest = std::min<uint64_t>(fewest, stream.size());
      if (with_ranks && node == source.node_rank) {
        plan.ranks.push_back({positions, std::move(starts)});
        own.push_back(stream);
      }
    }
  }
  if (plan.batches == 0 || plan.batches > fewest) {
    plan.status = Status::Invalid(fmt::format(
        "epoch {}: a rank's share has only {} usable samples, too few for the {} batch(es) that "
        "every rank must have (another rank's budget needs them); too many samples fail or pass "
        "a budget on their own",
        epoch, fewest, std::max<uint64_t>(plan.batches, 1)));
    plan.ranks.clear();
    return plan;
  }
  for (size_t r = 0; r < plan.ranks.size(); ++r)
    SplitFullest(own[r], budget, plan.batches, &plan.ranks[r].starts);
  return plan;
}

}  // namespace mmfeed
