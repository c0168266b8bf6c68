#include "engine/config.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "base/rng.h"
#include "engine/config_schema.h"
#include "source/brace.h"
#include "source/catalog.h"

namespace mmfeed {
namespace {

// Thrown inside the parser only; ParseConfig turns it into one Status.
struct ConfigError {
  YAML::Mark mark;
  std::string message;
};

[[noreturn]] void Fail(const YAML::Node& node, std::string message) {
  throw ConfigError{node.Mark(), std::move(message)};
}

ConfigMark ToMark(const YAML::Mark& m) { return {m.line + 1, m.column + 1}; }

std::string Describe(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "nothing";
}

// A key given twice is an error: the YAML parser would silently keep the first.
void CheckUniqueKeys(const YAML::Node& map, const std::string& what) {
  std::map<std::string, YAML::Mark> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    auto [first, fresh] = seen.emplace(it->first.as<std::string>(), it->first.Mark());
    if (!fresh)
      Fail(it->first,
           fmt::format("'{}' is given twice in {} (first at line {}, column {})", first->first,
                       what, first->second.line + 1, first->second.column + 1));
  }
}

// Checks that `map` is a mapping whose keys are all in `allowed`, each once.
void CheckKeys(const YAML::Node& map, const std::string& what,
               const std::vector<std::string>& allowed) {
  if (!map.IsMap()) Fail(map, fmt::format("{} must be a mapping, got {}", what, Describe(map)));
  CheckUniqueKeys(map, what);
  for (auto it = map.begin(); it != map.end(); ++it) {
    std::string key = it->first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      Fail(it->first, fmt::format("unknown key '{}' in {}; expected one of: {}", key, what,
                                  fmt::join(allowed, ", ")));
  }
}

template <typename T>
T Scalar(const YAML::Node& n, const std::string& what, const char* type_name) {
  if (!n.IsScalar()) Fail(n, fmt::format("{} must be {}, got {}", what, type_name, Describe(n)));
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    Fail(n, fmt::format("{} must be {}, got {}", what, type_name, Describe(n)));
  }
}

int64_t Int(const YAML::Node& n, const std::string& what) {
  return Scalar<int64_t>(n, what, "an integer");
}
bool Bool(const YAML::Node& n, const std::string& what) {
  return Scalar<bool>(n, what, "true or false");
}
std::string Str(const YAML::Node& n, const std::string& what) {
  return Scalar<std::string>(n, what, "a string");
}
double Float(const YAML::Node& n, const std::string& what) {
  return Scalar<double>(n, what, "a number");
}

int64_t IntAtLeast(const YAML::Node& n, const std::string& what, int64_t min) {
  int64_t v = Int(n, what);
  if (v < min) Fail(n, fmt::format("{} must be at least {}, got {}", what, min, v));
  return v;
}

// A size in bytes: an integer, or a number with a binary unit (K, M, G, T; "500G", "1.5TiB").
uint64_t ByteSize(const YAML::Node& n, const std::string& what) {
  const std::string text = Str(n, what);
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
  }
  std::string unit = text.substr(used);
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (unit.size() == 2 && unit[1] == 'i') unit.pop_back();
  const std::string units = "KMGT";
  const size_t power = unit.empty() ? 0 : units.find(unit) + 1;
  if (!(v >= 1) || unit.size() > 1 || (power == 0 && !unit.empty()) || !std::isdigit(text[0]))
    Fail(n, fmt::format("{} must be a size in bytes, like 1073741824, 500G or 1.5TiB; got {}", what,
                        Describe(n)));
  const double bytes = v * std::pow(1024.0, static_cast<double>(power));
  if (bytes > 9e18) Fail(n, fmt::format("{} is too large", what));
  return static_cast<uint64_t>(bytes);
}

// A folder the daemon will write (a cache's), resolved against the config's folder. Caught here
// (and by --check) rather than at the start: the nearest existing folder on the way must be one
// the daemon's user may write.
std::string WritableFolder(const YAML::Node& n, const std::string& what,
                           const std::string& base_dir) {
  const std::string dir = ResolvePath(base_dir, Str(n, what));
  std::filesystem::path p = std::filesystem::absolute(dir);
  std::error_code ec;
  // The daemon opens the folder once and refuses a symlink or another user's folder
  // (base/dir_fd.h): said here, with the line, rather than at the start.
  std::string own = p.string();
  while (own.size() > 1 && own.back() == '/') own.pop_back();
  if (struct stat st{}; ::lstat(own.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode))
      Fail(n, fmt::format("{} {} is a symbolic link: refused (a link can be swapped to send the "
                          "daemon's files elsewhere); name the folder it points to: {}",
                          what, dir, std::filesystem::canonical(p, ec).string()));
    if (S_ISDIR(st.st_mode) && st.st_uid != ::geteuid())
      Fail(n, fmt::format("{} {} belongs to uid {}, not to the daemon's user (uid {}): that user "
                          "could swap what is in it; name a folder of the daemon's own",
                          what, dir, st.st_uid, ::geteuid()));
  }
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p != p.parent_path())
    p = p.parent_path();
  if (!std::filesystem::is_directory(p, ec))
    Fail(n, fmt::format("{} {}: {} is not a folder", what, dir, p.string()));
  if (::access(p.c_str(), W_OK | X_OK) != 0)
    Fail(n, fmt::format("{} {}: the daemon's user cannot write {} ({})", what, dir, p.string(),
                        std::strerror(errno)));
  return dir;
}

Placement ParsePlacement(const YAML::Node& n, const std::string& what) {
  Placement p;
  if (n.IsScalar() && n.Scalar() == "strict") {  // shorthand for {strict: true}
    p.strict = true;
    return p;
  }
  CheckKeys(n, what, SchemaKeys("/properties/placement/oneOf/1/properties"));
  if (n["numa_node"])
    p.numa_node = static_cast<int>(IntAtLeast(n["numa_node"], what + ".numa_node", 0));
  if (n["strict"]) {
    if (!n["strict"].IsScalar() ||
        (n["strict"].Scalar() != "true" && n["strict"].Scalar() != "false"))
      Fail(n["strict"],
           fmt::format("{}.strict must be true or false, got {}", what, Describe(n["strict"])));
    p.strict = n["strict"].Scalar() == "true";
  }
  return p;
}

