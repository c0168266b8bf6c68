// StreamPlan: the stream's arithmetic (engine/stream_plan.h).
#include "engine/stream_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>

#include "base/rng.h"
#include "engine/sample_cache.h"
#include "source/catalog.h"
#include "source/mixture.h"

namespace mmfeed {

struct StreamPlan::EpochInverse {
  explicit EpochInverse(EpochOrder o) : order(std::move(o)) {}
  EpochOrder order;
  std::vector<uint32_t> at;  // not invertible(): per entry its first position (UINT32_MAX: none)
  uint64_t PositionOf(uint32_t entry) const {
    if (order.invertible()) return order.PositionOf(entry);
    return entry < at.size() && at[entry] != UINT32_MAX ? at[entry] : EpochOrder::kNowhere;
  }
};

// The epochs' token-budget plans (the last few) and batch counts (all), the seqs where epochs
// start, and the orders' inverses (the last few): computed when first asked for.
struct StreamPlan::Memo {
  std::mutex mu;
  std::map<uint32_t, std::shared_ptr<const EpochPlan>> plans;
  std::map<uint32_t, uint64_t> epoch_batches;
  std::vector<uint64_t> epoch_starts;  // [i]: seq of epoch origin + i's first batch
  std::mutex inverse_mu;
  std::map<uint32_t, std::shared_ptr<const EpochInverse>> inverses;
};

Result<StreamPlan> StreamPlan::Make(const PipelineConfig& cfg,
                                    std::shared_ptr<const Catalog> catalog,
                                    std::vector<SampleCost> costs) {
  auto in = std::make_shared<Inputs>();
  in->cfg = cfg;
  in->catalog = std::move(catalog);
  in->costs = std::move(costs);
  const Catalog& cat = *in->catalog;
  StreamPlan p;
  p.in_ = in;
  p.memo_ = std::make_shared<Memo>();
  in->per_rank =
      cat.mixture ? cat.mixture->per_lane() : cat.size() / cfg.source.num_nodes / cfg.consumers;
  in->batches_per_epoch = p.BatchesOf(in->per_rank);
  if (cfg.budgeted()) {
    in->budget = BudgetOf(cfg);
    if (in->costs.size() != cat.size())
      return Status::Invalid(
          fmt::format("{} sample costs for {} samples", in->costs.size(), cat.size()));
    std::shared_ptr<const EpochPlan> first = p.PlanOf(0);
    if (!first->status.ok()) return first->status;
    in->batches_per_epoch = first->batches;
    // Every epoch has at least this many batches: its steps hold all but fewer than streams()
    // of the usable samples dealt, at most batch_size a stream each.
    const uint64_t usable = static_cast<uint64_t>(
        std::count_if(in->costs.begin(), in->costs.end(), [](auto& c) { return c.usable(); }));
    const uint64_t dealt = p.streams() * in->per_rank,
                   left_out = cat.size() > dealt ? cat.size() - dealt : 0;
    const uint64_t stepped = usable > left_out + p.streams() ? usable - left_out - p.streams() : 0;
    in->min_epoch_batches =
        std::max<uint64_t>(1, stepped / p.streams() / static_cast<uint64_t>(cfg.batch_size));
  }
  if (in->batches_per_epoch == 0)
    return Status::Invalid(
        fmt::format("each rank gets {} samples per epoch, fewer than batch_size {} with drop_last",
                    in->per_rank, cfg.batch_size));
  p.Fingerprint(in.get());
  p.origin_.stream = FirstStreamTag(in->order_fingerprint);
  return p;
}

Result<StreamPlan> StreamPlan::WithOrigin(StreamOrigin origin) const {
  StreamPlan p = *this;
  MMFEED_ASSIGN_OR_RETURN(p.numbering_, NumberingOf(origin.base, origin.lanes, origin.nodes));
  origin.lanes = LanesOf(origin.base, origin.lanes);
  origin.nodes = NodesOf(p.numbering_.get(), origin.nodes);
  p.origin_ = origin;
  p.memo_ = std::make_shared<Memo>();  // the origin epoch's plan depends on the base
  return p;
}

StreamPlan StreamPlan::WithCatalog(std::shared_ptr<const Catalog> catalog) const {
  auto in = std::make_shared<Inputs>(*in_);
  in->catalog = std::move(catalog);
  StreamPlan p;
  p.in_ = in;
  p.memo_ = std::make_shared<Memo>();
  p.Fingerprint(in.get());
  p.origin_.stream = FirstStreamTag(in->order_fingerprint);
  return p;
}

// The fingerprint: the order's version ("order 2": the shuffle is a Feistel permutation; a
// cursor saved by a daemon that shuffled with a table is for another stream), every catalog
// id in order, then the settings (each stage's full config stands in for its sample-changing
// parameters).
void StreamPlan::Fingerprint(Inputs* in) {
  const PipelineConfig& cfg = in->cfg;
  const Catalog& cat = *in->catalog;
  uint64_t h = HashString(fmt::format(
      "order 2|{}|{}|{}|{}|{}|{}|{}|{}", cfg.source.seed, cfg.source.shuffle, cfg.source.node_rank,
      cfg.source.num_nodes, cfg.consumers, cfg.batch_size, cfg.drop_last, cfg.source.epochs));
  if (cfg.source.shuffle_window > 0)  // window mode: another order
    h = HashString(fmt::format("windows {}", cfg.source.shuffle_window), h);
  for (const auto& [field, key] : cfg.source.keys)  // a manifest's fields read from other keys
    h = HashString(fmt::format("key {}={}", field, key), h);
  if (cat.indexed())  // an indexed source: its contents (size, mtime, inode, ends)
    h = HashString(fmt::format("index {:016x}", cat.index_fingerprint()), h);
  if (cfg.budgeted()) {  // the budgets and every sample's cost decide the batches
    h = HashString(fmt::format("budget {}|{}", cfg.max_tokens, cfg.max_patches), h);
    h = HashString(std::string_view(reinterpret_cast<const char*>(in->costs.data()),
                                    in->costs.size() * sizeof(SampleCost)),
                   h);
  }
  // The order tag: what decides the epochs' global order, without the shape.
  uint64_t o = HashString(
      fmt::format("position 1|{}|{}|{}", cfg.source.seed, cfg.source.shuffle, cfg.source.epochs));
  if (cat.InWindows(cfg.source))
    o = HashString(fmt::format("windows {}", cfg.source.shuffle_window), o);
  for (const auto& [field, key] : cfg.source.keys)
    o = HashString(fmt::format("key {}={}", field, key), o);
  if (cat.indexed()) o = HashString(fmt::format("index {:016x}", cat.index_fingerprint()), o);
  for (const CatalogEntry& e : cat.entries) {
    h = HashString(e.id, HashString("\n", h));
    o = HashString(e.id, HashString("\n", o));
  }
  in->order_tag = static_cast<uint32_t>(o) | 1;  // never 0
  in->order_fingerprint = fmt::format("{:016x}", h);
  for (const StageConfig& s : cfg.stages)
    h = HashString(fmt::format("{}|{}|{}|{}", s.name, s.type, s.field, s.params.Canonical()), h);
  in->fingerprint = fmt::format("{:016x}", h);
}

uint32_t StreamPlan::FirstStreamTag(const std::string& order_fingerprint) {
  return static_cast<uint32_t>(HashString("stream|" + order_fingerprint)) | 1;  // never 0
}

uint32_t StreamPlan::NextStreamTag(const StreamOrigin& before, uint64_t seq,
                                   const std::string& order_fingerprint) {
  return static_cast<uint32_t>(
             HashString(fmt::format("{:08x}|{}|{}", before.stream, seq, order_fingerprint))) |
         1;
}

// What numbers a base's positions (StreamOrigin::base, lanes, nodes): a mixture's catalog
// Mixture dealt to `lanes` (over `nodes` nodes where a source in shard windows makes them count);
// null without a mixture or a base.
Result<std::shared_ptr<const Mixture>> StreamPlan::NumberingOf(uint64_t base, uint32_t lanes,
                                                               uint32_t nodes) const {
  const std::shared_ptr<const Mixture>& own = in_->catalog->mixture;
  if (!own || base == 0) return std::shared_ptr<const Mixture>();
  if (lanes == 0)
    return Status::Invalid(
        "the cursor does not name the shape its mixture position counts in (its \"lanes\"; a "
        "cursor saved by an older client)");
  // A source in shard windows numbers its draws node by node: the nodes count too.
  const bool by_node = WindowedSource() != nullptr;
  if (by_node && (nodes == 0 || lanes % nodes != 0))
    return Status::Invalid(fmt::format(
        "the cursor does not name the nodes its mixture position counts in (its \"nodes\", "
        "which a mixture with a source in shard windows needs besides its {} lanes)",
        lanes));
  if (lanes == own->lanes() &&
      (!by_node || nodes == static_cast<uint32_t>(in_->cfg.source.num_nodes)))
    return own;
  Result<Mixture> m = own->WithLanes(lanes, by_node ? lanes / nodes : 0);
  if (!m.ok())
    return m.status().WithContext(
        fmt::format("the mixture dealt to the cursor's {} consumer rank(s)", lanes));
  return std::make_shared<const Mixture>(std::move(m.value()));
}

// The lanes an origin's base counts in: a mixture's as given, shard windows' nodes (at least
// 1), else 0.
uint32_t StreamPlan::LanesOf(uint64_t base, uint32_t lanes) const {
  if (in_->catalog->mixture) return lanes;
  // Shard windows: the nodes whose parts the base's order interleaves (a cursor without them is
  // of one node's windows, the only windowed order with positions before they were named).
  if (base && in_->catalog->InWindows(in_->cfg.source)) return std::max(lanes, 1u);
  return 0;
}

// The nodes an origin's mixture numbering counts in: `nodes` where a source in shard windows
// makes them count, else 0.
uint32_t StreamPlan::NodesOf(const Mixture* numbering, uint32_t nodes) const {
  return numbering && WindowedSource() ? nodes : 0;
}

// The positions of an epoch's global order under `numbering` (a mixture's) or `lanes` (shard
// windows'): a position names the samples before it, so 0 to this number are valid.
uint64_t StreamPlan::PositionsOf(const Mixture* numbering, uint32_t lanes) const {
  uint64_t n = in_->catalog->size();
  if (numbering)
    n = numbering->per_lane() * numbering->lanes();
  else if (lanes)
    n = n / lanes * lanes;  // shard windows: the lanes' equal parts
  return n;
}

// The samples a stream gets from position `base` of an epoch on.
uint64_t StreamPlan::PerRankFrom(uint64_t base, const Mixture* numbering, uint32_t lanes) const {
  const uint64_t n = PositionsOf(numbering, lanes);
  return (n - std::min(base, n)) / streams();
}

EpochOrder StreamPlan::OrderOf(uint32_t epoch) const {
  const uint64_t base = BaseOf(epoch);
  return EpochOrder(*in_->catalog, in_->cfg.source, epoch, in_->cfg.consumers, base,
                    base ? numbering_.get() : nullptr, base ? origin_.lanes : 0);
}

std::vector<uint32_t> StreamPlan::ReadingOrder(uint32_t epoch, size_t part) const {
  constexpr int kAll = std::numeric_limits<int>::max();
  const Catalog& cat = *in_->catalog;
  if (!cat.mixture) return OrderOf(epoch).WindowShards(0, kAll);
  // A mixture's source: this node's draws of it in `epoch` are one run (its lanes' first to
  // last draw), read in its passes' window orders.
  const Mixture& mix = *cat.mixture;
  const uint32_t src = static_cast<uint32_t>(part);
  const int consumers = in_->cfg.consumers;
  uint64_t lo = UINT64_MAX, hi = 0;
  for (int r = 0; r < consumers; ++r) {
    const uint32_t lane = static_cast<uint32_t>(in_->cfg.source.node_rank * consumers + r);
    const uint64_t q = mix.LaneQuota(src, lane);
    if (q == 0) continue;
    lo = std::min(lo, mix.DrawOf(epoch, lane, src, 0).draw);
    hi = std::max(hi, mix.DrawOf(epoch, lane, src, q - 1).draw);
  }
  if (lo > hi) return {};
  return cat.parts[part]->PassShards(cat.part_sources[part], lo, hi, hi, 0, kAll);
}

std::shared_ptr<const StreamPlan::EpochInverse> StreamPlan::InverseOf(uint32_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(memo_->inverse_mu);
    auto it = memo_->inverses.find(epoch);
    if (it != memo_->inverses.end()) return it->second;
  }
  auto inv = std::make_shared<EpochInverse>(OrderOf(epoch));
  if (!inv->order.invertible()) {
    inv->at.assign(in_->catalog->size(), UINT32_MAX);
    for (size_t i = inv->order.size(); i-- > 0;) inv->at[inv->order[i]] = static_cast<uint32_t>(i);
  }
  std::lock_guard<std::mutex> lock(memo_->inverse_mu);
  auto& kept = memo_->inverses[epoch];
  if (!kept) kept = std::move(inv);
  while (memo_->inverses.size() > 8) memo_->inverses.erase(memo_->inverses.begin());  // oldest
  return kept;
}

