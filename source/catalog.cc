#include "source/catalog.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "base/rng.h"
#include "source/brace.h"

namespace mmfeed {
namespace {

// A manifest line's entry before it is parsed: its origin, and the id it has when the line
// gives none.
CatalogEntry LineEntry(const std::string& path, const std::string& name, uint64_t line_no) {
  CatalogEntry e;
  e.id = fmt::format("{}:{}", name, line_no);
  e.origin = fmt::format("{}:{}", path, line_no);
  return e;
}

// Why an entry with none of the `needed` fields (`optional`: a mixture's source) is unusable.
std::string NoNeededField(const std::set<std::string>& needed) {
  return fmt::format("has none of the fields the stages read ({})", fmt::join(needed, ", "));
}

// Parses one manifest line into `entry` (made by LineEntry); returns the reason on failure.
// `keys`: the manifest key of a field whose key is not its name (source.fields). `optional`: a
// missing field is left out (SourceConfig::fields_optional).
std::string ParseManifestLine(const std::string& line, const std::string& dir,
                              const std::set<std::string>& needed,
                              const std::set<std::string>& path_fields,
                              const std::map<std::string, std::string>& keys, bool optional,
                              CatalogEntry* entry) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "malformed JSON (or invalid UTF-8)";
  if (!j.is_object()) return "a manifest line must be a JSON object";
  if (j.contains("id")) {
    const auto& id = j["id"];
    if (id.is_string())
      entry->id = id.get<std::string>();
    else if (id.is_number_integer())
      entry->id = std::to_string(id.get<int64_t>());
    else
      return "'id' must be a string or an integer";
    if (entry->id.empty()) return "'id' is empty";
    if (entry->id.size() > shm::kMaxIdBytes)
      return fmt::format("'id' is longer than {} bytes", shm::kMaxIdBytes);
  }
  // A string or {"path": ...}: the value; a path is resolved against the manifest's folder.
  auto value = [&](const std::string& name, const nlohmann::json& v, FieldValue* f) {
    if (v.is_string()) {
      f->data = v.get<std::string>();
      f->kind = path_fields.count(name) ? FieldValue::Kind::kPath : FieldValue::Kind::kText;
    } else if (v.is_object() && v.contains("path") && v["path"].is_string()) {
      f->data = v["path"].get<std::string>();
      f->kind = FieldValue::Kind::kPath;
    } else {
      return fmt::format("field '{}' must be a string, {{\"path\": ...}} or a list of those", name);
    }
    if (f->kind == FieldValue::Kind::kPath) {
      if (f->data.empty()) return fmt::format("field '{}' has an empty path", name);
      f->data = ResolvePath(dir, f->data);
    }
    return std::string();
  };
  for (const std::string& name : needed) {
    const auto key = keys.find(name);
    const std::string& in_line = key == keys.end() ? name : key->second;
    if (!j.contains(in_line)) {
      if (optional) continue;
      return key == keys.end() ? fmt::format("missing field '{}'", name)
                               : fmt::format("missing key '{}' (field '{}')", in_line, name);
    }
    const auto& v = j[in_line];
    FieldValue f;
    // Several values, e.g. "images": ["a.jpg", "b.jpg"], or none ("images": [] in a dataset
    // that mixes text-only samples with others).
    if (v.is_array()) {
      if (v.size() > kMaxListItems)
        return fmt::format("field '{}' is a list of {} values: at most {} are allowed", name,
                           v.size(), kMaxListItems);
      f.kind = FieldValue::Kind::kList;
      f.items.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        std::string reason = value(name, v[i], &f.items[i]);
        if (!reason.empty()) return reason;
      }
    } else {
      std::string reason = value(name, v, &f);
      if (!reason.empty()) return reason;
    }
    entry->fields.emplace_back(name, std::move(f));
  }
  if (optional && entry->fields.empty() && !needed.empty()) return NoNeededField(needed);
  return "";
}

// What `fields` maps each tar member extension to, for the fields the stages read.
std::map<std::string, std::string> ExtToField(const SourceConfig& source,
                                              const std::set<std::string>& needed) {
  std::map<std::string, std::string> out;
  for (const auto& [field, exts] : source.fields)
    if (needed.count(field))
      for (const auto& e : exts) out[e] = field;
  return out;
}

