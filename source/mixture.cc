#include "source/mixture.h"

#include <fmt/format.h>

#include <cmath>

#include "base/rng.h"
#include "source/permutation.h"

namespace mmfeed {
namespace {

using u128 = unsigned __int128;

// Weights and repeats are read as fixed point with six decimals, so that the quotas are exact
// integer arithmetic, the same on every machine.
constexpr double kUnits = 1e6;

// `x` as a count of 1e-6 units, or 0 when out of (0, max].
uint64_t FixedPoint(double x, double max) {
  if (!std::isfinite(x) || x <= 0 || x > max) return 0;
  return static_cast<uint64_t>(std::llround(x * kUnits));
}

// Draws source `q` (quota) of a lane of `len` positions has made after step t.
uint64_t DrawsAfter(uint64_t t, uint64_t q, uint64_t phase, uint64_t len) {
  return static_cast<uint64_t>((static_cast<u128>(t) * q + phase) / len);
}

}  // namespace

Result<Mixture> Mixture::Create(std::vector<MixSource> sources, MixMode mode,
                                uint64_t samples_per_epoch, uint32_t lanes, uint64_t seed,
                                uint32_t per_node) {
  if (sources.empty()) return Status::Invalid("a mixture needs at least one source");
  if (lanes == 0) return Status::Invalid("a mixture needs at least one lane");
  if (per_node == 0) per_node = lanes;
  if (lanes % per_node != 0)
    return Status::Invalid(fmt::format("{} lanes are not nodes of {}", lanes, per_node));
  Mixture m;
  m.mode_ = mode;
  m.lanes_ = lanes;
  m.per_node_ = per_node;
  m.seed_ = seed;
  m.samples_per_epoch_ = samples_per_epoch;
  uint64_t total_size = 0, units_sum = 0;
  std::vector<uint64_t> units;
  for (size_t i = 0; i < sources.size(); ++i) {
    const MixSource& s = sources[i];
    if (s.size == 0) return Status::Invalid(fmt::format("source {} has no samples", i));
    total_size += s.size;
    const bool weighted = mode == MixMode::kWeighted;
    const uint64_t u = weighted ? FixedPoint(s.weight, 1e12) : FixedPoint(s.repeat, 1e6);
    if (u == 0)
      return Status::Invalid(
          fmt::format("source {}: {} {} is out of range ({} 0.000001 to {})", i,
                      weighted ? "weight" : "repeat", weighted ? s.weight : s.repeat,
                      weighted ? "a share from" : "from", weighted ? "1e12" : "1e6"));
    units.push_back(u);
    units_sum += u;
    m.sources_.push_back(Source{s});
  }
  if (mode == MixMode::kWeighted) {
    // Largest remainders: each source's floor, then one more for the largest fractions (the
    // first source on a tie) until the quotas sum to the epoch.
    const uint64_t epoch = samples_per_epoch ? samples_per_epoch : total_size;
    uint64_t given = 0;
    std::vector<uint64_t> rem(units.size());
    for (size_t i = 0; i < units.size(); ++i) {
      const u128 num = static_cast<u128>(epoch) * units[i];
      m.sources_[i].quota = static_cast<uint64_t>(num / units_sum);
      rem[i] = static_cast<uint64_t>(num % units_sum);
      given += m.sources_[i].quota;
    }
    for (uint64_t left = epoch - given; left > 0; --left) {
      size_t best = 0;
      for (size_t i = 1; i < rem.size(); ++i)
        if (rem[i] > rem[best]) best = i;
      ++m.sources_[best].quota;
      rem[best] = 0;
    }
  } else {
    for (size_t i = 0; i < units.size(); ++i)
      m.sources_[i].quota = static_cast<uint64_t>(static_cast<u128>(sources[i].size) * units[i] /
                                                  static_cast<uint64_t>(kUnits));
  }
  uint64_t total = 0, extras = 0;
  for (size_t i = 0; i < m.sources_.size(); ++i) {
    Source& s = m.sources_[i];
    if (s.quota == 0)
      return Status::Invalid(
          fmt::format("source {} would never be drawn: its {} gives it no sample of an epoch of {} "
                      "(raise it{})",
                      i, mode == MixMode::kWeighted ? "weight" : "repeat", total + s.quota,
                      mode == MixMode::kWeighted ? ", or samples_per_epoch" : ""));
    total += s.quota;
    s.base = s.quota / lanes;
    s.extras = s.quota % lanes;
    s.start = extras;
    extras += s.extras;
  }
  m.per_lane_ = total / lanes;
  if (m.per_lane_ == 0)
    return Status::Invalid(
        fmt::format("an epoch of {} samples is fewer than the {} consumer rank(s) it is dealt to",
                    total, lanes));
  m.used_extras_ = extras / lanes * lanes;
  for (const Source& s : m.sources_) m.dealt_.push_back(s.base * lanes + m.ExtrasDealt(s));
  return m;
}

uint64_t Mixture::ExtrasDealt(const Source& s) const {
  return used_extras_ > s.start ? std::min(s.extras, used_extras_ - s.start) : 0;
}

uint64_t Mixture::ExtraOf(const Source& s, uint32_t lane) const {
  const uint64_t o = (lane + lanes_ - s.start % lanes_) % lanes_;
  return o < ExtrasDealt(s) ? o : UINT64_MAX;
}

uint64_t Mixture::ExtrasBefore(const Source& s, uint32_t lane) const {
  // The lanes with an extra are a run of ExtrasDealt from lane start % lanes, wrapping around.
  const uint64_t from = s.start % lanes_, x = lane, n = ExtrasDealt(s);
  auto below = [x](uint64_t a, uint64_t b) { return b > a ? std::min(b, x) - std::min(a, x) : 0; };
  return from + n <= lanes_ ? below(from, from + n)
                            : below(from, lanes_) + below(0, from + n - lanes_);
}

uint64_t Mixture::InEpoch(const Source& s, uint32_t lane, uint64_t c) const {
  if (!s.cfg.windowed) return c < s.base ? c * lanes_ + lane : s.base * lanes_ + ExtraOf(s, lane);
  // Node by node: the node's run starts after the earlier nodes' lanes' draws; within it the
  // base draws go to its lanes in turn, then its extras.
  const uint32_t first = lane / per_node_ * per_node_, rank = lane - first;
  const uint64_t run = first * s.base + ExtrasBefore(s, first);
  return run + (c < s.base ? c * per_node_ + rank
                           : s.base * per_node_ + ExtrasBefore(s, lane) - ExtrasBefore(s, first));
}

uint64_t Mixture::LaneQuota(uint32_t source, uint32_t lane) const {
  const Source& s = sources_[source];
  return s.base + (ExtraOf(s, lane) != UINT64_MAX ? 1 : 0);
}

uint64_t Mixture::Phase(uint32_t epoch, uint32_t lane, uint32_t source) const {
  Rng rng(seed_ ^ 0x6d69782070686173ull ^ (uint64_t{epoch} * 0x9e3779b97f4a7c15ull) ^
          (uint64_t{lane} * 0xc2b2ae3d27d4eb4full) ^ (uint64_t{source} * 0x165667b19e3779f9ull));
  return rng.Next() % per_lane_;
}

uint32_t Mixture::Counts(uint32_t epoch, uint32_t lane, uint64_t p,
                         std::vector<uint64_t>* count) const {
  const uint64_t len = per_lane_;
  const uint32_t k = static_cast<uint32_t>(sources_.size());
  count->assign(k, 0);
  if (p >= len) {
    for (uint32_t i = 0; i < k; ++i) (*count)[i] = LaneQuota(i, lane);
    return k;
  }
  // Per source: the lane's quota and phase (a few dozen sources at most: on the stack would
  // do, a vector keeps it simple).
  std::vector<uint64_t> q(k), phase(k);
  for (uint32_t i = 0; i < k; ++i) {
    q[i] = LaneQuota(i, lane);
    phase[i] = Phase(epoch, lane, i);
  }
  auto draws = [&](uint64_t t) {
    uint64_t c = 0;
    for (uint32_t i = 0; i < k; ++i) c += DrawsAfter(t, q[i], phase[i], len);
    return c;
  };
  // The last step t with draws(t) <= p: t - k < draws(t) < t + k bounds it to [p - k, p + k).
  uint64_t lo = p >= k ? p - k : 0, hi = std::min(len - 1, p + k - 1);
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (draws(mid) <= p)
      lo = mid;
    else
      hi = mid - 1;
  }
  const uint64_t t = lo;
  uint64_t skip = p - draws(t);
  uint32_t at = k;
  for (uint32_t i = 0; i < k; ++i) {
    (*count)[i] = DrawsAfter(t, q[i], phase[i], len);
    if (at == k && DrawsAfter(t + 1, q[i], phase[i], len) != (*count)[i] && skip-- == 0) at = i;
  }
  // The sources that step together at t + 1 are taken in source order: those before `at`
  // were drawn before p.
  for (uint32_t i = 0; i < at; ++i)
    if (DrawsAfter(t + 1, q[i], phase[i], len) != (*count)[i]) ++(*count)[i];
  return at;
}