uint64_t StreamPlan::NextUse(uint32_t entry, uint32_t after) const {
  const int epochs = in_->cfg.source.epochs;
  for (uint32_t e = after + 1; e <= after + kFutureEpochs; ++e) {
    if (epochs > 0 && e >= static_cast<uint32_t>(epochs)) break;
    const uint64_t pos = InverseOf(e)->PositionOf(entry);
    if (pos != EpochOrder::kNowhere) return (uint64_t{e} << 32) | pos;
  }
  return SampleCache::kNever;
}

uint64_t StreamPlan::BatchesOf(uint64_t per_rank) const {
  const uint64_t bs = static_cast<uint64_t>(in_->cfg.batch_size);
  return in_->cfg.drop_last ? per_rank / bs : (per_rank + bs - 1) / bs;
}

uint64_t StreamPlan::PerRank(uint32_t epoch) const {
  return BaseOf(epoch) ? PerRankFrom(BaseOf(epoch), numbering_.get(), origin_.lanes)
                       : in_->per_rank;
}

int StreamPlan::RowsOf(uint32_t epoch, uint64_t index) const {
  const uint64_t bs = static_cast<uint64_t>(in_->cfg.batch_size);
  return static_cast<int>(std::min(bs, PerRank(epoch) - index * bs));
}