// A tar sample's entry: its members that hold needed fields, read in place. Returns the
// reason when a needed field has no member (`optional`: when none has).
std::string TarEntry(const std::string& shard, const std::string& key,
                     const std::vector<TarMember>& members,
                     const std::map<std::string, std::string>& ext_to_field,
                     const std::set<std::string>& needed, bool optional, CatalogEntry* e) {
  e->id = key;
  e->origin = shard + ":" + key;
  e->fields.clear();
  for (const TarMember& m : members) {
    auto f = ext_to_field.find(m.ext);
    if (f == ext_to_field.end()) continue;
    FieldValue v;
    v.kind = FieldValue::Kind::kFileRange;
    v.data = shard;
    v.offset = m.offset;
    v.size = m.size;
    v.member = key + "." + m.ext;
    e->fields.emplace_back(f->second, std::move(v));
  }
  if (optional) return e->fields.empty() && !needed.empty() ? NoNeededField(needed) : "";
  for (const std::string& n : needed)
    if (std::none_of(e->fields.begin(), e->fields.end(),
                     [&](const auto& kv) { return kv.first == n; }))
      return fmt::format("sample has no member for field '{}'", n);
  return "";
}

// Reads the headers of one tar shard and appends its samples. Stops at the first damaged or
// truncated member: the members before it are kept, the damage is recorded.
void ScanShard(const std::string& shard, const std::map<std::string, std::string>& ext_to_field,
               const std::set<std::string>& needed, bool optional, Catalog* out) {
  int fd = ::open(shard.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    out->errors.push_back({shard, std::string("cannot open: ") + std::strerror(errno)});
    return;
  }
  WalkTarSamples(
      TarFile(fd), shard, shm::kMaxIdBytes,
      [&](const std::string& key, const std::vector<TarMember>& members) {
        CatalogEntry e;
        std::string reason = TarEntry(shard, key, members, ext_to_field, needed, optional, &e);
        if (reason.empty())
          out->entries.push_back(std::move(e));
        else
          out->errors.push_back({e.origin, reason});
      },
      [&](const std::string& origin, const std::string& reason) {
        out->errors.push_back({origin, reason});
      });
  ::close(fd);
}

}  // namespace

Result<Catalog> LoadManifest(const std::string& path, const std::set<std::string>& needed,
                             const std::set<std::string>& path_fields,
                             const std::map<std::string, std::string>& keys, bool fields_optional) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(fmt::format("{}: cannot open manifest", path));
  Catalog cat;
  cat.fields_optional = fields_optional;
  std::string dir = std::filesystem::path(path).parent_path().string();
  std::string name = std::filesystem::path(path).filename().string();
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    CatalogEntry e = LineEntry(path, name, line_no);
    std::string reason =
        ParseManifestLine(line, dir, needed, path_fields, keys, fields_optional, &e);
    if (reason.empty())
      cat.entries.push_back(std::move(e));
    else
      cat.errors.push_back({e.origin, reason});
  }
  return cat;
}

Result<Catalog> LoadWebDataset(const SourceConfig& source, const std::set<std::string>& needed) {
  Result<std::vector<std::string>> shards = ExpandBraces(source.path);
  if (!shards.ok()) return shards.status();
  Catalog cat;
  cat.needed = needed;
  cat.fields_optional = source.fields_optional;
  cat.ext_to_field = ExtToField(source, needed);
  if (source.remote) {  // always indexed: the index is what spares fetching every shard
    MMFEED_ASSIGN_OR_RETURN(std::unique_ptr<RemoteStore> store,
                            RemoteStore::Create(source.fetch, source.path));
    cat.remote = std::move(store);
  }
  bool indexed = source.index == "on" || source.remote;
  if (source.index == "auto" && !source.remote) {
    uint64_t bytes = 0;
    for (const std::string& s : *shards) {
      std::error_code ec;
      const uintmax_t n = std::filesystem::file_size(s, ec);
      bytes += ec ? 0 : n;
    }
    indexed = bytes >= kIndexAutoBytes;
  }
  if (!indexed) {
    for (const std::string& s : *shards)
      ScanShard(s, cat.ext_to_field, needed, cat.fields_optional, &cat);
    return cat;
  }
  std::vector<ShardIndex::Damage> damage;
  MMFEED_ASSIGN_OR_RETURN(
      std::unique_ptr<ShardIndex> index,
      ShardIndex::Open(*shards, source.index_dir, shm::kMaxIdBytes, &damage, cat.remote.get()));
  cat.shards = std::move(index);
  for (ShardIndex::Damage& d : damage)
    cat.errors.push_back({std::move(d.origin), std::move(d.reason)});
  return cat;
}

