// The pipeline config as a JSON Schema (draft 2020-12), for editors: `mmfeedd --schema` prints
// it, and a config that starts with
//   # yaml-language-server: $schema=/usr/share/doc/mmfeed/config.schema.json
// gets completion, hover docs and checking from the YAML language server. The top-level keys
// mirror engine/config.cc; each stage's `params` come from the stage registry (every type,
// parameter, type, default, choice and doc), so a new parameter is in the schema without
// being written twice. The schema checks shape and types; ParseConfig still checks the rest
// (paths, graph, ranges that depend on other keys) with file:line:col.
#pragma once

#include <nlohmann/json.hpp>

namespace mmfeed {

nlohmann::json ConfigSchema();

}  // namespace mmfeed