std::vector<uint32_t> StreamPlan::BatchEntries(int rank, const StreamCursor& at,
                                               const EpochPlan* plan) const {
  std::vector<uint32_t> entries;
  if (budgeted()) {
    std::shared_ptr<const EpochPlan> own;
    if (!plan) plan = (own = PlanOf(at.epoch)).get();
    const RankPlan& rp = plan->ranks[rank];
    entries.assign(rp.entries.begin() + rp.starts[at.batch],
                   rp.entries.begin() + rp.starts[at.batch + 1]);
    return entries;
  }
  const uint64_t bs = static_cast<uint64_t>(in_->cfg.batch_size);
  const uint64_t consumers = static_cast<uint64_t>(in_->cfg.consumers);
  const EpochOrder order = OrderOf(at.epoch);
  for (int row = 0; row < RowsOf(at.epoch, at.batch); ++row)
    entries.push_back(order[(at.batch * bs + row) * consumers + rank]);
  return entries;
}

WhyNot StreamPlan::why_not_positional() const {
  const Catalog& cat = *in_->catalog;
  if (cat.mixture && !cat.mixture->switches().empty())
    return "the mixture's weights changed at a batch boundary";
  if (in_->cfg.packed_stage >= 0) return "a packed text stream's rows cross batches";
  if (budgeted() && cat.mixture && cat.mixture->per_lane() * cat.mixture->lanes() > UINT32_MAX)
    return "a token-budget mixture's epoch holds 4G draws or more (the rings carry a budgeted "
           "position in 32 bits)";
  return std::nullopt;
}