// A number of a parameter checked against its spec's range.
template <typename T>
T InRange(const ParamSpec& spec, const YAML::Node& n, const std::string& what, T v) {
  const double x = static_cast<double>(v);
  if ((spec.minimum && x < *spec.minimum) || (spec.maximum && x > *spec.maximum)) {
    const std::string lo = spec.minimum ? fmt::format("{}", *spec.minimum) : "";
    const std::string hi = spec.maximum ? fmt::format("{}", *spec.maximum) : "";
    Fail(n, spec.minimum && spec.maximum
                ? fmt::format("{} must be in {}..{}, got {}", what, lo, hi, v)
            : spec.minimum ? fmt::format("{} must be at least {}, got {}", what, lo, v)
                           : fmt::format("{} must be at most {}, got {}", what, hi, v));
  }
  return v;
}

ParamValue ParseParam(const ParamSpec& spec, const YAML::Node& n, const std::string& what) {
  auto list = [&](auto elem) {
    if (!n.IsSequence())
      Fail(n, fmt::format("{} must be a {}, got {}", what, ParamTypeName(spec.type), Describe(n)));
    if (spec.list_size && static_cast<int>(n.size()) != spec.list_size)
      Fail(n, fmt::format("{} must have {} values, got {}", what, spec.list_size, n.size()));
    std::vector<decltype(elem(n))> out;
    for (size_t i = 0; i < n.size(); ++i) out.push_back(elem(n[i]));
    return out;
  };
  switch (spec.type) {
    case ParamType::kBool:
      return Bool(n, what);
    case ParamType::kInt:
      return InRange(spec, n, what, Int(n, what));
    case ParamType::kFloat:
      return InRange(spec, n, what, Float(n, what));
    case ParamType::kString: {
      std::string s = Str(n, what);
      if (!spec.choices.empty() &&
          std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end())
        Fail(n,
             fmt::format("{} must be one of {}, got '{}'", what, fmt::join(spec.choices, ", "), s));
      return s;
    }
    case ParamType::kIntList:
      return list([&](const YAML::Node& e) {
        return InRange(spec, e, what + " element", Int(e, what + " element"));
      });
    case ParamType::kFloatList:
      return list([&](const YAML::Node& e) {
        return InRange(spec, e, what + " element", Float(e, what + " element"));
      });
  }
  Fail(n, "unsupported parameter type");
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != 0 || x < 0) return fallback;
  return static_cast<int>(x);
}

bool IsAuto(const YAML::Node& n) { return n && n.IsScalar() && n.Scalar() == "auto"; }

// This node's share: `node_rank` and `num_nodes` of `n` (source: or mix:), else NODE_RANK and
// NUM_NODES; `auto` (both, or one and the other left out): the trainers' job says (node 0 of 1
// until one does).
void ParseNodeShare(const YAML::Node& n, const std::string& what, SourceConfig* s) {
  if (IsAuto(n["node_rank"]) || IsAuto(n["num_nodes"])) {
    for (const char* key : {"node_rank", "num_nodes"})
      if (n[key] && !IsAuto(n[key]))
        Fail(n[key], fmt::format("{}.node_rank and {}.num_nodes are auto together (the "
                                 "trainers' job gives both)",
                                 what, what));
    s->node_auto = true;
    s->node_rank = 0;
    s->num_nodes = 1;
    return;
  }
  s->node_rank = EnvInt("NODE_RANK", 0);
  s->num_nodes = EnvInt("NUM_NODES", 1);
  if (n["node_rank"])
    s->node_rank = static_cast<int>(IntAtLeast(n["node_rank"], what + ".node_rank", 0));
  if (n["num_nodes"])
    s->num_nodes = static_cast<int>(IntAtLeast(n["num_nodes"], what + ".num_nodes", 1));
  if (s->num_nodes < 1) s->num_nodes = 1;
  if (s->node_rank >= s->num_nodes)
    Fail(n["node_rank"] ? n["node_rank"] : n,
         fmt::format("node_rank {} must be below num_nodes {}", s->node_rank, s->num_nodes));
}

