// StreamCursor: a consumer rank's position in its own stream of batches — the batch it is
// served next. The daemon's pipeline starts ranks from cursors, every ring slot carries the
// cursor after its batch, trainers checkpoint the one they finished, and attach, restart and
// reconnect resume from one. Its JSON form is {"epoch": E, "batch": B, "seq": S}.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "base/status.h"

namespace mmfeed {

struct StreamCursor {
  uint32_t epoch = 0;
  uint64_t batch = 0;  // index of the next batch within the epoch
  uint64_t seq = 0;    // its number in the rank's stream, from 0, across epochs
  bool operator==(const StreamCursor&) const = default;
};

inline nlohmann::json CursorToJson(const StreamCursor& c) {
  return {{"epoch", c.epoch}, {"batch", c.batch}, {"seq", c.seq}};
}

// Needs a non-negative integer "seq"; "epoch" and "batch" are optional (the daemon derives
// them from seq).
inline Result<StreamCursor> CursorFromJson(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("seq") || !j["seq"].is_number_unsigned())
    return Status::Invalid("a cursor is a JSON object with a non-negative integer \"seq\"");
  StreamCursor c;
  c.seq = j["seq"].get<uint64_t>();
  if (j.contains("epoch") && j["epoch"].is_number_unsigned()) c.epoch = j["epoch"].get<uint32_t>();
  if (j.contains("batch") && j["batch"].is_number_unsigned()) c.batch = j["batch"].get<uint64_t>();
  return c;
}

}  // namespace mmfeed
