#include "engine/config_schema.h"

#include <string>
#include <variant>

#include "engine/config.h"
#include "engine/registry.h"

namespace mmfeed {
namespace {

using json = nlohmann::json;

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
                    {"strict", {{"type", "boolean"}}}})}}};
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
      {{"type", {{"enum", {"manifest", "webdataset"}}, {"description", "the kind of source"}}},
       {"path",
        {{"type", "string"},
         {"description",
          "a JSON-lines manifest, or tar shards (brace ranges: shard-{000..099}.tar; http://, "
          "https:// or s3:// URLs for object storage), relative to the config's folder"}}},
       {"shuffle", {{"type", "boolean"}, {"default", false}}},
       {"seed", Int("the order's seed", 0)},
       {"epochs", Int("epochs to run; 0: forever", 0)},
       {"node_rank",
        IntOrAuto("this node's rank (default: NODE_RANK, else 0; auto: the trainers' job)", 0)},
       {"num_nodes",
        IntOrAuto("nodes sharing the data (default: NUM_NODES, else 1; auto: the trainers' job)",
                  1)},
       {"fields",
        {{"description",
          "webdataset: field name -> the member extensions that provide it; manifest: field "
          "name -> the manifest key it is read from"},
         {"anyOf",
          {FieldsSchema(), {{"type", "object"}, {"additionalProperties", {{"type", "string"}}}}}}}},
       {"max_bytes", Int("the largest file a sample field may read, in bytes", 1)},
       {"index", {{"enum", {"auto", "on", "off"}}, {"default", "auto"}}},
       {"shuffle_window", Int("webdataset: shards whose samples are shuffled together", 0)},
       {"prefetch_bytes", Int("remote: shards held or being fetched, in bytes", 1)},
       {"fetch_concurrency", Int("remote: shards fetched at once", 1)},
       {"fetch_retries", Int("remote: retries per request", 0)},
       {"fetch_timeout_s", {{"type", "number"}, {"minimum", 0.1}}},
       {"fetch_stall_s",
        {{"type", "number"},
         {"minimum", 1},
         {"maximum", 86400},
         {"default", 30},
         {"description",
          "remote: the store answering no request for this long is reported (status, metrics, "
          "the profile, a trainer's next() that times out); samples wait for it meanwhile, none "
          "is skipped"}}},
       {"max_shard_bytes", Int("remote: a larger shard is refused", 1)},
       {"cache",
        Object({{"dir", {{"type", "string"}, {"description", "remote: a folder on local disk"}}},
                {"max_bytes", ByteSizeSchema("its size")}})},
       {"s3", Object({{"endpoint", {{"type", "string"}}},
                      {"region", {{"type", "string"}}},
                      {"credentials_file", {{"type", "string"}}},
                      {"profile", {{"type", "string"}}}})}},
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
      {{"mode", {{"enum", {"weighted", "epochs"}}, {"default", "weighted"}}},
       {"seed", Int("the mixture's seed", 0)},
       {"shuffle", {{"type", "boolean"}, {"default", true}}},
       {"epochs", Int("epochs to run; 0: forever", 0)},
       {"samples_per_epoch", Int("mode weighted: an epoch's samples (default: the sum of the "
                                 "sources' sizes)",
                                 1)},
       {"node_rank",
        IntOrAuto("this node's rank (default: NODE_RANK, else 0; auto: the trainers' job)", 0)},
       {"num_nodes",
        IntOrAuto("nodes sharing the data (default: NUM_NODES, else 1; auto: the trainers' job)",
                  1)}});
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
         {"description", "worker threads, or auto (moved within cpu_budget while running)"}}},
       {"queue", Int("mailbox capacity; default 4 x workers, at least 8", 1)},
       {"cache",
        Object({{"max_bytes", ByteSizeSchema("the most memory its kept outputs take")},
                {"disk", Object({{"dir",
                                  {{"type", "string"},
                                   {"description", "a folder on local disk for the disk tier"}}},
                                 {"max_bytes", ByteSizeSchema("the most its files take")}},
                                {"dir", "max_bytes"})}})},
       {"params", {{"type", "object"}}},
       {"placement", PlacementSchema()}},
      {"name", "type"});
  stage["allOf"] = cases;
  return stage;
}

}  // namespace

json ConfigSchema() {
  json schema = Object(
      {{"pipeline", {{"type", "string"}, {"description", "the pipeline's name"}}},
       {"source", SourceSchema()},
       {"sources",
        {{"type", "array"},
         {"minItems", 1},
         {"items", MixSourceSchema()},
         {"description", "a mixture of sources (instead of source), drawn as mix says"}}},
       {"mix", MixSchema()},
       {"consumers",
        {{"anyOf",
          {{{"type", "integer"}, {"minimum", 1}, {"maximum", kMaxConsumers}}, {{"const", "auto"}}}},
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
       {"stages", {{"type", "array"}, {"minItems", 1}, {"items", StageSchemaJson()}}},
       {"output",
        Object({{"ring_slots",
                 {{"type", "integer"}, {"minimum", 2}, {"maximum", 496}, {"default", 8}}}})},
       {"on_error", {{"enum", {"skip", "fail"}}, {"default", "skip"}}},
       {"placement", PlacementSchema()},
       {"data_roots",
        {{"description",
          "folders sample files may be in besides the source's own (README, data_roots); any: "
          "anywhere"},
         {"oneOf", {{{"const", "any"}}, {{"type", "array"}, {"items", {{"type", "string"}}}}}}}},
       {"metrics",
        Object(
            {{"listen", {{"type", "string"}, {"description", "PORT, HOST:PORT or [IPV6]:PORT"}}}})},
       {"sample_timeout_s",
        {{"type", "number"}, {"minimum", 0}, {"maximum", 86400}, {"default", 60}}},
       {"faults", Object({{"stage", {{"type", "string"}}},
                          {"read_delay_ms", Int("injected delay before each open", 0)},
                          {"leak_bytes_per_item", Int("injected memory kept per item", 0)}},
                         {"stage"})},
       {"cpu_budget", {{"type", "integer"}, {"minimum", 1}, {"maximum", 4096}}},
       {"cache_budget", ByteSizeSchema("the stages' caches together; cache: {} takes a share")}},
      {"stages"});
  schema["oneOf"] = {{{"required", {"source"}}}, {{"required", {"sources"}}}};
  schema["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  schema["title"] = "mmfeed pipeline config";
  return schema;
}

}  // namespace mmfeed
