// Catalog: every sample a source offers. A JSONL manifest's lines are either all parsed at
// start (source.index: off, and auto below kIndexAutoBytes) or, with its ManifestIndex, only
// located at start and parsed when dealt (8 bytes per sample instead of the parsed fields);
// WebDataset tar shards' members are found by reading only their 512-byte headers.
// Parsed at start, samples that cannot be used (malformed line, missing field, tar cut in the
// middle) are not in the catalog; they are listed in `errors` with their origin and reason.
// Parsed when dealt, such a line is a failed sample (Read's status), counted like a corrupt
// file. Built on the supervisor thread; read-only afterwards and safe to share between threads.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "shm/ring_format.h"
#include "source/manifest_index.h"
#include "source/mixture.h"
#include "source/parquet/dataset.h"
#include "source/permutation.h"
#include "source/remote_store.h"
#include "source/sample.h"
#include "source/shard_index.h"
#include "source/source_config.h"

namespace mmfeed {

// A sample id is at most shm::kMaxIdBytes bytes (ring slots reserve that much per sample).

struct CatalogEntry {
  std::string id;
  std::string origin;  // "manifest.jsonl:12" or "shard-00003.tar:sample0042"
  std::vector<std::pair<std::string, FieldValue>> fields;
};

// A Parquet source's field: the column it reads (`column`: "image", or a path into a struct such
// as "image.bytes"), as the dataset's top-level column `top` and the keys `inside` it.
struct ParquetField {
  std::string name, column;
  size_t top = 0;
  std::vector<std::string> inside;
  bool path = false;  // a field of files: a string value is a path
};

struct LoadError {
  std::string origin;
  std::string reason;
};

// source.index: auto indexes manifests from this size on (about 650 k lines of 100 bytes,
// whose parsed fields would take ~200 MB at the ~300 bytes per sample bench/catalog_bench.py
// measures).
constexpr uint64_t kIndexAutoBytes = 64ull << 20;

// Samples of each source of a mixture looked at for the fields they lack (LoadMixture).
constexpr uint64_t kFieldLookups = 4096;

// Window mode (source.shuffle_window > 0, tar shards or Parquet row groups: the units): one
// epoch's units in reading order.
struct ShardWindows {
  std::vector<uint32_t> shards;  // unit indexes (Catalog::unit) in reading order
  std::vector<uint64_t> starts;  // starts[t]: the samples of shards[0..t); starts.back() = size
  uint32_t window = 1;           // shards per window
};

// A mixture's remote sources: each shard's URL read through its own source's store.
class RemoteRouter : public RemoteReader {
 public:
  void Add(const std::string& url, RemoteStore* store) { by_url_[url] = store; }
  Result<FieldFile> OpenRange(const std::string& url, uint64_t offset, uint64_t size,
                              const std::string& member) override;

 private:
  std::map<std::string, RemoteStore*> by_url_;
};

struct Catalog {
  std::vector<CatalogEntry> entries;  // parsed at start
  std::vector<LoadError> errors;
  // Or an indexed manifest, whose lines Read parses,
  std::shared_ptr<const ManifestIndex> index;
  std::string manifest_path, manifest_dir, manifest_name;
  std::set<std::string> needed, path_fields;
  // or indexed tar shards, whose records Read looks up.
  std::shared_ptr<const ShardIndex> shards;
  std::map<std::string, std::string> ext_to_field;
  // Or Parquet files (source/parquet/dataset.h), whose rows Read decodes: the fields' columns
  // and the column giving ids (Dataset::Options::columns indexes).
  std::shared_ptr<const parquet::Dataset> parquet;
  std::vector<ParquetField> parquet_fields;
  size_t parquet_id = 0;
  // Remote shards (http://, https://, s3://) are read through this store.
  std::shared_ptr<RemoteStore> remote;
  // A manifest's keys of fields not read from their own name (SourceConfig::keys).
  std::map<std::string, std::string> keys;
  // A mixture's source: a sample may lack some needed fields (SourceConfig::fields_optional).
  bool fields_optional = false;
  // Or a mixture (LoadMixture): the sources' catalogs one after another (source k's samples
  // from part_first[k]), read through Read, dealt by `mixture` (EpochOrder).
  std::vector<std::shared_ptr<const Catalog>> parts;
  std::vector<uint64_t> part_first;
  // Per part, its source's config; a part read in shard windows (windowed(k)) deals each pass
  // of it in the window order WindowsOf(its config, pass) makes.
  std::vector<SourceConfig> part_sources;
  // Its remote parts' shards, read through their own stores.
  std::shared_ptr<RemoteRouter> router;
  std::shared_ptr<const Mixture> mixture;
  uint64_t mix_fingerprint = 0;
  // Per part, the fields its samples lack, in words ("video_qa lacks 'image' in 100% of 40
  // samples looked at"), or "" when it lacks none.
  std::vector<std::string> part_lacks;