uint64_t StreamPlan::StepStart(const StreamCursor& c) const {
  if (c.batch == 0) return BaseOf(c.epoch);
  const std::shared_ptr<const EpochPlan> plan = PlanOf(c.epoch);
  return c.batch < plan->steps.size() ? plan->steps[c.batch] : 0;
}

const SourceConfig* StreamPlan::WindowedSource() const {
  for (size_t k = 0; k < in_->catalog->parts.size(); ++k)
    if (in_->catalog->windowed(k)) return &in_->cfg.sources[k];
  return nullptr;
}

Result<StreamOrigin> StreamPlan::Rebased(uint32_t epoch, uint64_t position, uint32_t lanes,
                                         uint32_t nodes) const {
  MMFEED_ASSIGN_OR_RETURN(const std::shared_ptr<const Mixture> numbering,
                          NumberingOf(position, lanes, nodes));
  StreamOrigin o;
  o.epoch = epoch;
  o.base = position;
  o.lanes = LanesOf(position, lanes);
  o.nodes = NodesOf(numbering.get(), nodes);
  // A position past the epoch's end belongs to no order of this data: never read as "the
  // epoch is done" (an edited cursor once skipped the rest of the job that way).
  if (const uint64_t end = PositionsOf(numbering.get(), o.lanes); position > end)
    return Status::Invalid(fmt::format(
        "its \"position\" {} is past the end of epoch {}'s order, which has positions 0 to {}: "
        "the cursor was edited, or is of other data",
        position, epoch, end));
  // Nothing a rank could have (no full row, or too few samples for a budgeted step): the next
  // epoch.
  const bool none_left =
      budgeted()
          ? position &&
                PlanFrom(epoch, /*with_ranks=*/false, position, numbering.get(), o.lanes).batches ==
                    0
          : BatchesOf(PerRankFrom(position, numbering.get(), o.lanes)) == 0;
  if (position == 0 || none_left) {
    o.epoch = position == 0 ? epoch : epoch + 1;
    o.base = 0;
    o.lanes = 0;
    o.nodes = 0;
  }
  // A mixture's tag names the lanes its base counts in (and their nodes where those count),
  // shard windows' when they are several.
  const std::string tagged = (numbering || o.lanes > 1 ? fmt::format("{}|", o.lanes) : "") +
                             (o.nodes ? fmt::format("{}|", o.nodes) : "");
  o.stream = o.base == 0
                 ? FirstStreamTag(in_->order_fingerprint)
                 : static_cast<uint32_t>(HashString(fmt::format(
                       "rebased|{}|{}|{}{}", o.epoch, o.base, tagged, in_->order_fingerprint))) |
                       1;
  return o;
}