MixDraw Mixture::At(uint32_t epoch, uint32_t lane, uint64_t p) const {
  if (Before(epoch, p)) return before_->At(epoch, lane, p);
  std::vector<uint64_t> count;
  const uint32_t i = Counts(epoch, lane, p, &count);
  return DrawOf(epoch, lane, i, count[i]);
}

uint64_t Mixture::EpochFirst(uint32_t epoch, uint32_t i) const {
  if (!before_) return uint64_t{epoch} * dealt_[i];
  return epoch == switch_epoch_ ? tail_first_[i]
                                : next_first_[i] + uint64_t{epoch - switch_epoch_ - 1} * dealt_[i];
}

uint64_t Mixture::FirstOwn(uint32_t epoch, uint32_t lane, uint32_t i) const {
  return before_ && epoch == switch_epoch_ ? at_switch_[uint64_t{lane} * sources_.size() + i] : 0;
}

MixDraw Mixture::DrawOf(uint32_t epoch, uint32_t lane, uint32_t i, uint64_t c) const {
  const Source& s = sources_[i];
  MixDraw d;
  d.source = i;
  // The lane's draw c of the source, numbered over the lanes, then over the epochs; after a
  // switch, on from the draws before it (lane by lane in the rest of the switch's epoch).
  d.draw = before_ && epoch == switch_epoch_
               ? EpochFirst(epoch, i) + (c - FirstOwn(epoch, lane, i)) * lanes_ + lane
               : EpochFirst(epoch, i) + InEpoch(s, lane, c);
  const uint64_t pass = d.draw / s.cfg.size, at = d.draw % s.cfg.size;
  d.sample = s.cfg.shuffle && !s.cfg.windowed
                 ? Permutation(s.cfg.size, Rng(s.cfg.seed, pass, "", "mix pass").Next())(at)
                 : at;
  return d;
}