  // A mixture: the part (source) holding entry i. REQUIRES: !parts.empty(), i < size().
  size_t PartOf(size_t i) const {
    return std::upper_bound(part_first.begin(), part_first.end(), i) - part_first.begin() - 1;
  }
  bool indexed() const { return index || shards || parquet || !parts.empty(); }
  // A mixture's part k read in shard windows (a source with shuffle_window over indexed tar
  // shards). REQUIRES: k < parts.size().
  bool windowed(size_t k) const { return parts[k]->InWindows(part_sources[k]); }
  // Whether `source` (this catalog's config) deals its samples in windows: indexed tar shards,
  // or Parquet files' row groups, with a shuffle_window.
  bool InWindows(const SourceConfig& source) const {
    return (shards || parquet) && source.shuffle_window > 0;
  }
  // Window mode's units: the shards, or the row groups; unit k holds catalog positions
  // [unit_first(k), unit_first(k) + unit_size(k)). REQUIRES: shards || parquet.
  size_t unit_count() const { return shards ? shards->shard_count() : parquet->group_count(); }
  uint64_t unit_first(size_t k) const {
    return shards ? shards->shard(k).first : parquet->group(k).first;
  }
  uint64_t unit_size(size_t k) const {
    return shards ? shards->shard(k).count : parquet->group(k).count;
  }
  // Where the pipeline's workers read remote shards' members (none: no remote source).
  RemoteReader* remote_reader() const {
    return router ? static_cast<RemoteReader*>(router.get()) : remote.get();
  }
  size_t size() const {
    return !parts.empty() ? part_first.back() + parts.back()->size()
           : index        ? index->size()
           : shards       ? shards->size()
           : parquet      ? parquet->size()
                          : entries.size();
  }
  // Names the indexed source's contents (a mixture's: every source's, and the shares).
  // REQUIRES: indexed().
  uint64_t index_fingerprint() const {
    return !parts.empty() ? mix_fingerprint
           : index        ? index->fingerprint()
           : parquet      ? parquet->fingerprint()
                          : shards->fingerprint();
  }
  // An indexed source's entry i, read and parsed (REQUIRES: indexed(), i < size()). On failure
  // `*e` still has the sample's id and origin ("manifest.jsonl:12", "shard-00003.tar:key").
  Status Read(size_t i, CatalogEntry* e) const;
  // Window mode's shard order of `epoch` (made once per epoch, the last few kept). REQUIRES:
  // shards.
  std::shared_ptr<const ShardWindows> WindowsOf(const SourceConfig& source, uint32_t epoch) const;
  // A mixture's windowed source (this its part, `source` its config), whose draw d is position
  // d % size() of pass d / size()'s window order: the shards of the windows holding draws
  // `from` through `to`, then of up to `ahead` more windows that start at or before draw
  // `limit`, at most `most` windows in all, in reading order. REQUIRES: shards.
  std::vector<uint32_t> PassShards(const SourceConfig& source, uint64_t from, uint64_t to,
                                   uint64_t limit, int ahead, int most) const;