// `source:`, or one of `sources:` (in_mix: a name and a share; the order's epochs and the
// node's share are the mix's).
SourceConfig ParseSource(const YAML::Node& n, const std::string& base_dir, bool in_mix = false) {
  const std::vector<std::string>& keys =
      SchemaKeys(in_mix ? "/properties/sources/items/properties" : "/properties/source/properties");
  CheckKeys(n, in_mix ? "a source of 'sources' (epochs and the node's share are mix's)" : "source",
            keys);
  SourceConfig s;
  if (!n["type"]) Fail(n, "source needs a 'type' (manifest, webdataset or parquet)");
  s.type = Str(n["type"], "source.type");
  if (s.type != "manifest" && s.type != "webdataset" && s.type != "parquet")
    Fail(n["type"],
         fmt::format("unknown source type '{}'; expected manifest, webdataset or parquet", s.type));
  if (!n["path"]) Fail(n, "source needs a 'path'");
  s.path = ResolvePath(base_dir, Str(n["path"], "source.path"));
  s.path_mark = ToMark(n["path"].Mark());
  s.remote = IsRemotePath(s.path);
  if (s.remote && s.type != "webdataset")
    Fail(n["path"],
         fmt::format("a URL path needs type: webdataset ({}s are read from local files)", s.type));
  for (const char* key : {"split", "row_group_cache_bytes"})
    if (n[key] && s.type != "parquet")
      Fail(n[key], fmt::format("source.{} applies to type: parquet only", key));
  if (n["split"]) s.split = Str(n["split"], "source.split");
  if (n["row_group_cache_bytes"])
    s.row_group_cache_bytes = ByteSize(n["row_group_cache_bytes"], "source.row_group_cache_bytes");
  for (const char* key : {"prefetch_bytes", "fetch_concurrency", "fetch_retries", "fetch_timeout_s",
                          "fetch_stall_s", "max_shard_bytes", "s3", "cache"})
    if (n[key] && !s.remote)
      Fail(n[key], fmt::format("source.{} applies to http://, https:// and s3:// paths only", key));
  if (n["prefetch_bytes"])
    s.fetch.prefetch_bytes =
        static_cast<uint64_t>(IntAtLeast(n["prefetch_bytes"], "source.prefetch_bytes", 1));
  if (n["max_shard_bytes"])
    s.fetch.max_shard_bytes =
        static_cast<uint64_t>(IntAtLeast(n["max_shard_bytes"], "source.max_shard_bytes", 1));
  if (n["fetch_concurrency"])
    s.fetch.concurrency =
        static_cast<int>(IntAtLeast(n["fetch_concurrency"], "source.fetch_concurrency", 1));
  if (n["fetch_retries"])
    s.fetch.retries = static_cast<int>(IntAtLeast(n["fetch_retries"], "source.fetch_retries", 0));
  if (n["fetch_timeout_s"]) {
    s.fetch.timeout_s = Float(n["fetch_timeout_s"], "source.fetch_timeout_s");
    if (!(s.fetch.timeout_s >= 0.1))
      Fail(n["fetch_timeout_s"], "source.fetch_timeout_s must be at least 0.1");
  }
  if (n["fetch_stall_s"]) {
    s.fetch.stall_s = Float(n["fetch_stall_s"], "source.fetch_stall_s");
    if (!(s.fetch.stall_s >= 1 && s.fetch.stall_s <= 86400))
      Fail(n["fetch_stall_s"], "source.fetch_stall_s must be between 1 and 86400 seconds");
  }
  if (const YAML::Node c = n["cache"]) {
    CheckKeys(c, "source.cache", SchemaKeys("/properties/source/properties/cache/properties"));
    if (!c["dir"] || !c["max_bytes"])
      Fail(c, "source.cache needs a 'dir' (a folder on local disk) and 'max_bytes' (like 500G)");
    s.fetch.cache_dir = WritableFolder(c["dir"], "source.cache.dir", base_dir);
    s.fetch.cache_max_bytes = ByteSize(c["max_bytes"], "source.cache.max_bytes");
  }
  if (const YAML::Node s3 = n["s3"]) {
    if (!s3.IsMap())
      Fail(s3, "source.s3 must be a mapping {endpoint, region, credentials_file, profile}");
    CheckKeys(s3, "source.s3", SchemaKeys("/properties/source/properties/s3/properties"));
    if (s.path.rfind("s3://", 0) != 0) Fail(s3, "source.s3 applies to s3:// paths only");
    if (s3["endpoint"]) s.fetch.s3_endpoint = Str(s3["endpoint"], "source.s3.endpoint");
    if (s3["region"]) s.fetch.s3_region = Str(s3["region"], "source.s3.region");
    if (s3["credentials_file"])
      s.fetch.s3_credentials_file =
          ResolvePath(base_dir, Str(s3["credentials_file"], "source.s3.credentials_file"));
    if (s3["profile"]) s.fetch.s3_profile = Str(s3["profile"], "source.s3.profile");
  }
  s.shuffle_window = s.remote ? 8 : 0;
  if (n["shuffle_window"]) {
    if (s.type == "manifest")
      Fail(n["shuffle_window"],
           "source.shuffle_window applies to webdataset and parquet sources only");
    s.shuffle_window =
        static_cast<int>(IntAtLeast(n["shuffle_window"], "source.shuffle_window", 0));
    if (s.remote && s.shuffle_window == 0)
      Fail(n["shuffle_window"],
           "remote shards are read whole: source.shuffle_window must be at least 1 (a "
           "permutation of every sample would fetch a shard for nearly every sample)");
  }
  if (n["shuffle"]) s.shuffle = Bool(n["shuffle"], "source.shuffle");
  if (n["seed"]) s.seed = static_cast<uint64_t>(IntAtLeast(n["seed"], "source.seed", 0));
  if (n["epochs"]) s.epochs = static_cast<int>(IntAtLeast(n["epochs"], "source.epochs", 0));
  if (n["max_bytes"])
    s.max_bytes = static_cast<uint64_t>(IntAtLeast(n["max_bytes"], "source.max_bytes", 1));
  if (n["index"]) {
    s.index = Str(n["index"], "source.index");
    if (s.index != "auto" && s.index != "on" && s.index != "off")
      Fail(n["index"], fmt::format("source.index must be auto, on or off, not '{}'", s.index));
  }
  if (!in_mix) ParseNodeShare(n, "source", &s);
  s.fields = {{"image", {"jpg", "jpeg", "png", "webp", "bmp"}},
              {"text", {"txt", "caption", "text"}},
              {"video", {"mp4", "mkv", "webm"}},
              {"audio", {"flac", "wav", "mp3", "ogg", "opus", "m4a"}}};
  if (n["fields"] && s.type != "webdataset") {
    // The pipeline's field name -> the manifest key (or Parquet column) it is read from.
    const YAML::Node& f = n["fields"];
    if (!f.IsMap())
      Fail(f, fmt::format("a {}'s fields must map field names to {}", s.type,
                          s.type == "manifest" ? "manifest keys" : "columns"));
    CheckUniqueKeys(f, "source.fields");
    for (auto it = f.begin(); it != f.end(); ++it) {
      const YAML::Node name = it->first, value = it->second;
      s.keys[name.as<std::string>()] =
          Str(value,
              fmt::format("the {} of field '{}'", s.type == "manifest" ? "manifest key" : "column",
                          name.as<std::string>()));
    }
  } else if (n["fields"]) {
    const YAML::Node& f = n["fields"];
    if (!f.IsMap()) Fail(f, "source.fields must map field names to lists of extensions");
    CheckUniqueKeys(f, "source.fields");
    for (auto it = f.begin(); it != f.end(); ++it) {
      // Copies: `it->second` lives in a proxy that dies with the expression (a range-for over
      // it read freed stack under ASan).
      const YAML::Node name = it->first, value = it->second;
      std::vector<std::string> exts;
      if (value.IsScalar())
        exts.push_back(value.Scalar());
      else if (value.IsSequence())
        for (const auto& e : value) exts.push_back(Str(e, "source.fields extension"));
      else
        Fail(value, "source.fields values must be an extension or a list of them");
      s.fields[name.as<std::string>()] = exts;
    }
  }
  // The data must be there before anything starts.
  if (s.type == "manifest") {
    if (!std::filesystem::is_regular_file(s.path))
      Fail(n["path"], fmt::format("manifest '{}' not found", s.path));
  } else if (s.type == "parquet") {
    Result<std::vector<std::string>> files = ParquetFiles(s);
    if (!files.ok()) Fail(n["path"], files.status().message());
  } else {
    Result<std::vector<std::string>> shards = ExpandBraces(s.path);
    if (!shards.ok()) Fail(n["path"], shards.status().message());
    if (!s.remote)  // remote shards are looked at when the catalog is read
      for (const std::string& shard : *shards)
        if (!std::filesystem::is_regular_file(shard))
          Fail(n["path"], fmt::format("shard '{}' not found", shard));
  }
  return s;
}

