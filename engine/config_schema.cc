#include "engine/config_schema.h"

#include <map>
#include <mutex>
#include <string>
#include <variant>

#include "engine/config.h"
#include "engine/registry.h"

namespace mmfeed {
namespace {

using json = nlohmann::json;

json Described(json s, const char* doc) {
  s["description"] = doc;
  return s;
}

json Object(json properties, json required = json::array()) {
  json o = {
      {"type", "object"}, {"properties", std::move(properties)}, {"additionalProperties", false}};
  if (!required.empty()) o["required"] = std::move(required);
  return o;
}

// A size: bytes, or a number with a binary unit (engine/config.cc's ByteSize).
json ByteSizeSchema(const std::string& doc) {
  return {{"description", doc + ": bytes, or with a unit (500G, 1.5TiB)"},
          {"anyOf",
           {{{"type", "integer"}, {"minimum", 1}},
            {{"type", "string"}, {"pattern", "^[0-9]+(\\.[0-9]+)?([KMGT](i?B)?)?$"}}}}};
}

json Int(const char* doc, int64_t minimum) {
  return {{"type", "integer"}, {"minimum", minimum}, {"description", doc}};
}

// `s` with its default: the value the parser uses when the key is absent.
json With(json s, json default_value) {
  s["default"] = std::move(default_value);
  return s;
}

// `s` with a default that is not one value (it depends on other keys or the environment), in
// words: "x-default" (an annotation JSON Schema validators ignore; the reference shows it).
json WithDefaultIn(json s, const char* words) {
  s["x-default"] = words;
  return s;
}

// An integer of at least `minimum`, or "auto".
json IntOrAuto(const char* doc, int64_t minimum) {
  return {{"anyOf", {{{"type", "integer"}, {"minimum", minimum}}, {{"const", "auto"}}}},
          {"description", doc}};
}

json ParamValueJson(const ParamValue& v) {
  return std::visit([](const auto& x) { return json(x); }, v);
}

json ParamSchema(const ParamSpec& p) {
  json s;
  auto list = [&](const char* item) {
    s = {{"type", "array"}, {"items", {{"type", item}}}};
    if (p.list_size) s["minItems"] = s["maxItems"] = p.list_size;
  };
  switch (p.type) {
    case ParamType::kBool:
      s = {{"type", "boolean"}};
      break;
    case ParamType::kInt:
      s = {{"type", "integer"}};
      break;
    case ParamType::kFloat:
      s = {{"type", "number"}};
      break;
    case ParamType::kString:
      s = {{"type", "string"}};
      if (!p.choices.empty()) s["enum"] = p.choices;
      break;
    case ParamType::kIntList:
      list("integer");
      break;
    case ParamType::kFloatList:
      list("number");
      break;
  }
  json& number = p.type == ParamType::kIntList || p.type == ParamType::kFloatList ? s["items"] : s;
  if (p.minimum) number["minimum"] = *p.minimum;
  if (p.maximum) number["maximum"] = *p.maximum;
  s["description"] = p.doc;
  if (p.default_value) s["default"] = ParamValueJson(*p.default_value);
  return s;
}

json PlacementSchema() {
  return {{"description",
           "where the threads run: a NUMA node, and strict (refuse more workers than CPUs); "
           "`strict` alone is {strict: true}"},
          {"oneOf",
           {{{"const", "strict"}},
            Object({{"numa_node", Int("the NUMA node whose CPUs (and memory) to use", 0)},
                    {"strict",
                     {{"type", "boolean"},
                      {"default", false},
                      {"description",
                       "refuse more worker threads than usable CPUs (else a "
                       "warning)"}}}})}}};
}

// webdataset: field name -> the member extensions (one, or a list) that provide it.
json FieldsSchema() {
  json extensions = {
      {"oneOf",
       json::array({{{"type", "string"}}, {{"type", "array"}, {"items", {{"type", "string"}}}}})}};
  return {{"type", "object"},
          {"description", "webdataset: field name -> the member extensions that provide it"},
          {"additionalProperties", extensions}};
}

json SourceSchema() {
  return Object(
      {{"type",
        {{"enum", {"manifest", "webdataset", "parquet"}}, {"description", "the kind of source"}}},
       {"path",
        {{"type", "string"},
         {"description",
          "a JSON-lines manifest, tar shards (brace ranges: shard-{000..099}.tar; http://, "
          "https:// or s3:// URLs for object storage), or Parquet files (brace lists and globs: "
          "data/train-*.parquet; or a Hugging Face dataset folder), relative to the config's "
          "folder"}}},
       {"split", With({{"type", "string"},
                       {"description",
                        "parquet, a Hugging Face dataset folder: the split read (its "
                        "data/<split>-*.parquet files)"}},
                      "train")},
       {"row_group_cache_bytes",
        With(ByteSizeSchema("parquet: decoded row groups kept in memory (the least recently used "
                            "dropped first); a row group larger than this decoded is refused"),
             "1G")},
       {"shuffle",
        {{"type", "boolean"},
         {"default", false},
         {"description",
          "a new seeded order every epoch (a Feistel permutation: any position is reached at "
          "once). Off by default for one source, which is then read in the data's own order; a "
          "mixture's `mix:` shuffles by default, as reading each source in file order would "
          "give every epoch the same interleave"}}},
       {"seed", With(Int("the order's seed (with shuffle: true)", 0), 0)},
       {"epochs", With(Int("epochs to run; 0: forever", 0), 1)},
       {"node_rank",
        WithDefaultIn(IntOrAuto("this node's rank among num_nodes (auto: the trainers' job)", 0),
                      "$NODE_RANK, else 0")},
       {"num_nodes",
        WithDefaultIn(IntOrAuto("nodes sharing the data, each reading its own part (auto: the "
                                "trainers' job)",
                                1),
                      "$NUM_NODES, else 1")},
       {"fields",
        {{"description",
          "webdataset: field name -> the member extensions that provide it; manifest: field "
          "name -> the manifest key it is read from; parquet: field name -> the column (or a "
          "path into a struct column: image.bytes) it is read from"},
         {"anyOf",
          {FieldsSchema(), {{"type", "object"}, {"additionalProperties", {{"type", "string"}}}}}}}},
       {"max_bytes",
        With(Int("the largest file (or tar member) a sample field may read, in bytes; a larger "
                 "one fails as too large, named with its size",
                 1),
             256 << 20)},
       {"index",
        {{"enum", {"auto", "on", "off"}},
         {"default", "auto"},
         {"description",
          "on: index the manifest's lines (or each shard's members) once into a file kept in "
          "--state-dir, and read a sample's entry when it is dealt (a start in a fraction of a "
          "second whatever the size); off: parse everything at start; auto: on from 64 MiB"}}},
       {"shuffle_window",
        WithDefaultIn(Int("webdataset: shards read in a seeded order, the samples of each run of "
                          "this many shards shuffled together (0: a permutation of every "
                          "sample); parquet: the same over row groups",
                          0),
                      "8 for remote shards, 0 for local ones")},
       {"prefetch_bytes",
        With(Int("remote: shards held in memory or being fetched, in bytes", 1), 1 << 30)},
       {"fetch_concurrency", With(Int("remote: whole shards fetched at once", 1), 4)},
       {"fetch_retries",
        With(Int("remote: retries per request, with exponential backoff (5xx, resets, stalls)", 0),
             5)},
       {"fetch_timeout_s",
        {{"type", "number"},
         {"minimum", 0.1},
         {"default", 30},
         {"description",
          "remote: a connect or a stalled transfer gives up after this, then retries"}}},
       {"fetch_stall_s",
        {{"type", "number"},
         {"minimum", 1},
         {"maximum", 86400},
         {"default", 30},
         {"description",
          "remote: the store answering no request for this long is reported (status, metrics, "
          "the profile, a trainer's next() that times out); samples wait for it meanwhile, none "
          "is skipped"}}},
       {"max_shard_bytes",
        With(Int("remote: a shard whose HEAD says it is larger is refused before it is read", 1),
             int64_t{64} << 30)},
       {"cache",
        Described(Object({{"dir",
                           {{"type", "string"},
                            {"description", "a folder on local disk, the daemon user's"}}},
                          {"max_bytes", ByteSizeSchema("the most its files take")}}),
                  "remote: fetched shards kept on local disk, chosen by their next use in the "
                  "order (docs/design/remote.md, \"Disk cache\"); none by default")},
       {"s3",
        Described(
            Object({{"endpoint",
                     WithDefaultIn({{"type", "string"}, {"description", "the S3 API's URL"}},
                                   "$AWS_ENDPOINT_URL_S3, else $AWS_ENDPOINT_URL")},
                    {"region", WithDefaultIn({{"type", "string"}, {"description", "the region"}},
                                             "$AWS_REGION, else $AWS_DEFAULT_REGION")},
                    {"credentials_file",
                     WithDefaultIn({{"type", "string"},
                                    {"description",
                                     "credentials, when the AWS_ACCESS_KEY_ID "
                                     "variables are not set"}},
                                   "$AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials")},
                    {"profile", WithDefaultIn({{"type", "string"},
                                               {"description", "the credentials' profile"}},
                                              "$AWS_PROFILE, else default")}}),
            "s3:// paths: where and how requests are signed (SigV4)")}},
      {"type", "path"});
}

// One source of `sources:`: a source's keys but the order's (epochs, the node's share), which
// are the mix's, and a name and a share.
json MixSourceSchema() {
  json s = SourceSchema();
  for (const char* key : {"epochs", "node_rank", "num_nodes"}) s["properties"].erase(key);
  s["properties"]["name"] = {{"type", "string"}, {"description", "the source's name"}};
  s["properties"]["weight"] = {
      {"type", "number"},
      {"exclusiveMinimum", 0},
      {"description", "mix.mode weighted: its share, in proportion to the others'"}};
  s["properties"]["repeat"] = {
      {"type", "number"},
      {"exclusiveMinimum", 0},
      {"default", 1},
      {"description", "mix.mode epochs: draws per epoch as a multiple of its size"}};
  s["required"] = {"type", "path", "name"};
  return s;
}

json MixSchema() {
  return Object(
      {{"mode",
        {{"enum", {"weighted", "epochs"}},
         {"default", "weighted"},
         {"description",
          "weighted: each epoch of samples_per_epoch gives each source its weight's share "
          "exactly; epochs: each source gives repeat x its size every epoch. A mixture's epoch "
          "is not one pass of each source: a source that runs out starts its next pass"}}},
       {"seed", With(Int("the mixture's seed", 0), 0)},
       {"shuffle",
        {{"type", "boolean"},
         {"default", true},
         {"description",
          "shuffle each source's draws and the interleave (true by default, "
          "unlike one source's)"}}},
       {"epochs", With(Int("epochs to run; 0: forever", 0), 1)},
       {"samples_per_epoch", Int("mode weighted: an epoch's samples (default: the sum of the "
                                 "sources' sizes)",
                                 1)},
       {"node_rank",
        WithDefaultIn(IntOrAuto("this node's rank among num_nodes (auto: the trainers' job)", 0),
                      "$NODE_RANK, else 0")},
       {"num_nodes", WithDefaultIn(IntOrAuto("nodes sharing the data (auto: the trainers' job)", 1),
                                   "$NUM_NODES, else 1")}});
}

// One stage: the keys every stage has, and for each registered type its params.
json StageSchemaJson() {
  json types = json::array(), cases = json::array();
  for (const std::string& type : Registry::Get().Types()) {
    const StageSchema* schema = Registry::Get().Find(type);
    types.push_back(type);
    json params = json::object(), required = json::array();
    for (const ParamSpec& p : schema->params) {
      params[p.name] = ParamSchema(p);
      if (!p.default_value) required.push_back(p.name);
    }
    json then = {{"properties", {{"params", Object(params, required)}}}};
    if (!required.empty()) then["required"] = {"params"};
    if (schema->kind == StageKind::kField)
      then["required"].push_back("field");
    else
      then["required"].push_back("inputs");
    cases.push_back(
        {{"if", {{"properties", {{"type", {{"const", type}}}}}, {"required", {"type"}}}},
         {"then", then}});
  }
  json stage = Object(
      {{"name", {{"type", "string"}, {"description", "the stage's name, unique in the graph"}}},
       {"type", {{"enum", types}, {"description", "the stage type (mmfeedd --list-stages)"}}},
       {"field", {{"type", "string"}, {"description", "the source field a stage reads"}}},
       {"inputs",
        {{"type", "array"},
         {"items", {{"type", "string"}}},
         {"minItems", 1},
         {"description", "a batch stage: the stages it joins"}}},
       {"workers",
        {{"oneOf", {{{"type", "integer"}, {"minimum", 1}, {"maximum", 4096}}, {{"const", "auto"}}}},
         {"default", 1},
         {"description",
          "worker threads, or auto (moved between stages within cpu_budget while running)"}}},
       {"queue", WithDefaultIn(Int("mailbox capacity (items waiting for the stage)", 1),
                               "4 x workers, at least 8")},
       {"cache",
        Described(
            Object({{"max_bytes", ByteSizeSchema("the most memory its kept work takes")},
                    {"disk",
                     Described(Object({{"dir",
                                        {{"type", "string"},
                                         {"description", "a folder on local disk for the tier"}}},
                                       {"max_bytes", ByteSizeSchema("the most its files take")}},
                                      {"dir", "max_bytes"}),
                               "a disk tier below the memory: samples memory cannot hold")}}),
            "keep the stage's work per sample so that later epochs copy it instead of working "
            "again, evicting by next use in the order (docs/design/cache.md); `cache: {}` takes "
            "a share of cache_budget; none by default")},
       {"params",
        {{"type", "object"},
         {"description", "the stage type's parameters (below, per type; mmfeedd --list-stages)"}}},
       {"placement", PlacementSchema()}},
      {"name", "type"});
  stage["allOf"] = cases;
  return stage;
}

}  // namespace

json ConfigSchema() {
  json schema = Object(
      {{"pipeline",
        {{"type", "string"}, {"description", "the pipeline's name, for logs and status"}}},
       {"source",
        Described(SourceSchema(),
                  "the data: a manifest or WebDataset shards (or `sources:`, a mixture)")},
       {"sources",
        {{"type", "array"},
         {"minItems", 1},
         {"items", MixSourceSchema()},
         {"description", "a mixture of sources (instead of source), drawn as mix says"}}},
       {"mix", Described(MixSchema(), "with sources: how the mixture is drawn")},
       {"consumers",
        {{"anyOf",
          {{{"type", "integer"}, {"minimum", 1}, {"maximum", kMaxConsumers}}, {{"const", "auto"}}}},
         {"default", 1},
         {"description",
          "trainer ranks on this node; auto: as many as the first trainer's job runs a node"}}},
       {"replicas",
        {{"anyOf",
          {{{"type", "integer"}, {"minimum", 1}, {"maximum", kMaxConsumers}}, {{"const", "auto"}}}},
         {"default", 1},
         {"description",
          "trainer ranks that receive the same batches (a tensor/context-parallel group): ranks "
          "k*g .. k*g+k-1 read stream g from one ring; auto (with consumers: auto): the group "
          "size the trainers declare ($MMFEED_REPLICAS)"}}},
       {"stages",
        {{"type", "array"},
         {"minItems", 1},
         {"items", StageSchemaJson()},
         {"description",
          "the graph: processing stages, each reading a field, and one batch "
          "stage joining them"}}},
       {"output",
        Described(Object({{"ring_slots",
                           {{"type", "integer"},
                            {"minimum", 2},
                            {"maximum", 496},
                            {"default", 8},
                            {"description",
                             "batches each ring holds (made ahead, or held by its trainer): more "
                             "absorb a trainer's jitter, each costs one batch of shared memory "
                             "per ring"}}}}),
                  "the rings batches are published into, one per stream")},
       {"on_error",
        {{"enum", {"skip", "fail"}},
         {"default", "skip"},
         {"description",
          "a sample that fails (a bad file, a timeout): skip counts it with its path and "
          "reason and refills its row; fail stops the daemon with the message"}}},
       {"placement", PlacementSchema()},
       {"data_roots",
        {{"description",
          "folders sample files may be in besides the source's own (docs/guide/data.md, "
          "data_roots); any: "
          "anywhere"},
         {"oneOf", {{{"const", "any"}}, {{"type", "array"}, {"items", {{"type", "string"}}}}}}}},
       {"metrics", Described(Object({{"listen",
                                      {{"type", "string"},
                                       {"description", "PORT, HOST:PORT or [IPV6]:PORT"}}}}),
                             "serve GET /metrics in the Prometheus text format; none by default")},
       {"sample_timeout_s",
        {{"type", "number"},
         {"minimum", 0},
         {"maximum", 86400},
         {"default", 60},
         {"description",
          "a sample taking longer than this in one stage fails as timeout (its row refilled); "
          "0: no limit"}}},
       {"faults",
        Described(Object({{"stage", {{"type", "string"}, {"description", "the stage to slow"}}},
                          {"read_delay_ms", Int("injected delay before each open", 0)},
                          {"leak_bytes_per_item", Int("injected memory kept per item", 0)}},
                         {"stage"}),
                  "for tests only, with mmfeedd --allow-faults: faults injected into a stage")},
       {"cpu_budget",
        WithDefaultIn(
            {{"type", "integer"},
             {"minimum", 1},
             {"maximum", 4096},
             {"description", "worker threads all stages with workers: auto may have together"}},
            "the CPUs of the placement")},
       {"cache_budget", ByteSizeSchema("the stages' caches together; cache: {} takes a share")}},
      {"stages"});
  schema["oneOf"] = {{{"required", {"source"}}}, {{"required", {"sources"}}}};
  schema["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  schema["title"] = "mmfeed pipeline config";
  return schema;
}

const std::vector<std::string>& SchemaKeys(const std::string& pointer) {
  static const json schema = ConfigSchema();
  static std::mutex mu;
  static std::map<std::string, std::vector<std::string>> keys;
  std::lock_guard<std::mutex> lock(mu);
  auto it = keys.find(pointer);
  if (it == keys.end()) {
    std::vector<std::string> names;
    for (const auto& [name, _] : schema.at(json::json_pointer(pointer)).items())
      names.push_back(name);
    it = keys.emplace(pointer, std::move(names)).first;
  }
  return it->second;
}

}  // namespace mmfeed