 private:
  Status ReadParquet(size_t i, CatalogEntry* e) const;  // source/parquet_catalog.cc
  struct WindowCache {
    std::mutex mu;
    // By epoch, seed, shuffle and window (tests ask one catalog for several orders).
    std::map<std::tuple<uint32_t, uint64_t, bool, int>, std::shared_ptr<const ShardWindows>> epochs;
  };
  std::shared_ptr<WindowCache> window_cache_ = std::make_shared<WindowCache>();
};

// `needed`: the fields the pipeline's stages read; `path_fields`: those whose plain-string
// manifest values name files.
Result<Catalog> LoadManifest(const std::string& path, const std::set<std::string>& needed,
                             const std::set<std::string>& path_fields,
                             const std::map<std::string, std::string>& keys = {},
                             bool fields_optional = false);
Result<Catalog> LoadWebDataset(const SourceConfig& source, const std::set<std::string>& needed);
// `type: parquet`: the files its path names (source/parquet_catalog.cc): a Hugging Face dataset
// folder's files of source.split, or a path with brace lists and globs (each must match).
Result<std::vector<std::string>> ParquetFiles(const SourceConfig& source);
// Parquet files' rows: each needed field read from its column (source.keys maps a field to
// another column or a path inside one); refused, naming the file: a field's column missing
// (unless fields_optional), or of a type a field of files cannot take.
Result<Catalog> LoadParquet(const SourceConfig& source, const std::set<std::string>& needed,
                            const std::set<std::string>& path_fields);
Result<Catalog> LoadCatalog(const SourceConfig& source, const std::set<std::string>& needed,
                            const std::set<std::string>& path_fields);
// `sources:` (local manifests and shards), dealt to `consumers` ranks on each of
// order.num_nodes nodes by a Mixture seeded with order.seed. A source's sample may lack some of
// `needed` (SourceConfig::fields_optional). Refused, named: a source without a usable sample
// (its bad entries are in `errors`), a needed field none of the kFieldLookups samples looked
// at per source has. mix.switches are applied when they fit (Mixture::Switched), else dropped;
// the fingerprint names those applied (HashMixSwitch).
Result<Catalog> LoadMixture(const std::vector<SourceConfig>& sources, const MixConfig& mix,
                            const SourceConfig& order, int consumers,
                            const std::set<std::string>& needed,
                            const std::set<std::string>& path_fields);

// A mixture's fingerprint `h` with one more weight switch folded in.
uint64_t HashMixSwitch(const MixSwitch& s, uint64_t h);

// The catalog positions this node deals in `epoch`, in dealing order: position i goes to
// consumer rank i % consumers. A deterministic function of (seed, epoch, node_rank, num_nodes);
// every node gets the same count and every rank the same count (the remainder is left out).
// Each position is computed when asked for, so an epoch costs no memory per sample and any
// position is reached in O(log shards) at most.
// - Permutation mode (the default): the shuffle is a Permutation of the whole catalog (seeded
//   by seed and epoch), of which node k takes positions k, k + num_nodes, ...
// - Window mode (source.shuffle_window W > 0 over tar shards): the epoch's sequence takes the
//   shards in a seeded order (ShardWindows) and permutes the samples within each run of W
//   shards; node k takes the k-th of num_nodes contiguous parts of that sequence, so a node
//   reads each shard of its part whole (shards at the parts' edges are read by two nodes) and
//   holds W shards at a time. docs/design/remote.md compares it with a full permutation. The
//   epoch's global order interleaves the nodes' parts (its lanes): position g is part g % lanes'
//   position g / lanes. From a `base`, the rest of that order in the lanes of the shape it was
//   taken at is dealt round-robin over this shape's nodes (a node then reads from every part
//   its positions fall in).
// - Mixture mode (a catalog of LoadMixture): position i is rank i % consumers' position
//   i / consumers in lane (node_rank x consumers + rank) of the catalog's Mixture; the entry
//   is the drawn source's part_first plus the drawn sample (a windowed part's: the drawn
//   position of its pass's window order). The epoch's global order interleaves the lanes:
//   position g is lane g % lanes' position g / lanes. From a `base` (a job resumed at another
//   shape), the rest of that global order in the lanes of the shape it was taken at (the
//   `numbering` mixture) is dealt round-robin over this shape's lanes, as permutation mode
//   deals its order.
class EpochOrder {
 public:
  // Permutation mode. `base`: the order starts at that position of the epoch's global order (a
  // job resumed at another shape mid-epoch; StreamOrigin::base).
  EpochOrder(size_t catalog_size, const SourceConfig& source, uint32_t epoch, int consumers,
             uint64_t base = 0);
  // Window mode when source.shuffle_window > 0 and the catalog is of tar shards (from a `base`,
  // `lanes` is the nodes of the shape the base counts in, 0: this one's); mixture mode for a
  // mixture's catalog (from a `base`, `numbering` is the catalog's Mixture dealt to the lanes
  // the base counts in; REQUIRES: it outlives this order).
  EpochOrder(const Catalog& catalog, const SourceConfig& source, uint32_t epoch, int consumers,
             uint64_t base = 0, const Mixture* numbering = nullptr, uint32_t lanes = 0);
  size_t size() const { return size_; }
  // REQUIRES: i < size().
  uint32_t operator[](size_t i) const {
    if (mix_) return Mixed(i);
    if (windows_) return Windowed(i);
    const uint64_t at = Global(i);
    return static_cast<uint32_t>(shuffle_ ? perm_(at) : at);
  }
  // Where position i stands in the epoch's global order, counted from the base: the nodes'
  // positions interleaved (i x nodes + node), or a mixture's lanes (node x consumers + rank in
  // each run of nodes x consumers). REQUIRES: i < size().
  uint64_t GlobalOf(size_t i) const {
    if (!mix_) return static_cast<uint64_t>(i) * nodes_ + node_;
    return i / consumers_ * nodes_ * consumers_ + node_ * consumers_ + i % consumers_;
  }
  // Permutation mode: the position at which this node deals catalog entry `entry`, or kNowhere
  // when another node deals it or it is left out (the remainder). O(1) (Permutation::Inverse).
  // Window and mixture modes are not invertible() so (their inverse is the order walked once).
  static constexpr uint64_t kNowhere = UINT64_MAX;
  bool invertible() const { return !mix_ && !windows_; }
  uint64_t PositionOf(uint32_t entry) const;  // REQUIRES: invertible()
  // Window mode: the shards (ShardIndex::shard indexes) of the window holding position i and
  // of up to `more` windows after it in this node's part, in reading order.
  bool windowed() const { return windows_ != nullptr; }
  std::vector<uint32_t> WindowShards(size_t i, int more) const;
  // Window mode: the index of the window holding position i in the epoch's sequence.
  size_t WindowOf(size_t i) const;
  // Mixture mode: a draw of rank `rank`'s share of the epoch from the source of catalog entry
  // `entry` (`random` picks which), to refill a row whose sample failed from the same source.
  bool mixed() const { return mix_ != nullptr; }
  uint32_t SameSource(uint32_t entry, int rank, uint64_t random) const;