Status Catalog::Read(size_t i, CatalogEntry* e) const {
  if (!parts.empty()) {
    const size_t k = PartOf(i);
    const Catalog& part = *parts[k];
    const size_t at = i - part_first[k];
    if (part.indexed()) return part.Read(at, e);
    *e = part.entries[at];
    return Status::Ok();
  }
  if (parquet) return ReadParquet(i, e);
  if (shards) {
    const std::string* shard = nullptr;
    std::string key;
    std::vector<TarMember> members;
    Status st = shards->Sample(i, &shard, &key, &members);
    std::string reason = TarEntry(*shard, key, members, ext_to_field, needed, fields_optional, e);
    if (!st.ok()) return st;
    return reason.empty() ? Status::Ok() : Status::Corrupt(reason);
  }
  std::string line;
  uint64_t line_no = 0;
  Status st = index->Line(i, &line, &line_no);
  *e = LineEntry(manifest_path, manifest_name, line_no);
  if (!st.ok()) return st;
  std::string reason =
      ParseManifestLine(line, manifest_dir, needed, path_fields, keys, fields_optional, e);
  return reason.empty() ? Status::Ok() : Status::Corrupt(reason);
}

Result<Catalog> LoadCatalog(const SourceConfig& source, const std::set<std::string>& needed,
                            const std::set<std::string>& path_fields) {
  if (source.type == "parquet") return LoadParquet(source, needed, path_fields);
  if (source.type != "manifest") return LoadWebDataset(source, needed);
  bool indexed = source.index == "on";
  if (source.index == "auto") {
    std::error_code ec;
    const uintmax_t bytes = std::filesystem::file_size(source.path, ec);
    indexed = !ec && bytes >= kIndexAutoBytes;
  }
  if (!indexed)
    return LoadManifest(source.path, needed, path_fields, source.keys, source.fields_optional);
  Result<std::unique_ptr<ManifestIndex>> index = ManifestIndex::Open(source.path, source.index_dir);
  if (!index.ok()) return index.status();
  Catalog cat;
  cat.index = std::move(index.value());
  cat.manifest_path = source.path;
  cat.manifest_dir = std::filesystem::path(source.path).parent_path().string();
  cat.manifest_name = std::filesystem::path(source.path).filename().string();
  cat.needed = needed;
  cat.path_fields = path_fields;
  cat.keys = source.keys;
  cat.fields_optional = source.fields_optional;
  return cat;
}

uint64_t HashMixSwitch(const MixSwitch& s, uint64_t h) {
  return HashString(fmt::format("switch {}|{}|{}", s.epoch, s.position, fmt::join(s.weights, ":")),
                    h);
}

namespace {

// The mixture `plain` deals after the weight switches `switches` (each one's earlier weights
// in place of `shares`' own), or null when they do not fit.
std::shared_ptr<const Mixture> WithSwitches(std::shared_ptr<const Mixture> plain,
                                            std::vector<MixSource> shares,
                                            const std::vector<MixSwitch>& switches,
                                            uint64_t samples_per_epoch, uint32_t lanes,
                                            uint64_t seed, uint32_t per_node) {
  std::shared_ptr<const Mixture> chain;
  for (size_t j = 0; j <= switches.size(); ++j) {
    std::shared_ptr<const Mixture> next = plain;
    if (j < switches.size()) {
      if (switches[j].weights.size() != shares.size()) return nullptr;
      for (size_t i = 0; i < shares.size(); ++i) shares[i].weight = switches[j].weights[i];
      Result<Mixture> m =
          Mixture::Create(shares, MixMode::kWeighted, samples_per_epoch, lanes, seed, per_node);
      if (!m.ok()) return nullptr;
      next = std::make_shared<const Mixture>(std::move(m.value()));
    }
    if (chain) {
      Result<Mixture> m =
          Mixture::Switched(chain, *next, switches[j - 1].epoch, switches[j - 1].position);
      if (!m.ok()) return nullptr;
      next = std::make_shared<const Mixture>(std::move(m.value()));
    }
    chain = std::move(next);
  }
  return chain;
}

}  // namespace

