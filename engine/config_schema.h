// The pipeline config as a JSON Schema (draft 2020-12), for editors: `mmfeedd --schema` prints
// it, and a config that starts with
//   # yaml-language-server: $schema=/usr/share/doc/mmfeed/config.schema.json
// gets completion, hover docs and checking from the YAML language server.
//
// It is the config's one schema: every key, its type, default, range and description is
// written here once. The parser (engine/config.cc) takes each mapping's allowed keys from it
// (SchemaKeys), the generated reference (docs/reference/config.md) and --list-stages read it,
// and tests compare its defaults and ranges with what the parser does. Each stage's `params`
// come from the stage registry (every type, parameter, type, default, choice and doc). The
// schema checks shape and types; ParseConfig still checks the rest (paths, graph, ranges that
// depend on other keys) with file:line:col.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mmfeed {

nlohmann::json ConfigSchema();

// The keys the schema allows in the mapping at `pointer` (a JSON pointer to its "properties",
// e.g. "/properties/source/properties"), sorted. Built once.
const std::vector<std::string>& SchemaKeys(const std::string& pointer);

}  // namespace mmfeed
