// Mixture: many sources in one stream, as a pure function of (seed, epoch, lane, position), so
// that any cursor is reached without replaying anything.
//
// Quotas. Every epoch each source gets a fixed number of draws: weighted mode apportions
// `samples_per_epoch` by weight with largest remainders (the quotas sum to it exactly); epochs
// mode takes `repeat` x the source's size (a fractional repeat takes the next part of the
// source's order, so successive epochs cover all of it).
//
// Lanes. A lane is one consumer rank of one node (lanes = num_nodes x consumers). Each lane
// gets the same number of positions per epoch; a source's quota is split over the lanes so
// that lanes differ by at most one draw of it. What cannot be split evenly (fewer than `lanes`
// draws an epoch) is left out, as a single source leaves out its remainder.
//
// Interleave. Within a lane of `len` positions, source i with lane quota q_i has made
// floor((t * q_i + phase_i) / len) draws after step t (a Beatty sequence with a seeded phase):
// in any window each source's count is within about (sources x share + 1) of its expected
// count, and at the epoch's end it is exactly q_i. Position p is at the step t where the
// draws so far first exceed p, found by a binary search over the 2 x sources steps it can be
// (draws after step t lie within `sources` of t); the sources that step together are taken in
// source order.
//
// Samples. Source i's draws are numbered over all lanes and epochs: draw d is sample
// Permutation(size_i, seed of pass d / size_i)(d % size_i) (in order without shuffle), so a
// source that runs out starts its next pass in a fresh order and no sample repeats within a
// pass. Position lookup costs O(sources x log sources) and no memory per sample.
// A source read in shard windows (MixSource::windowed) numbers an epoch's draws node by node:
// node n's lanes take one contiguous run of them, and the run's draws go to its lanes in turn,
// so a node reads its own part of the source's shard order (as one windowed source does);
// its draw's `sample` is the position in the pass, which the caller maps through the pass's
// windows.
//
// Switches. A weights-only reload may apply at a batch boundary (Switched): positions before
// (epoch, position) of every lane are the earlier mixture's, the rest the new weights'
// interleave. Each source's draws after the switch are numbered on from above the highest any
// lane made of it before (in the rest of the switch's epoch lane by lane in turn, later epochs
// as above), so no draw repeats and no sample repeats within a pass; the numbers lanes with
// fewer draws than the others leave unused are samples that pass skips (a few per lane, source
// and switch).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace mmfeed {

struct MixSource {
  uint64_t size = 0;  // the source's samples (its catalog on this node)
  // weighted mode: a share in proportion to the others' (> 0); epochs mode: draws per epoch as
  // a multiple of `size` (> 0; 1 = each sample once).
  double weight = 0;
  double repeat = 0;
  bool shuffle = true;
  uint64_t seed = 0;      // of the source's own order
  bool windowed = false;  // read in shard windows: numbered node by node, `sample` = at
};

enum class MixMode { kWeighted, kEpochs };

// A weights-only reload applied at a batch boundary: `weights` (one per source) were in force
// up to position `position` of every lane in `epoch` (Mixture::Switched).
struct MixSwitch {
  uint32_t epoch = 0;
  uint64_t position = 0;
  std::vector<double> weights;
  bool operator==(const MixSwitch&) const = default;
};

struct MixDraw {
  uint32_t source = 0;
  uint64_t sample = 0;  // index in the source's catalog
  uint64_t draw = 0;    // the source's draw number over all lanes and epochs
};

class Mixture {
 public:
  // `samples_per_epoch` (weighted mode; 0 = the sum of the sizes) is over all lanes, of which
  // each node has `per_node` (0: one node). Refused: no source, an empty source, a weight or
  // repeat out of range, an epoch smaller than the lanes.
  static Result<Mixture> Create(std::vector<MixSource> sources, MixMode mode,
                                uint64_t samples_per_epoch, uint32_t lanes, uint64_t seed,
                                uint32_t per_node = 0);

  // `after`'s weights from `position` (a batch boundary: the same in every lane) of `epoch` on,
  // `before`'s before it. Refused unless both deal the same sources (sizes, orders) to the same
  // lanes with the same positions per lane, in weighted mode on one node, none of them in shard
  // windows; and at a position within the epoch, not before `before`'s last switch. `after`'s
  // own switches, if any, give way to `before`'s.
  static Result<Mixture> Switched(std::shared_ptr<const Mixture> before, Mixture after,
                                  uint32_t epoch, uint64_t position);
  // Whether `after` may take over from `before` at some batch boundary (Switched's checks but
  // the position's), else why not.
  static Status CanSwitch(const Mixture& before, const Mixture& after);
  // This mixture dealt to `lanes` lanes, `per_node` of them a node: a job resumed at another
  // shape deals the rest of an epoch in the numbering of the shape it stood at (EpochOrder).
  // `per_node` counts only for a source in shard windows (its draws go node by node), and must
  // be given (> 0) for one. Refused for a mixture that switched weights (its draws depend on
  // more than the shape), and as Create refuses.
  Result<Mixture> WithLanes(uint32_t lanes, uint32_t per_node = 0) const;