Result<Catalog> LoadMixture(const std::vector<SourceConfig>& sources, const MixConfig& mix,
                            const SourceConfig& order, int consumers,
                            const std::set<std::string>& needed,
                            const std::set<std::string>& path_fields) {
  Catalog cat;
  std::vector<MixSource> shares;
  uint64_t h = HashString(fmt::format("mix 1|{}|{}", mix.mode, mix.samples_per_epoch));
  std::map<std::string, uint64_t> seen;  // per needed field: samples looked at that have it
  for (SourceConfig s : sources) {
    s.fields_optional = true;
    Result<Catalog> part = LoadCatalog(s, needed, path_fields);
    if (!part.ok()) return part.status().WithContext(fmt::format("source '{}'", s.name));
    if (part->size() == 0)
      return Status::Invalid(fmt::format(
          "source '{}' ({}) has no usable samples{}: fix it or leave it out of the mixture", s.name,
          s.path,
          part->errors.empty() ? ""
                               : fmt::format(" ({} bad, e.g. {}: {})", part->errors.size(),
                                             part->errors[0].origin, part->errors[0].reason)));
    for (LoadError& e : part->errors) cat.errors.push_back(std::move(e));
    part->errors.clear();
    // What the mixture deals: each source's contents and share.
    const bool windowed = part->InWindows(s);
    h = HashString(fmt::format("{}|{}|{}|{}|{}|{}", s.name, s.weight, s.repeat, s.shuffle, s.seed,
                               part->size()),
                   h);
    if (windowed) h = HashString(fmt::format("window {}", s.shuffle_window), h);
    for (const auto& [field, key] : s.keys) h = HashString(fmt::format("key {}={}", field, key), h);
    if (part->indexed())
      h = HashString(fmt::format("index {:016x}", part->index_fingerprint()), h);
    else
      for (const CatalogEntry& e : part->entries) h = HashString(e.id, HashString("\n", h));
    // Which fields its samples lack (a spread of up to kFieldLookups, read as dealt).
    // Samples whose indexed read fails are not counted: their errors are the run's to report.
    const uint64_t n = part->size(), lookups = std::min<uint64_t>(n, kFieldLookups);
    uint64_t looked = 0;
    std::map<std::string, uint64_t> has;
    CatalogEntry read;
    for (uint64_t k = 0; k < lookups; ++k) {
      const uint64_t i = k * n / lookups;
      const CatalogEntry* e = &read;
      if (!part->indexed())
        e = &part->entries[i];
      else if (!part->Read(i, &read).ok())
        continue;
      ++looked;
      for (const auto& [field, value] : e->fields) ++has[field];
    }
    std::vector<std::string> lacks;
    for (const std::string& field : needed) {
      seen[field] += has[field];
      if (has[field] < looked)
        lacks.push_back(
            fmt::format("'{}' in {:.0f}%", field, 100.0 * (looked - has[field]) / looked));
    }
    cat.part_lacks.push_back(lacks.empty() ? ""
                                           : fmt::format("{} lacks {} of {} samples looked at",
                                                         s.name, fmt::join(lacks, ", "), looked));
    shares.push_back(MixSource{part->size(), s.weight, s.repeat, s.shuffle, s.seed, windowed});
    if (part->remote) {
      if (!cat.router) cat.router = std::make_shared<RemoteRouter>();
      for (size_t u = 0; u < part->shards->shard_count(); ++u)
        cat.router->Add(*part->shards->shard(u).path, part->remote.get());
    }
    cat.part_first.push_back(cat.parts.empty() ? 0
                                               : cat.part_first.back() + cat.parts.back()->size());
    cat.parts.push_back(std::make_shared<Catalog>(std::move(part.value())));
    cat.part_sources.push_back(s);
  }
  for (const auto& [field, count] : seen)
    if (count == 0)
      return Status::Invalid(fmt::format(
          "no source of the mixture has field '{}' (in up to {} samples looked at per source): "
          "check the stages' field: and each source's fields:",
          field, kFieldLookups));
  if (cat.size() > UINT32_MAX) return Status::TooLarge("more than 4G samples in one mixture");
  const uint32_t lanes = static_cast<uint32_t>(order.num_nodes * consumers);
  Result<Mixture> m =
      Mixture::Create(shares, mix.mode == "epochs" ? MixMode::kEpochs : MixMode::kWeighted,
                      mix.samples_per_epoch, lanes, order.seed, static_cast<uint32_t>(consumers));
  if (!m.ok()) {  // it names sources by number: give their names
    std::string msg = m.status().message();
    for (size_t i = sources.size(); i-- > 0;) {
      const std::string number = fmt::format("source {}", i);
      for (size_t at = msg.find(number); at != std::string::npos; at = msg.find(number, at + 1))
        msg.replace(at, number.size(), fmt::format("source '{}'", sources[i].name));
    }
    return Status::Invalid(fmt::format("mix: {}", msg));
  }
  cat.mixture = std::make_shared<const Mixture>(std::move(m.value()));
  if (!mix.switches.empty())
    if (auto switched = WithSwitches(cat.mixture, shares, mix.switches, mix.samples_per_epoch,
                                     lanes, order.seed, static_cast<uint32_t>(consumers))) {
      cat.mixture = std::move(switched);
      for (const MixSwitch& s : mix.switches) h = HashMixSwitch(s, h);
    }
  cat.mix_fingerprint = h;
  return cat;
}