void ParseStageParams(StageConfig* sc, const YAML::Node& stage_node, const std::string& base_dir) {
  const YAML::Node params = stage_node["params"];
  const StageSchema& schema = *sc->schema;
  std::string where = fmt::format("stage '{}' ({})", sc->name, sc->type);
  std::set<std::string> given;
  if (params) {
    if (!params.IsMap()) Fail(params, fmt::format("params of {} must be a mapping", where));
    CheckUniqueKeys(params, fmt::format("the params of {}", where));
    for (auto it = params.begin(); it != params.end(); ++it) {
      std::string key = it->first.as<std::string>();
      auto spec = std::find_if(schema.params.begin(), schema.params.end(),
                               [&](const ParamSpec& p) { return p.name == key; });
      if (spec == schema.params.end()) {
        std::vector<std::string> names;
        for (const auto& p : schema.params) names.push_back(p.name);
        // A stage-level key put inside params (a common slip): say where it goes.
        const std::vector<std::string>& stage_keys =
            SchemaKeys("/properties/stages/items/properties");
        if (key != "params" && key != "name" && key != "type" &&
            std::find(stage_keys.begin(), stage_keys.end(), key) != stage_keys.end())
          Fail(it->first,
               fmt::format("'{}' is not a parameter of {}: it is a stage-level key; did you mean "
                           "to put `{}` beside `params`, not inside it? (e.g. {{name: {}, type: "
                           "{}, {}: ..., params: {{...}}}})",
                           key, where, key, sc->name, sc->type, key));
        Fail(it->first, fmt::format("unknown parameter '{}' for {}; known: {}", key, where,
                                    fmt::join(names, ", ")));
      }
      sc->params.Set(key, ParseParam(*spec, it->second, fmt::format("{}.{}", sc->name, key)));
      given.insert(key);
    }
  }
  for (const ParamSpec& p : schema.params) {
    if (given.count(p.name)) continue;
    if (!p.default_value)
      Fail(params ? params : stage_node,
           fmt::format("{} needs parameter '{}' ({})", where, p.name, p.doc));
    sc->params.Set(p.name, *p.default_value);
  }
  if (schema.factory) {
    Result<std::unique_ptr<Stage>> stage = schema.factory({sc->name, sc->params, base_dir});
    if (!stage.ok())
      Fail(params ? params : stage_node, fmt::format("{}: {}", where, stage.status().message()));
    sc->stage = std::move(stage.value());
  }
}

StageConfig ParseStage(const YAML::Node& n, const std::string& base_dir) {
  CheckKeys(n, "a stage", SchemaKeys("/properties/stages/items/properties"));
  StageConfig sc;
  sc.mark = ToMark(n.Mark());
  if (!n["name"]) Fail(n, "stage needs a 'name'");
  sc.name = Str(n["name"], "stage name");
  if (!n["type"]) Fail(n, fmt::format("stage '{}' needs a 'type'", sc.name));
  sc.type = Str(n["type"], "stage type");
  sc.schema = Registry::Get().Find(sc.type);
  if (!sc.schema)
    Fail(n["type"], fmt::format("unknown stage type '{}'; known types: {}", sc.type,
                                fmt::join(Registry::Get().Types(), ", ")));
  if (sc.schema->kind == StageKind::kField) {
    if (n["inputs"])
      Fail(n["inputs"],
           fmt::format("stage '{}' ({}) reads a source field: use 'field:', not 'inputs:'", sc.name,
                       sc.type));
    if (!n["field"])
      Fail(n, fmt::format("stage '{}' ({}) needs a 'field' naming the source field it reads",
                          sc.name, sc.type));
    sc.field = Str(n["field"], "field");
  } else {
    if (n["field"])
      Fail(n["field"],
           fmt::format("stage '{}' ({}) takes 'inputs:', not 'field:'", sc.name, sc.type));
    if (!n["inputs"] || !n["inputs"].IsSequence() || n["inputs"].size() == 0)
      Fail(n["inputs"] ? n["inputs"] : n,
           fmt::format("stage '{}' ({}) needs 'inputs:', a list of stage names", sc.name, sc.type));
    for (const auto& i : n["inputs"]) sc.inputs.push_back(Str(i, "input"));
  }
  if (n["workers"] && n["workers"].IsScalar() && n["workers"].Scalar() == "auto")
    sc.workers_auto = true;
  else if (n["workers"]) {
    const int64_t w = Scalar<int64_t>(n["workers"], "workers", "an integer or auto");
    if (w < 1) Fail(n["workers"], fmt::format("workers must be at least 1, got {}", w));
    if (w > 4096) Fail(n["workers"], fmt::format("workers must be at most 4096, got {}", w));
    sc.workers = static_cast<int>(w);
  }
  if (sc.schema->kind == StageKind::kBatch && (sc.workers != 1 || sc.workers_auto))
    Fail(n["workers"], "a batch stage runs on one thread; remove 'workers'");
  if (n["queue"]) sc.queue = static_cast<int>(IntAtLeast(n["queue"], "queue", 1));
  if (n["placement"]) sc.placement = ParsePlacement(n["placement"], "placement");
  ParseStageParams(&sc, n, base_dir);
  if (const YAML::Node& c = n["cache"]) {
    if (!c.IsMap()) Fail(c, "cache must be a mapping {max_bytes}, e.g. cache: {max_bytes: 16G}");
    CheckKeys(c, "cache", SchemaKeys("/properties/stages/items/properties/cache/properties"));
    if (sc.schema->kind == StageKind::kBatch)
      Fail(c, "a batch stage keeps no per-sample outputs: put 'cache' on the stages it joins");
    if (sc.stage) {
      const WhyNot why = sc.stage->WhyNotCacheable();
      if (why && !sc.stage->OwnCache())
        Fail(c, fmt::format("stage '{}' ({}) cannot be cached: {}", sc.name, sc.type, *why));
    }
    sc.cache = true;
    sc.cache_mark = ToMark(c.Mark());
    if (c["max_bytes"]) sc.cache_max_bytes = ByteSize(c["max_bytes"], "cache.max_bytes");
    if (const YAML::Node& d = c["disk"]) {
      if (!d.IsMap() || !d["dir"] || !d["max_bytes"])
        Fail(d, "cache.disk needs a 'dir' (a folder on local disk) and 'max_bytes' (like 200G)");
      CheckKeys(d, "cache.disk",
                SchemaKeys("/properties/stages/items/properties/cache/properties/disk/properties"));
      sc.cache_disk_dir = WritableFolder(d["dir"], "cache.disk.dir", base_dir);
      sc.cache_disk_max_bytes = ByteSize(d["max_bytes"], "cache.disk.max_bytes");
    }
  }
  return sc;
}