nlohmann::json StreamPlan::PositionJson() const {
  if (!positional()) return nullptr;
  const PipelineConfig& cfg = in_->cfg;
  const Catalog& cat = *in_->catalog;
  nlohmann::json j = {{"order", in_->order_tag},
                      {"epoch", origin_.epoch},
                      {"base", origin_.base},
                      {"streams", streams()},
                      {"batch_size", cfg.batch_size}};
  if (cat.mixture || cat.InWindows(cfg.source)) {
    j["lanes"] = cat.mixture ? cat.mixture->lanes() : static_cast<uint32_t>(cfg.source.num_nodes);
    if (origin_.base) j["base_lanes"] = origin_.lanes;
  }
  if (cat.mixture && WindowedSource()) {  // its numbering counts nodes too
    j["nodes"] = cfg.source.num_nodes;
    if (origin_.base) j["base_nodes"] = origin_.nodes;
  }
  return j;
}

StreamCursor StreamPlan::CursorAt(uint64_t seq) const {
  StreamCursor c;
  c.seq = seq;
  if (!budgeted()) {
    uint64_t k = seq - origin_.seq;  // batches from the origin on
    const uint64_t first = EpochBatches(origin_.epoch);
    if (k < first) {
      c.epoch = origin_.epoch;
      c.batch = k;
      return c;
    }
    k -= first;
    c.epoch = origin_.epoch + 1 + static_cast<uint32_t>(k / in_->batches_per_epoch);
    c.batch = k % in_->batches_per_epoch;
    return c;
  }
  uint64_t first = origin_.seq;
  Locate(seq, &c.epoch, &first);
  c.batch = seq - first;
  return c;
}

// Epoch `epoch`'s plan (from the origin's base in the origin epoch).
EpochPlan StreamPlan::PlanAt(uint32_t epoch, bool with_ranks) const {
  const uint64_t base = BaseOf(epoch);
  return PlanFrom(epoch, with_ranks, base, base ? numbering_.get() : nullptr,
                  base ? origin_.lanes : 0);
}

// The plan of `epoch` from global position `base` of `lanes` lanes (a mixture's: `numbering`).
EpochPlan StreamPlan::PlanFrom(uint32_t epoch, bool with_ranks, uint64_t base,
                               const Mixture* numbering, uint32_t lanes) const {
  return PlanEpoch(in_->costs, in_->cfg.source, epoch, in_->cfg.consumers, in_->budget, with_ranks,
                   in_->catalog.get(), base, numbering, lanes);
}

std::shared_ptr<const EpochPlan> StreamPlan::PlanOf(uint32_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(memo_->mu);
    auto it = memo_->plans.find(epoch);
    if (it != memo_->plans.end()) return it->second;
  }
  // Made outside the lock (O(samples)): cursors are looked up meanwhile.
  auto plan = std::make_shared<const EpochPlan>(PlanAt(epoch, /*with_ranks=*/true));
  std::lock_guard<std::mutex> lock(memo_->mu);
  auto& plans = memo_->plans;
  memo_->epoch_batches[epoch] = plan->batches;
  // Ranks run apart by at most their rings' depth, and rewinds are rare: a few epochs do.
  if (plans.size() >= 4 && !plans.count(epoch))
    plans.erase(plans.begin()->first < epoch ? plans.begin() : std::prev(plans.end()));
  return plans.emplace(epoch, std::move(plan)).first->second;
}