namespace {

// The window [a, b) (sequence shards) holding position g of the window order `w`.
std::pair<size_t, size_t> WindowAt(const ShardWindows& w, uint64_t g) {
  const size_t t = std::upper_bound(w.starts.begin(), w.starts.end(), g) - w.starts.begin() - 1;
  const size_t a = t / w.window * w.window;
  return {a, std::min<size_t>(a + w.window, w.shards.size())};
}

// The sample (entry of `units`, a catalog of shards or row groups) at position g of the window
// order `w`: the samples of each window permuted by `seed` (unless !shuffle).
uint64_t WindowSample(const ShardWindows& w, const Catalog& units, bool shuffle, uint64_t seed,
                      uint64_t g) {
  const auto [a, b] = WindowAt(w, g);
  const uint64_t lo = w.starts[a], hi = w.starts[b];
  uint64_t q = g;
  if (shuffle) q = lo + Permutation(hi - lo, seed ^ (a * 0x9E3779B97F4A7C15ull))(g - lo);
  const size_t u =
      std::upper_bound(w.starts.begin() + a, w.starts.begin() + b + 1, q) - w.starts.begin() - 1;
  return units.unit_first(w.shards[u]) + (q - w.starts[u]);
}

uint64_t WindowSeed(const SourceConfig& source, uint32_t epoch) {
  return Rng(source.seed, epoch, "", "window shuffle").Next();
}

}  // namespace

Result<FieldFile> RemoteRouter::OpenRange(const std::string& url, uint64_t offset, uint64_t size,
                                          const std::string& member) {
  auto it = by_url_.find(url);
  if (it == by_url_.end()) return Status::Invalid(url + ": not a shard of a remote source");
  return it->second->OpenRange(url, offset, size, member);
}

EpochOrder::EpochOrder(size_t n, const SourceConfig& source, uint32_t epoch, int consumers,
                       uint64_t base)
    : size_((n - std::min<uint64_t>(base, n)) / source.num_nodes / consumers * consumers),
      nodes_(static_cast<uint64_t>(source.num_nodes)),
      node_(static_cast<uint64_t>(source.node_rank)),
      base_(base),
      shuffle_(source.shuffle),
      perm_(n, Rng(source.seed, epoch, "", "shuffle").Next()) {}