// cache_budget: the stages with `cache: {}` share what those with their own max_bytes leave.
void ShareCacheBudget(const YAML::Node& root, const YAML::Node& stages, PipelineConfig* cfg) {
  const YAML::Node& b = root["cache_budget"];
  if (b) cfg->cache_budget = ByteSize(b, "cache_budget");
  uint64_t fixed = 0;
  int shares = 0;
  for (size_t i = 0; i < cfg->stages.size(); ++i) {
    const StageConfig& s = cfg->stages[i];
    if (!s.cache) continue;
    if (s.cache_max_bytes == 0 && !b)
      Fail(stages[i]["cache"],
           fmt::format("stage '{}': cache needs max_bytes (cache: {{max_bytes: 4G}}) or a "
                       "top-level cache_budget to share",
                       s.name));
    fixed += s.cache_max_bytes;
    shares += s.cache_max_bytes == 0;
  }
  if (!b) return;
  if (fixed == 0 && shares == 0)
    Fail(b, "cache_budget is shared by the stages with 'cache:', and there is none");
  if (fixed > cfg->cache_budget || (shares > 0 && fixed == cfg->cache_budget))
    Fail(b, fmt::format("cache_budget {} is less than the stages' own cache max_bytes ({}){}",
                        cfg->cache_budget, fixed,
                        shares ? " with room left for the stages with cache: {}" : ""));
  for (StageConfig& s : cfg->stages)
    if (s.cache && s.cache_max_bytes == 0)
      s.cache_max_bytes = (cfg->cache_budget - fixed) / static_cast<uint64_t>(shares);
}

// Checks names, inputs and cycles over the whole graph.
void ValidateGraph(PipelineConfig* cfg, const YAML::Node& stages) {
  std::map<std::string, int> index;
  for (size_t i = 0; i < cfg->stages.size(); ++i) {
    const StageConfig& s = cfg->stages[i];
    if (!index.emplace(s.name, static_cast<int>(i)).second)
      Fail(stages[i]["name"], fmt::format("duplicate stage name '{}'", s.name));
  }
  for (size_t i = 0; i < cfg->stages.size(); ++i) {
    const StageConfig& s = cfg->stages[i];
    for (size_t k = 0; k < s.inputs.size(); ++k)
      if (!index.count(s.inputs[k]))
        Fail(stages[i]["inputs"][k],
             fmt::format("stage '{}' reads input '{}', but no stage has that name", s.name,
                         s.inputs[k]));
  }
  // Depth-first search for a cycle through `inputs`.
  std::vector<int> state(cfg->stages.size(), 0);  // 0 new, 1 on stack, 2 done
  std::vector<std::string> path;
  std::function<void(int)> visit = [&](int i) {
    state[i] = 1;
    path.push_back(cfg->stages[i].name);
    for (const std::string& in : cfg->stages[i].inputs) {
      int j = index[in];
      if (state[j] == 1) {
        path.push_back(in);
        Fail(stages[i], fmt::format("the stages form a cycle: {}", fmt::join(path, " -> ")));
      }
      if (state[j] == 0) visit(j);
    }
    path.pop_back();
    state[i] = 2;
  };
  for (size_t i = 0; i < cfg->stages.size(); ++i)
    if (state[i] == 0) visit(static_cast<int>(i));

  std::vector<int> batches;
  for (size_t i = 0; i < cfg->stages.size(); ++i)
    if (cfg->stages[i].schema->kind == StageKind::kBatch) batches.push_back(static_cast<int>(i));
  if (batches.size() != 1)
    Fail(stages, fmt::format("a pipeline needs exactly one batch stage, found {}", batches.size()));
  cfg->batch_stage = batches[0];
  const StageConfig& batch = cfg->stages[batches[0]];
  for (size_t k = 0; k < batch.inputs.size(); ++k)
    if (cfg->stages[index[batch.inputs[k]]].schema->kind != StageKind::kField)
      Fail(stages[batches[0]]["inputs"][k], "a batch stage's inputs must be processing stages");
  for (size_t i = 0; i < cfg->stages.size(); ++i) {
    const StageConfig& s = cfg->stages[i];
    if (s.schema->kind == StageKind::kField &&
        std::find(batch.inputs.begin(), batch.inputs.end(), s.name) == batch.inputs.end())
      Fail(stages[i],
           fmt::format(
               "the output of stage '{}' is not used: add it to the inputs of batch stage '{}'",
               s.name, batch.name));
  }
  cfg->batch_size = batch.params.GetInt("batch_size");
  cfg->drop_last = batch.params.GetBool("drop_last");
  for (size_t i = 0; i < cfg->stages.size(); ++i) {
    const StageConfig& s = cfg->stages[i];
    if (s.type != "text" || !s.params.GetBool("pack")) continue;
    if (batch.inputs.size() != 1)
      Fail(stages[i], fmt::format("stage '{}' packs its samples into rows (pack: true), so it must "
                                  "be the only input of batch stage '{}'",
                                  s.name, batch.name));
    cfg->packed_stage = static_cast<int>(i);
    cfg->packing = {s.params.GetInt("max_len"), static_cast<int32_t>(s.params.GetInt("pad_id"))};
  }
  if (cfg->batch_size < 1) Fail(stages[batches[0]], "batch_size must be at least 1");
  cfg->max_tokens = batch.params.GetInt("max_tokens");
  cfg->max_patches = batch.params.GetInt("max_patches");
  if (cfg->max_tokens < 0 || cfg->max_patches < 0 || cfg->max_tokens > UINT32_MAX ||
      cfg->max_patches > UINT32_MAX)
    Fail(stages[batches[0]], "max_tokens and max_patches must be in 0..4294967295 (0: none)");
  if (cfg->budgeted()) {
    if (cfg->packed_stage >= 0)
      Fail(stages[batches[0]],
           "max_tokens/max_patches cannot go with a text stage's pack: true (packing fills "
           "fixed rows already)");
    if (cfg->drop_last)
      Fail(stages[batches[0]], "drop_last has no meaning with max_tokens/max_patches");
    if (cfg->source.shuffle_window > 0)
      Fail(stages[batches[0]],
           "token budgets (max_tokens, max_patches) need a permutation order: they are not "
           "available with source.shuffle_window (remote shards) yet");
    for (const SourceConfig& s : cfg->sources)
      if (s.shuffle_window > 0)  // webdataset and parquet sources only (checked above)
        Fail(stages[batches[0]],
             fmt::format("token budgets (max_tokens, max_patches) need a permutation order: "
                         "source '{}' is read in shard windows (shuffle_window: {}){}",
                         s.name, s.shuffle_window,
                         s.remote ? ", as remote shards must be: mix it without token budgets"
                                  : ": give it shuffle_window: 0"));
    // Each budget must count something.
    bool tokens = false, patches = false;
    for (const std::string& in : batch.inputs) {
      const Stage::CostOutputs c = cfg->stages[index[in]].stage->Costs();
      tokens |= !c.tokens.empty();
      patches |= !c.patches.empty();
    }
    if (cfg->max_tokens > 0 && !tokens)
      Fail(stages[batches[0]]["params"]["max_tokens"],
           "max_tokens: no input of this batch stage has text tokens (a text or qwen_chat stage)");
    if (cfg->max_patches > 0 && !patches)
      Fail(stages[batches[0]]["params"]["max_patches"],
           "max_patches: no input of this batch stage has vision patches (qwen_vision, "
           "qwen_video)");
  }
  // Every tensor name must be unique across stages: they share one tensor table.
  std::set<std::string> tensor_names;
  for (const std::string& in : batch.inputs)
    for (const TensorSpec& t : cfg->stages[index[in]].stage->OutputSpecs())
      if (!tensor_names.insert(t.name).second)
        Fail(stages[index[in]], fmt::format("two stages produce a tensor named '{}'", t.name));
}

