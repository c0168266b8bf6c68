// StreamState: what --state-dir keeps of the stream the trainers are in, in one file
// (DIR/cursors.json, written atomically by the supervisor's thread every tick it changed):
//
//   {"version": 2, "pipeline": NAME, "fingerprint": FP,
//    "origin": {"epoch": E, "batch": 0, "seq": S, "stream": T, "previous_stream": P,
//               "base": POSITION,               // base: a job resumed at another shape
//               "base_lanes": LANES,            // the lanes base counts in (mixture, windows)
//               "base_nodes": NODES},           // and their nodes (a source in shard windows)
//    "ranks": [CURSOR, ...],                      // each rank's acknowledged cursor
//    "config": {"file": PATH, "text": YAML},      // the config that makes the batches from S on
//    "mix_switches": [{"epoch": E, "position": P, "weights": [W, ...]}, ...]}
//                      // a mixture's weights reloads changed at batch boundaries (the weights
//                      // in force before each; absent when none): MixConfig::switches
//
// The config's own text is kept (not its path alone) because the file may be edited before
// the daemon restarts: a restart on an edited file first continues the stream with the kept
// config, then switches to the edited one as a reload would (docs/design/threads.md, "Restarts").
// Version 1 files (no "version", no "config") are read; they continue only on an unchanged
// config.
//
// Reading validates the structure (types, ranges) and nothing else; whether the cursors fit a
// pipeline is Pipeline::SetStart's business.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/cursor.h"
#include "base/status.h"
#include "source/mixture.h"

namespace mmfeed {

struct StreamState {
  std::string pipeline;
  std::string fingerprint;  // StreamPlan::fingerprint() of the stream from origin
  uint32_t origin_epoch = 0;
  uint64_t origin_seq = 0;
  uint32_t origin_stream = 0, origin_previous = 0;  // StreamOrigin (0: not kept)
  std::vector<StreamCursor> ranks;
  std::string config_file, config_text;  // empty text: a version 1 file
  uint64_t origin_base = 0;              // StreamOrigin::base
  uint32_t origin_lanes = 0;             // StreamOrigin::lanes
  uint32_t origin_nodes = 0;             // StreamOrigin::nodes
  std::vector<MixSwitch> mix_switches;   // MixConfig::switches of the config
};

nlohmann::json StreamStateToJson(const StreamState& s);
// The file's path names the errors.
Result<StreamState> StreamStateFromJson(const nlohmann::json& j, const std::string& path);

// std::nullopt when there is no file. A symlink, a folder, a FIFO, a file over 64 MiB or
// malformed JSON is an error naming the path (and how to start fresh).
Result<std::optional<StreamState>> ReadStreamState(const std::string& path);

}  // namespace mmfeed