  uint32_t lanes() const { return lanes_; }
  size_t sources() const { return sources_.size(); }
  // Positions per lane and epoch.
  uint64_t per_lane() const { return per_lane_; }
  // Per source, its draws per epoch over all lanes (after the split: what is dealt).
  const std::vector<uint64_t>& dealt() const { return dealt_; }
  // Per source, lane `lane`'s draws per epoch.
  uint64_t LaneQuota(uint32_t source, uint32_t lane) const;

  // What position `p` of lane `lane` in `epoch` draws. REQUIRES: lane < lanes(),
  // p < per_lane().
  MixDraw At(uint32_t epoch, uint32_t lane, uint64_t p) const;
  // Lane `lane`'s draw `c` of `source` in `epoch` of this mixture's own interleave: its number
  // over all lanes and epochs (after a switch: see Switched), and the sample it takes.
  // REQUIRES: c < LaneQuota(source, lane); of a switched mixture, not an epoch before the
  // switch's, and in the switch's epoch not a draw before the switch.
  MixDraw DrawOf(uint32_t epoch, uint32_t lane, uint32_t source, uint64_t c) const;
  // What a failed sample's row of lane `lane` in `epoch` is refilled with: one of the lane's
  // draws of `source` that epoch, picked by `random`; none when the lane has none.
  std::optional<MixDraw> Refill(uint32_t epoch, uint32_t lane, uint32_t source,
                                uint64_t random) const;
  // Where the weights changed (Switched), oldest first.
  std::vector<MixSwitch> switches() const;

  // The plan, one line per source: size, share, draws per epoch, passes per epoch.
  std::string Describe(const std::vector<std::string>& names) const;

 private:
  struct Source {
    MixSource cfg;
    uint64_t quota = 0;   // draws per epoch over all lanes, before the split
    uint64_t base = 0;    // every lane's draws per epoch: base or base + 1
    uint64_t extras = 0;  // lanes with base + 1 (the first `extras` of its run, see ExtraOf)
    uint64_t start = 0;   // where its extras start in the epoch's sequence of extras
  };
  // Its extra draws dealt each epoch (those past used_extras_ are left out).
  uint64_t ExtrasDealt(const Source& s) const;
  // The slot of source i's extra draw in lane `lane`'s, or UINT64_MAX without one.
  uint64_t ExtraOf(const Source& s, uint32_t lane) const;
  // The lanes before `lane` that have an extra draw of `s`.
  uint64_t ExtrasBefore(const Source& s, uint32_t lane) const;
  // Where lane `lane`'s draw c of `s` is among the epoch's draws of `s` (REQUIRES:
  // c < LaneQuota).
  uint64_t InEpoch(const Source& s, uint32_t lane, uint64_t c) const;
  uint64_t Phase(uint32_t epoch, uint32_t lane, uint32_t source) const;
  // Lane `lane`'s draws of each source at positions [0, p) of `epoch` in its own interleave
  // (REQUIRES: p <= per_lane()), and the source position p draws (sources() at the end).
  uint32_t Counts(uint32_t epoch, uint32_t lane, uint64_t p, std::vector<uint64_t>* count) const;
  // The number of source i's first draw of `epoch` in this mixture's own numbering (the
  // switch's epoch: its first after the switch). REQUIRES: `epoch` is not before the switch's.
  uint64_t EpochFirst(uint32_t epoch, uint32_t i) const;
  // Lane `lane`'s draws of source i in `epoch` that are `before_`'s (those before the switch in
  // its epoch; 0 otherwise): its own draws there are counted from this one.
  uint64_t FirstOwn(uint32_t epoch, uint32_t lane, uint32_t i) const;
  // Above every draw of source i made before position p of `epoch` in any lane.
  uint64_t DrawsBefore(uint32_t epoch, uint64_t p, uint32_t i) const;
  bool Before(uint32_t epoch, uint64_t p) const {
    return before_ && (epoch < switch_epoch_ || (epoch == switch_epoch_ && p < switch_at_));
  }

  std::vector<Source> sources_;
  std::vector<uint64_t> dealt_;
  MixMode mode_ = MixMode::kWeighted;
  uint32_t lanes_ = 1, per_node_ = 1;
  uint64_t per_lane_ = 0;
  uint64_t used_extras_ = 0;  // extras dealt per epoch (a multiple of lanes_)
  uint64_t seed_ = 0;
  uint64_t samples_per_epoch_ = 0;  // as Create was given it
  // A switched mixture: `before_` up to position switch_at_ of epoch switch_epoch_. Per source,
  // the first number of its draws after the switch (tail_first_) and of the next epoch
  // (next_first_); per lane and source (lane x sources() + source), its draws before the
  // switch in this interleave (at_switch_).
  std::shared_ptr<const Mixture> before_;
  uint32_t switch_epoch_ = 0;
  uint64_t switch_at_ = 0;
  std::vector<uint64_t> tail_first_, next_first_, at_switch_;
};

}  // namespace mmfeed