uint64_t EpochOrder::PositionOf(uint32_t entry) const {
  if (entry >= perm_.size()) return kNowhere;
  const uint64_t at = shuffle_ ? perm_.Inverse(entry) : entry;
  if (at < base_ + node_ || (at - base_ - node_) % nodes_ != 0) return kNowhere;
  const uint64_t i = (at - base_ - node_) / nodes_;
  return i < size_ ? i : kNowhere;
}

std::shared_ptr<const ShardWindows> Catalog::WindowsOf(const SourceConfig& source,
                                                       uint32_t epoch) const {
  std::lock_guard<std::mutex> lock(window_cache_->mu);
  auto& cached = window_cache_->epochs[{epoch, source.seed, source.shuffle, source.shuffle_window}];
  if (cached) return cached;
  auto w = std::make_shared<ShardWindows>();
  const size_t n = unit_count();
  w->window = static_cast<uint32_t>(std::max(1, source.shuffle_window));
  w->shards.resize(n);
  w->starts.assign(1, 0);
  const Permutation perm(n ? n : 1, Rng(source.seed, epoch, "", "shard order").Next());
  for (size_t t = 0; t < n; ++t) {
    w->shards[t] = static_cast<uint32_t>(source.shuffle ? perm(t) : t);
    w->starts.push_back(w->starts.back() + unit_size(w->shards[t]));
  }
  cached = w;
  while (window_cache_->epochs.size() > 8)  // ranks are an epoch or two apart at most
    window_cache_->epochs.erase(window_cache_->epochs.begin());
  return w;
}

EpochOrder::EpochOrder(const Catalog& cat, const SourceConfig& source, uint32_t epoch,
                       int consumers, uint64_t base, const Mixture* numbering, uint32_t lanes)
    : EpochOrder(cat.size(), source, epoch, consumers, base) {
  if (cat.mixture) {
    mix_ = cat.mixture.get();
    mixed_ = &cat;
    epoch_ = epoch;
    consumers_ = static_cast<uint64_t>(consumers);
    size_ = mix_->per_lane() * consumers_;
    if (base_) {
      numbering_ = numbering ? numbering : mix_;
      const uint64_t n = numbering_->per_lane() * numbering_->lanes();
      size_ = (n - std::min(base_, n)) / (nodes_ * consumers_) * consumers_;
    }
    return;
  }
  if (!cat.InWindows(source)) return;
  windows_ = cat.WindowsOf(source, epoch);
  units_ = &cat;
  window_seed_ = WindowSeed(source, epoch);
  lanes_ = base_ && lanes ? lanes : nodes_;
  lane_size_ = cat.size() / lanes_;
  const uint64_t n = lanes_ * lane_size_;
  const uint64_t c = static_cast<uint64_t>(consumers);
  size_ = (n - std::min(base_, n)) / nodes_ / c * c;
}

uint32_t EpochOrder::Mixed(size_t i) const {
  if (!numbering_) {
    const uint64_t lane = node_ * consumers_ + i % consumers_;
    return EntryOf(mix_->At(epoch_, static_cast<uint32_t>(lane), i / consumers_));
  }
  const uint64_t g = Global(i), lanes = numbering_->lanes();
  return EntryOf(numbering_->At(epoch_, static_cast<uint32_t>(g % lanes), g / lanes));
}

uint32_t EpochOrder::EntryOf(const MixDraw& d) const {
  uint64_t sample = d.sample;
  if (mixed_->windowed(d.source)) {
    const Catalog& part = *mixed_->parts[d.source];
    const SourceConfig& source = mixed_->part_sources[d.source];
    const uint32_t pass = static_cast<uint32_t>(d.draw / part.size());
    sample = WindowSample(*part.WindowsOf(source, pass), part, source.shuffle,
                          WindowSeed(source, pass), d.sample);
  }
  return static_cast<uint32_t>(mixed_->part_first[d.source] + sample);
}