// `metrics:` {listen: PORT, HOST:PORT or [IPV6]:PORT}.
void ParseMetrics(const YAML::Node& m, PipelineConfig* cfg) {
  CheckKeys(m, "metrics", SchemaKeys("/properties/metrics/properties"));
  if (m["listen"]) {
    cfg->metrics_listen = Str(m["listen"], "metrics.listen");
    cfg->metrics_mark = {m["listen"].Mark().line + 1, m["listen"].Mark().column + 1};
    // PORT, HOST:PORT or [IPV6]:PORT
    const std::string& l = cfg->metrics_listen;
    size_t colon = l.rfind(':');
    std::string host = colon == std::string::npos ? "" : l.substr(0, colon);
    std::string port = colon == std::string::npos ? l : l.substr(colon + 1);
    bool port_ok = !port.empty() && port.size() <= 5 &&
                   port.find_first_not_of("0123456789") == std::string::npos &&
                   std::stoi(port) >= 1 && std::stoi(port) <= 65535;
    bool host_ok = colon == std::string::npos ||
                   (!host.empty() && (host.front() == '[') == (host.back() == ']') &&
                    (host.front() == '[' || host.find(':') == std::string::npos));
    if (!port_ok || !host_ok)
      Fail(m["listen"], fmt::format("metrics.listen must be PORT, HOST:PORT or [IPV6]:PORT "
                                    "(e.g. 127.0.0.1:9464), got '{}'",
                                    l));
  }
}

// `faults:` (tests of the profile's diagnosis): the stage, a read delay, a leak per item.
void ParseFaults(const YAML::Node& f, PipelineConfig* cfg) {
  CheckKeys(f, "faults", SchemaKeys("/properties/faults/properties"));
  cfg->faults.mark = ToMark(f.Mark());
  if (!f["stage"]) Fail(f, "faults needs a 'stage': the stage to inject them into");
  cfg->faults.stage = Str(f["stage"], "faults.stage");
  auto it = std::find_if(cfg->stages.begin(), cfg->stages.end(),
                         [&](const StageConfig& s) { return s.name == cfg->faults.stage; });
  if (it == cfg->stages.end() || it->field.empty())
    Fail(f["stage"], fmt::format("faults.stage: '{}' is not a stage that reads a sample field",
                                 cfg->faults.stage));
  if (f["read_delay_ms"]) {
    cfg->faults.read_delay_ms =
        static_cast<int>(IntAtLeast(f["read_delay_ms"], "faults.read_delay_ms", 0));
    if (cfg->faults.read_delay_ms > 60000)
      Fail(f["read_delay_ms"], "faults.read_delay_ms must be at most 60000");
  }
  if (f["leak_bytes_per_item"]) {
    cfg->faults.leak_bytes_per_item =
        IntAtLeast(f["leak_bytes_per_item"], "faults.leak_bytes_per_item", 0);
    if (cfg->faults.leak_bytes_per_item > (1 << 30))
      Fail(f["leak_bytes_per_item"], "faults.leak_bytes_per_item must be at most 1 GiB");
  }
}

// An epoch's samples at most (draw numbers, epoch x samples, stay far inside 64 bits).
constexpr uint64_t kMaxMixEpoch = 1'000'000'000'000;

// `sources:` and `mix:` (source/mixture.h): cfg->source gets the order's settings, type "mix".
void ParseMixture(const YAML::Node& list, const YAML::Node& mix, PipelineConfig* cfg) {
  if (!list.IsSequence() || list.size() == 0)
    Fail(list, "sources must be a list of sources, each with a name");
  SourceConfig& order = cfg->source;
  order.type = "mix";
  order.shuffle = true;
  if (mix) {
    CheckKeys(mix, "mix", SchemaKeys("/properties/mix/properties"));
    if (mix["mode"]) {
      cfg->mix.mode = Str(mix["mode"], "mix.mode");
      if (cfg->mix.mode != "weighted" && cfg->mix.mode != "epochs")
        Fail(mix["mode"],
             fmt::format("mix.mode must be weighted or epochs, not '{}'", cfg->mix.mode));
    }
    if (mix["seed"]) order.seed = static_cast<uint64_t>(IntAtLeast(mix["seed"], "mix.seed", 0));
    if (mix["shuffle"]) order.shuffle = Bool(mix["shuffle"], "mix.shuffle");
    if (mix["epochs"]) order.epochs = static_cast<int>(IntAtLeast(mix["epochs"], "mix.epochs", 0));
    if (mix["samples_per_epoch"]) {
      if (cfg->mix.mode != "weighted")
        Fail(mix["samples_per_epoch"],
             "mix.samples_per_epoch is for mode weighted (mode epochs: each source's repeat x "
             "its size)");
      cfg->mix.samples_per_epoch =
          static_cast<uint64_t>(IntAtLeast(mix["samples_per_epoch"], "mix.samples_per_epoch", 1));
      if (cfg->mix.samples_per_epoch > kMaxMixEpoch)
        Fail(mix["samples_per_epoch"],
             fmt::format("mix.samples_per_epoch must be at most {}", kMaxMixEpoch));
    }
  }
  ParseNodeShare(mix ? mix : YAML::Node(YAML::NodeType::Map), "mix", &order);
  const bool weighted = cfg->mix.mode == "weighted";
  std::map<std::string, std::string> path_of;  // a source's files -> its name
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node n = list[i];
    SourceConfig s = ParseSource(n, cfg->base_dir, /*in_mix=*/true);
    if (!n["name"]) Fail(n, "each source of a mixture needs a 'name' (status and metrics use it)");
    s.name = Str(n["name"], "the source's name");
    for (const SourceConfig& other : cfg->sources)
      if (other.name == s.name) Fail(n["name"], fmt::format("two sources are named '{}'", s.name));
    // The same files by another name or through a symlink are the same source.
    std::error_code ec;
    const std::string files =
        s.remote ? s.path : std::filesystem::weakly_canonical(s.path, ec).string();
    if (auto [it, fresh] = path_of.emplace(ec ? s.path : files, s.name); !fresh)
      Fail(n["path"], fmt::format("sources '{}' and '{}' read the same files ({}): give one "
                                  "source, with the share of both",
                                  it->second, s.name, s.path));
    const char* share = weighted ? "weight" : "repeat";
    if (n[weighted ? "repeat" : "weight"])
      Fail(n[weighted ? "repeat" : "weight"],
           fmt::format("mix.mode {} gives each source a {}, not a {}", cfg->mix.mode, share,
                       weighted ? "repeat" : "weight"));
    if (weighted && !n["weight"])
      Fail(n, fmt::format("source '{}' needs a weight (mix.mode weighted): its share of the "
                          "stream, in proportion to the others'",
                          s.name));
    double& value = weighted ? s.weight : s.repeat;
    value = 1;  // epochs mode: each sample once an epoch
    if (n[share]) value = Float(n[share], fmt::format("the {} of source '{}'", share, s.name));
    if (!(value > 0 && value <= (weighted ? 1e12 : 1e6)))
      Fail(n[share], fmt::format("the {} of source '{}' must be above 0 and at most {}", share,
                                 s.name, weighted ? "1e12" : "1e6"));
    // The source's own order: the mix's, unless it says otherwise (its seed is the mix's and
    // its name's, so that two sources never share a permutation).
    if (!n["shuffle"]) s.shuffle = order.shuffle;
    if (!n["seed"]) s.seed = HashString(s.name, order.seed);
    cfg->sources.push_back(std::move(s));
  }
  order.max_bytes = 0;
  for (const SourceConfig& s : cfg->sources)
    order.max_bytes = std::max(order.max_bytes, s.max_bytes);
  order.path = cfg->sources[0].path;  // for messages that name one
}