std::optional<MixDraw> Mixture::Refill(uint32_t epoch, uint32_t lane, uint32_t source,
                                       uint64_t random) const {
  if (before_ && epoch < switch_epoch_) return before_->Refill(epoch, lane, source, random);
  // In the switch's epoch, one of the draws after it (or, without one, before it).
  const uint64_t from = FirstOwn(epoch, lane, source), to = LaneQuota(source, lane);
  if (to > from) return DrawOf(epoch, lane, source, from + random % (to - from));
  if (before_ && epoch == switch_epoch_) return before_->Refill(epoch, lane, source, random);
  return std::nullopt;
}

uint64_t Mixture::DrawsBefore(uint32_t epoch, uint64_t p, uint32_t i) const {
  if (Before(epoch, p) || (before_ && epoch == switch_epoch_ && p == switch_at_))
    return before_->DrawsBefore(epoch, p, i);
  // Every earlier epoch's draws are below the first of this one; of this one, those each lane
  // made before p.
  uint64_t above = EpochFirst(epoch, i);
  std::vector<uint64_t> count;
  for (uint32_t lane = 0; lane < lanes_; ++lane) {
    Counts(epoch, lane, p, &count);
    if (count[i] > FirstOwn(epoch, lane, i))
      above = std::max(above, DrawOf(epoch, lane, i, count[i] - 1).draw + 1);
  }
  return above;
}