uint64_t StreamPlan::EpochBatches(uint32_t epoch) const {
  if (!budgeted()) return BaseOf(epoch) ? BatchesOf(PerRank(epoch)) : in_->batches_per_epoch;
  std::lock_guard<std::mutex> lock(memo_->mu);
  return EpochBatchesLocked(epoch);
}

uint64_t StreamPlan::EpochBatchesLocked(uint32_t epoch) const {
  auto it = memo_->epoch_batches.find(epoch);  // PlanOf also records its plans' counts
  if (it != memo_->epoch_batches.end()) return it->second;
  const uint64_t k = PlanAt(epoch, /*with_ranks=*/false).batches;
  memo_->epoch_batches[epoch] = k;
  return k;
}

// The epoch holding batch `seq` (>= origin().seq) and its first batch's seq; false past
// kMaxEpochsAhead epochs.
bool StreamPlan::Locate(uint64_t seq, uint32_t* epoch, uint64_t* first) const {
  std::lock_guard<std::mutex> lock(memo_->mu);
  std::vector<uint64_t>& starts = memo_->epoch_starts;
  if (starts.empty()) starts.push_back(origin_.seq);
  while (seq >= starts.back()) {
    const size_t i = starts.size() - 1;  // the start of epoch origin + i is known
    if (i >= kMaxEpochsAhead) return false;
    starts.push_back(starts.back() + EpochBatchesLocked(origin_.epoch + static_cast<uint32_t>(i)));
  }
  auto it = std::upper_bound(starts.begin(), starts.end(), seq);
  if (it != starts.begin()) --it;
  *epoch = origin_.epoch + static_cast<uint32_t>(it - starts.begin());
  *first = *it;
  return true;
}

Status StreamPlan::Reachable(uint64_t seq) const {
  uint32_t epoch;
  uint64_t first;
  if (!budgeted() || seq < origin_.seq) return Status::Ok();
  // Refused at once, before any epoch is planned, when even the fewest batches an epoch can
  // have put it too far (a hostile cursor must not keep the control thread planning).
  if ((seq - origin_.seq) / in_->min_epoch_batches < kMaxEpochsAhead && Locate(seq, &epoch, &first))
    return Status::Ok();
  return Status::Invalid(fmt::format(
      "cursor seq {} is more than {} epochs past epoch {}: token-budget batches are numbered "
      "by planning each epoch, and so far ahead is refused",
      seq, kMaxEpochsAhead, origin_.epoch));
}

Status StreamPlan::CheckCursor(uint64_t seq) const {
  if (seq < origin_.seq)
    return Status::Invalid(fmt::format(
        "cursor seq {} is before batch {}, where a reload changed the order or the batch "
        "numbering at epoch {}: the earlier batches cannot be made again",
        seq, origin_.seq, origin_.epoch));
  const uint32_t epochs = static_cast<uint32_t>(in_->cfg.source.epochs);
  if (!budgeted()) {
    const uint64_t per_epoch = in_->batches_per_epoch;
    const uint64_t total = !epochs                  ? UINT64_MAX
                           : origin_.epoch < epochs ? origin_.seq + EpochBatches(origin_.epoch) +
                                                          (epochs - origin_.epoch - 1) * per_epoch
                                                    : origin_.seq;
    if (seq > total)
      return Status::Invalid(fmt::format(
          "cursor seq {} is past the end of the data ({} batches per rank)", seq, total));
    // An endless run: the epoch a seq falls in must be one a cursor can name (32 bits).
    if ((seq - origin_.seq) / per_epoch >= UINT32_MAX - origin_.epoch)
      return Status::Invalid(
          fmt::format("cursor seq {} is past the last epoch a cursor can name", seq));
    return Status::Ok();
  }
  // Token budgets: refused before any epoch is planned when too far (Reachable), then the
  // seq's epoch is found by planning the epochs up to it (at most kMaxEpochsAhead).
  MMFEED_RETURN_IF_ERROR(Reachable(seq));
  uint32_t epoch = 0;
  uint64_t first = 0;
  if (epochs && Locate(seq, &epoch, &first) &&
      (epoch > epochs || (epoch == epochs && seq != first)))
    return Status::Invalid(fmt::format("cursor seq {} is past the end of the data (epoch {} of {})",
                                       seq, epoch, epochs));
  return Status::Ok();
}

}  // namespace mmfeed