PipelineConfig ParseRoot(const YAML::Node& root, const std::string& file) {
  PipelineConfig cfg;
  cfg.file = file;
  cfg.base_dir = std::filesystem::path(file).parent_path().string();
  if (cfg.base_dir.empty()) cfg.base_dir = ".";
  CheckKeys(root, "the pipeline config", SchemaKeys("/properties"));
  if (root["pipeline"]) cfg.name = Str(root["pipeline"], "pipeline");
  if (root["source"] && root["sources"])
    Fail(root["sources"], "give either 'source' (one) or 'sources' (a mixture), not both");
  if (root["mix"] && !root["sources"])
    Fail(root["mix"], "'mix' is for a mixture of 'sources'; with one 'source' leave it out");
  if (root["sources"])
    ParseMixture(root["sources"], root["mix"], &cfg);
  else if (root["source"])
    cfg.source = ParseSource(root["source"], cfg.base_dir);
  else
    Fail(root, "the config needs a 'source' (or 'sources', a mixture)");
  if (IsAuto(root["consumers"]))
    cfg.consumers_auto = true;  // one until the first trainer declares its job
  else if (root["consumers"])
    cfg.consumers = static_cast<int>(IntAtLeast(root["consumers"], "consumers", 1));
  if (cfg.consumers > kMaxConsumers)
    Fail(root["consumers"], fmt::format("consumers must be at most {}", kMaxConsumers));
  if (IsAuto(root["replicas"])) {
    if (!cfg.consumers_auto)
      Fail(root["replicas"],
           "replicas: auto takes the group size the trainers declare with their job "
           "($MMFEED_REPLICAS), and so needs consumers: auto; with a fixed consumers: N, give "
           "replicas: k (the tensor/context-parallel size)");
    cfg.replicas_auto = true;  // one until the first trainer declares its job
  } else if (root["replicas"]) {
    cfg.replicas = static_cast<int>(IntAtLeast(root["replicas"], "replicas", 1));
    if (cfg.replicas > kMaxConsumers)
      Fail(root["replicas"], fmt::format("replicas must be at most {}", kMaxConsumers));
    if (!cfg.consumers_auto && cfg.consumers % cfg.replicas != 0)
      Fail(root["replicas"],
           fmt::format("consumers: {} is not a multiple of replicas: {} (each group of {} "
                       "consecutive trainer ranks reads one stream): give consumers as the "
                       "number of trainer processes on the node",
                       cfg.consumers, cfg.replicas, cfg.replicas));
    if (!cfg.consumers_auto) cfg.consumers /= cfg.replicas;  // auto: one stream until adopted
  }
  if (root["on_error"]) {
    std::string p = Str(root["on_error"], "on_error");
    if (p == "skip")
      cfg.on_error = ErrorPolicy::kSkip;
    else if (p == "fail")
      cfg.on_error = ErrorPolicy::kFail;
    else
      Fail(root["on_error"], fmt::format("on_error must be skip or fail, got '{}'", p));
  }
  if (root["placement"]) cfg.placement = ParsePlacement(root["placement"], "placement");
  if (const YAML::Node& roots = root["data_roots"]) {
    if (roots.IsScalar() && roots.Scalar() == "any") {
      cfg.data_roots_any = true;
    } else if (roots.IsSequence()) {
      for (const auto& r : roots) {
        std::string dir = ResolvePath(cfg.base_dir, Str(r, "data_roots"));
        std::error_code ec;
        if (!std::filesystem::is_directory(dir, ec))
          Fail(r, fmt::format("data_roots: '{}' is not a folder", dir));
        cfg.data_roots.push_back(dir);
      }
    } else {
      Fail(roots,
           fmt::format("data_roots must be a list of folders or 'any', got {}", Describe(roots)));
    }
  }
  if (root["output"]) {
    const YAML::Node& o = root["output"];
    CheckKeys(o, "output", SchemaKeys("/properties/output/properties"));
    if (o["ring_slots"])
      cfg.ring_slots = static_cast<int>(IntAtLeast(o["ring_slots"], "output.ring_slots", 2));
    if (cfg.ring_slots > 496)
      Fail(o["ring_slots"],
           "output.ring_slots must be at most 496 (the ring's control area is one page)");
  }
  if (root["sample_timeout_s"]) {
    const YAML::Node& t = root["sample_timeout_s"];
    cfg.sample_timeout_s = Scalar<double>(t, "sample_timeout_s", "a number of seconds");
    if (!(cfg.sample_timeout_s >= 0 && cfg.sample_timeout_s <= 86400))
      Fail(t, "sample_timeout_s must be between 0 (no limit) and 86400 seconds");
  }
  if (root["metrics"]) ParseMetrics(root["metrics"], &cfg);
  const YAML::Node& stages = root["stages"];
  if (!stages || !stages.IsSequence() || stages.size() == 0)
    Fail(stages ? stages : root, "the config needs 'stages', a list of stages");
  for (const auto& s : stages) {
    cfg.stages.push_back(ParseStage(s, cfg.base_dir));
    if (cfg.stages.back().placement.numa_node < 0) {
      bool strict = cfg.stages.back().placement.strict;
      cfg.stages.back().placement = cfg.placement;
      cfg.stages.back().placement.strict |= strict;
    }
  }
  ValidateGraph(&cfg, stages);
  if (const YAML::Node& b = root["cpu_budget"]) {
    const int64_t budget = IntAtLeast(b, "cpu_budget", 1);
    if (budget > 4096) Fail(b, fmt::format("cpu_budget must be at most 4096, got {}", budget));
    cfg.cpu_budget = static_cast<int>(budget);
    cfg.cpu_budget_mark = ToMark(b.Mark());
    int fixed = 0, autos = 0;
    for (const StageConfig& s : cfg.stages) {
      if (s.field.empty()) continue;  // the batch stage: not a worker
      if (s.workers_auto)
        ++autos;
      else
        fixed += s.workers;
    }
    if (autos == 0) Fail(b, "cpu_budget is for stages with 'workers: auto', and there is none");
    if (cfg.cpu_budget < fixed + autos)
      Fail(b, fmt::format("cpu_budget {} is less than the {} fixed worker(s) plus one for each of "
                          "the {} stage(s) with workers: auto",
                          cfg.cpu_budget, fixed, autos));
  }
  ShareCacheBudget(root, stages, &cfg);
  if (const YAML::Node& f = root["faults"]) ParseFaults(f, &cfg);
  return cfg;
}

}  // namespace

