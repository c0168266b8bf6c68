// What a config reload changes, and whether the running daemon can apply it (see the
// "Reloading the config" section of docs/design/threads.md).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/config.h"

namespace mmfeed {

struct ConfigChanges {
  // {"stages_added": [names], "stages_removed": [names], "stages_changed": [{"stage", "what"}],
  //  "workers": [{"stage", "from", "to"}], "settings": [names of top-level settings]}
  nlohmann::json json;
  // Non-empty when the change needs a restart (the rings or the stream's batch numbering
  // would change): says which setting, and why.
  std::string needs_restart;
  // Of what decides the order, only a weighted mixture's weights change (a reload may then
  // switch them at a batch boundary: Pipeline::SwitchWeightsAt).
  bool weights_only = false;
  bool empty() const;
  // One line for the log and the reply: "workers of image 2 -> 1; text re-parameterised".
  std::string Summary() const;
};

// Compares two validated configs. Which samples go where (seed, shuffle, the source's data)
// is judged by the pipelines' order_fingerprint, not here.
ConfigChanges DiffConfigs(const PipelineConfig& running, const PipelineConfig& next);

}  // namespace mmfeed