Status Mixture::CanSwitch(const Mixture& b, const Mixture& after) {
  if (b.mode_ != MixMode::kWeighted || after.mode_ != MixMode::kWeighted)
    return Status::Unsupported("only weights change at a batch boundary (mode: weighted)");
  if (b.lanes_ != after.lanes_ || b.per_node_ != b.lanes_ || after.per_node_ != after.lanes_)
    return Status::Unsupported("weights change at a batch boundary on one node only");
  if (b.per_lane_ != after.per_lane_ || b.sources_.size() != after.sources_.size())
    return Status::Unsupported(
        "only weights change at a batch boundary: the epoch's length or the sources differ");
  for (size_t i = 0; i < b.sources_.size(); ++i) {
    const MixSource &x = b.sources_[i].cfg, &y = after.sources_[i].cfg;
    if (x.size != y.size || x.shuffle != y.shuffle || x.seed != y.seed)
      return Status::Unsupported(fmt::format(
          "only weights change at a batch boundary: source {}'s samples or order differ", i));
    if (x.windowed || y.windowed)
      return Status::Unsupported(
          fmt::format("source {} is read in shard windows: its weight changes at an epoch "
                      "boundary",
                      i));
  }
  if (b.seed_ != after.seed_)
    return Status::Unsupported("only weights change at a batch boundary: the seed differs");
  return Status::Ok();
}

Result<Mixture> Mixture::WithLanes(uint32_t lanes, uint32_t per_node) const {
  if (before_) return Status::Unsupported("its weights changed at a batch boundary");
  std::vector<MixSource> sources;
  for (size_t i = 0; i < sources_.size(); ++i) {
    if (sources_[i].cfg.windowed && per_node == 0)
      return Status::Invalid(fmt::format(
          "source {} is read in shard windows, node by node, and the nodes are not named", i));
    sources.push_back(sources_[i].cfg);
  }
  return Create(std::move(sources), mode_, samples_per_epoch_, lanes, seed_, per_node);
}

Result<Mixture> Mixture::Switched(std::shared_ptr<const Mixture> before, Mixture after,
                                  uint32_t epoch, uint64_t position) {
  const Mixture& b = *before;
  MMFEED_RETURN_IF_ERROR(CanSwitch(b, after));
  if (position >= b.per_lane_ ||
      (b.before_ &&
       (epoch < b.switch_epoch_ || (epoch == b.switch_epoch_ && position < b.switch_at_))))
    return Status::Invalid(fmt::format("no switch at position {} of epoch {}", position, epoch));
  Mixture m = std::move(after);
  const size_t k = m.sources_.size();
  m.switch_epoch_ = epoch;
  m.switch_at_ = position;
  m.at_switch_.assign(m.lanes_ * k, 0);
  m.tail_first_.assign(k, 0);
  m.next_first_.assign(k, 0);
  std::vector<uint64_t> count, most(k, 0);
  for (uint32_t lane = 0; lane < m.lanes_; ++lane) {
    m.Counts(epoch, lane, position, &count);
    for (size_t i = 0; i < k; ++i) {
      m.at_switch_[lane * k + i] = count[i];
      most[i] = std::max(most[i], m.LaneQuota(static_cast<uint32_t>(i), lane) - count[i]);
    }
  }
  for (size_t i = 0; i < k; ++i) {
    m.tail_first_[i] = b.DrawsBefore(epoch, position, static_cast<uint32_t>(i));
    m.next_first_[i] = m.tail_first_[i] + most[i] * m.lanes_;
  }
  m.before_ = std::move(before);
  return m;
}

std::vector<MixSwitch> Mixture::switches() const {
  if (!before_) return {};
  std::vector<MixSwitch> out = before_->switches();
  MixSwitch s{switch_epoch_, switch_at_, {}};
  for (const Source& x : before_->sources_) s.weights.push_back(x.cfg.weight);
  out.push_back(std::move(s));
  return out;
}

std::string Mixture::Describe(const std::vector<std::string>& names) const {
  std::string out;
  uint64_t total = 0;
  for (uint64_t x : dealt_) total += x;
  for (size_t i = 0; i < sources_.size(); ++i) {
    const Source& s = sources_[i];
    out += fmt::format(
        "  {}: {} samples, {:.2f}% of the stream, {} draws an epoch ({:.3g} passes)\n",
        i < names.size() ? names[i] : fmt::format("source {}", i), s.cfg.size,
        100.0 * dealt_[i] / total, dealt_[i], static_cast<double>(dealt_[i]) / s.cfg.size);
  }
  out += fmt::format("  an epoch: {} positions per rank x {} rank(s)", per_lane_, lanes_);
  for (const MixSwitch& w : switches())
    out += fmt::format("\n  weights before position {} of epoch {}: {}", w.position, w.epoch,
                       fmt::join(w.weights, ":"));
  return out;
}

}  // namespace mmfeed