Result<PipelineConfig> ParseConfig(const std::string& text, const std::string& file) {
  try {
    YAML::Node root = YAML::Load(text);
    if (!root.IsMap()) throw ConfigError{root.Mark(), "the config must be a YAML mapping"};
    PipelineConfig cfg = ParseRoot(root, file);
    cfg.text = text;
    return cfg;
  } catch (const ConfigError& e) {
    if (e.mark.line < 0) return Status::Invalid(fmt::format("{}: {}", file, e.message));
    return Status::Invalid(
        fmt::format("{}:{}:{}: {}", file, e.mark.line + 1, e.mark.column + 1, e.message));
  } catch (const YAML::Exception& e) {
    return Status::Invalid(
        fmt::format("{}:{}:{}: {}", file, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

Status CheckFaultsAllowed(const PipelineConfig& cfg, bool allowed) {
  if (cfg.faults.stage.empty() || allowed) return Status::Ok();
  return Status::Invalid(fmt::format(
      "{}:{}:{}: faults: injects faults for tests; start mmfeedd with --allow-faults to use it",
      cfg.file, cfg.faults.mark.line, cfg.faults.mark.column));
}

Result<PipelineConfig> LoadConfigFile(const std::string& file) {
  // A config is small: anything else (a folder, a FIFO, /dev/zero, a huge file) is refused
  // before it is read, so that parsing cannot exhaust memory.
  // A file that cannot be opened is named by its absolute path, with the system's reason and
  // whether its folder exists: "pipeline.yaml" alone does not say where the daemon looked.
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(file, ec).lexically_normal();
  const std::string where = ec ? file : abs.string();
  if (const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY); fd < 0) {
    const int e = errno;
    std::string hint;
    if (e == ENOENT)
      hint =
          std::filesystem::is_directory(abs.parent_path(), ec)
              ? fmt::format("; the folder {} exists, the file does not", abs.parent_path().string())
              : fmt::format("; the folder {} does not exist", abs.parent_path().string());
    else if (e == EACCES)
      hint = fmt::format("; the daemon runs as uid {}", ::getuid());
    const std::string msg = fmt::format("cannot open config file {}: {} (errno {}){}", where,
                                        std::strerror(e), e, hint);
    return e == ENOENT ? Status::NotFound(msg) : Status::Io(msg);
  } else {
    ::close(fd);
  }
  FieldValue f{FieldValue::Kind::kPath, file};
  std::string text;
  Result<std::string_view> bytes = FieldBytes(f, &text, kMaxConfigBytes);
  if (!bytes.ok()) {
    const std::string msg = bytes.status().message();
    // FieldBytes names the path as given: name the absolute one.
    return Status::Invalid(
        fmt::format("config file {}: {}", where,
                    msg.rfind(file + ": ", 0) == 0 ? msg.substr(file.size() + 2) : msg));
  }
  return ParseConfig(text, file);
}

void PipelineConfig::ForgetShape() {
  if (consumers_auto) consumers = 1;
  if (replicas_auto) replicas = 1;
  if (source.node_auto) {
    source.node_rank = 0;
    source.num_nodes = 1;
  }
}

Status PipelineConfig::AdoptShape(int local_world_size, int node_rank, int num_nodes,
                                  int declared_replicas) {
  if (!replicas_auto && declared_replicas && declared_replicas != replicas)
    return Status::Invalid(fmt::format(
        "the job declares groups of {} ranks receiving the same batches ($MMFEED_REPLICAS), the "
        "config replicas: {}: set replicas: {} (or auto) in {}, or declare {}",
        declared_replicas, replicas, declared_replicas, file, replicas));
  const int group = replicas_auto ? std::max(declared_replicas, 1) : replicas;
  if (consumers_auto) {
    if (local_world_size > kMaxConsumers)
      return Status::Invalid(
          fmt::format("the job runs {} trainers a node; consumers: auto takes "
                      "at most {}",
                      local_world_size, kMaxConsumers));
    if (local_world_size % group != 0)
      return Status::Invalid(fmt::format(
          "the job runs {} trainers a node, not a multiple of replicas: {} (each group of {} "
          "consecutive local ranks reads one stream)",
          local_world_size, group, group));
    consumers = local_world_size / group;
  }
  replicas = group;
  if (source.node_auto) {
    source.node_rank = node_rank;
    source.num_nodes = num_nodes;
  }
  return Status::Ok();
}

}  // namespace mmfeed