 private:
  uint32_t Windowed(size_t i) const { return SequenceAt(Global(i)); }
  // Position i in the epoch's global order, the base included; window mode: a global position's
  // place in the window sequence (part g % lanes_, its position g / lanes_).
  uint64_t Global(size_t i) const { return base_ + GlobalOf(i); }
  uint64_t Sequence(uint64_t g) const { return g % lanes_ * lane_size_ + g / lanes_; }
  uint32_t SequenceAt(uint64_t g) const;
  uint32_t Mixed(size_t i) const;
  uint32_t EntryOf(const MixDraw& d) const;  // mixture mode: the catalog entry a draw is

  size_t size_;
  uint64_t nodes_, node_, base_;
  bool shuffle_;
  Permutation perm_;
  std::shared_ptr<const ShardWindows> windows_;
  const Catalog* units_ = nullptr;      // window mode: the catalog whose units the windows hold
  uint64_t lanes_ = 1, lane_size_ = 0;  // window mode: the parts the global order interleaves
  uint64_t window_seed_ = 0;
  // Mixture mode: position i is rank i % consumers' position i / consumers, a lane of the
  // mixture (node x consumers + rank); from a base, in numbering_'s lanes.
  const Mixture* mix_ = nullptr;
  const Mixture* numbering_ = nullptr;
  const Catalog* mixed_ = nullptr;  // the mixture's catalog (parts, part_first)
  uint32_t epoch_ = 0;
  uint64_t consumers_ = 1;
};

}  // namespace mmfeed