uint32_t EpochOrder::SameSource(uint32_t entry, int rank, uint64_t random) const {
  const uint32_t k = static_cast<uint32_t>(mixed_->PartOf(entry));
  if (numbering_) {  // any lane's draw of the source in the epoch's numbering
    const uint32_t lanes = numbering_->lanes();
    for (uint32_t t = 0; t < lanes; ++t)
      if (auto d =
              numbering_->Refill(epoch_, static_cast<uint32_t>((random + t) % lanes), k, random))
        return EntryOf(*d);
  }
  const uint32_t lane = static_cast<uint32_t>(node_ * consumers_ + static_cast<uint64_t>(rank));
  if (const std::optional<MixDraw> d = mix_->Refill(epoch_, lane, k, random)) return EntryOf(*d);
  // Not one of this rank's sources this epoch (cannot happen): any of its positions.
  return Mixed(random % (size_ / consumers_) * consumers_ + static_cast<uint64_t>(rank));
}

uint32_t EpochOrder::SequenceAt(uint64_t g) const {
  return static_cast<uint32_t>(
      WindowSample(*windows_, *units_, shuffle_, window_seed_, Sequence(g)));
}

std::vector<uint32_t> Catalog::PassShards(const SourceConfig& source, uint64_t from, uint64_t to,
                                          uint64_t limit, int ahead, int most) const {
  std::vector<uint32_t> out;
  const uint64_t n = size();
  for (uint64_t d = from; most-- > 0 && (d <= to || d <= limit);) {
    const uint64_t pass = d / n;
    const std::shared_ptr<const ShardWindows> w = WindowsOf(source, static_cast<uint32_t>(pass));
    const auto [a, b] = WindowAt(*w, d % n);
    for (size_t u = a; u < b; ++u)
      if (w->starts[u + 1] > w->starts[u]) out.push_back(w->shards[u]);
    d = pass * n + w->starts[b];  // the next window's first draw
    if (d > to && ahead-- == 0) break;
  }
  return out;
}

size_t EpochOrder::WindowOf(size_t i) const {
  // In the part of this node's first position (the one it reads unless its positions hop over
  // several parts, in an epoch resumed at another shape): monotone in i.
  const ShardWindows& w = *windows_;
  const uint64_t s = Sequence(Global(0)) + (Global(i) - Global(0)) / lanes_;
  return static_cast<size_t>(std::upper_bound(w.starts.begin(), w.starts.end(), s) -
                             w.starts.begin() - 1) /
         w.window;
}

std::vector<uint32_t> EpochOrder::WindowShards(size_t i, int more) const {
  std::vector<uint32_t> out;
  if (!windows_ || i >= size_) return out;
  const ShardWindows& w = *windows_;
  // Each part this node's positions fall in (one, unless an epoch resumed at another shape
  // deals positions of several parts to a node), from position i's place in it to the last.
  std::vector<uint64_t> parts;
  for (uint64_t j = 0; j < lanes_ && i + j < size_; ++j) {
    const uint64_t part = Global(i + j) % lanes_;
    if (std::find(parts.begin(), parts.end(), part) == parts.end()) parts.push_back(part);
  }
  const uint64_t from = Global(i) / lanes_, to = Global(size_ - 1) / lanes_ + 1;
  std::unordered_set<uint32_t> seen;  // a window over two parts' edge is read once
  for (uint64_t part : parts) {
    const uint64_t g = part * lane_size_ + from, end = part * lane_size_ + to;
    size_t t = std::upper_bound(w.starts.begin(), w.starts.end(), g) - w.starts.begin() - 1;
    int left = more;
    for (size_t a = t / w.window * w.window; a < w.shards.size() && left >= 0;
         a += w.window, --left) {
      if (w.starts[a] >= end) break;
      // Every shard of the window, even past this node's part: its positions may draw from them.
      for (size_t u = a; u < std::min(a + w.window, w.shards.size()); ++u)
        if (w.starts[u + 1] > w.starts[u] && (parts.size() == 1 || seen.insert(w.shards[u]).second))
          out.push_back(w.shards[u]);
    }
  }
  return out;
}

}  // namespace mmfeed
