// StreamCursor: a consumer rank's position in its own stream of batches — the batch it is
// served next. The daemon's pipeline starts ranks from cursors, every ring slot carries the
// cursor after its batch, trainers checkpoint the one they finished, and attach, restart and
// reconnect resume from one. Its JSON form is {"epoch": E, "batch": B, "seq": S}, plus
// "stream" (the stream's tag) and, from clients of a daemon whose order is one global sequence,
// the job's position: "order" and "position" (below).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "base/status.h"

namespace mmfeed {

struct StreamCursor {
  uint32_t epoch = 0;
  uint64_t batch = 0;  // index of the next batch within the epoch
  uint64_t seq = 0;    // its number in the rank's stream, from 0, across epochs
  // The stream the batch before the cursor belongs to (Pipeline::Origin::stream): a daemon
  // refuses to resume a cursor of another stream. 0: not named (not checked).
  uint32_t stream = 0;
  // The job's position, independent of its shape: when every rank has finished the batches
  // before this cursor, the samples dealt are positions [0, position) of epoch `epoch`'s global
  // order, the order tagged `order` (Pipeline::order_tag: the data, seed and shuffle, not the
  // shape). A job restarted at another shape resumes there (docs/reference/control_protocol.md,
  // "Resuming at another shape"). Set by the client from the attach's "position" rule; 0 (no
  // order): not known. Not part of the cursor's identity (operator==).
  uint32_t order = 0;
  uint64_t position = 0;
  // A mixture's global order interleaves its lanes (position g is lane g % lanes' position
  // g / lanes), so its positions count in the lanes of the shape that numbered them (the job's
  // consumer ranks then, over all nodes; shard windows': its nodes, each reading its own part
  // of the window sequence); 0: an order that does not depend on the shape.
  uint32_t lanes = 0;
  // A mixture with a source in shard windows numbers that source's draws node by node, so its
  // positions count in the nodes of that shape too; 0 otherwise.
  uint32_t nodes = 0;
  bool operator==(const StreamCursor& o) const {
    return epoch == o.epoch && batch == o.batch && seq == o.seq && stream == o.stream;
  }
};

inline nlohmann::json CursorToJson(const StreamCursor& c) {
  nlohmann::json j = {{"epoch", c.epoch}, {"batch", c.batch}, {"seq", c.seq}};
  if (c.stream) j["stream"] = c.stream;
  if (c.order) {
    j["order"] = c.order;
    j["position"] = c.position;
    if (c.lanes) j["lanes"] = c.lanes;
    if (c.nodes) j["nodes"] = c.nodes;
  }
  return j;
}

// Needs a non-negative integer "seq"; "epoch" (32 bits) and "batch" are optional (the daemon
// derives them from seq), "stream" too (a 32-bit tag), unless "order" and "position" are given;
// each one given must be in range.
inline Result<StreamCursor> CursorFromJson(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("seq") || !j["seq"].is_number_unsigned())
    return Status::Invalid("a cursor is a JSON object with a non-negative integer \"seq\"");
  StreamCursor c;
  c.seq = j["seq"].get<uint64_t>();
  if (j.contains("epoch")) {
    if (!j["epoch"].is_number_unsigned() || j["epoch"].get<uint64_t>() > UINT32_MAX)
      return Status::Invalid("a cursor's \"epoch\" is a 32-bit unsigned integer");
    c.epoch = j["epoch"].get<uint32_t>();
  }
  if (j.contains("batch")) {
    if (!j["batch"].is_number_unsigned())
      return Status::Invalid("a cursor's \"batch\" is a non-negative integer");
    c.batch = j["batch"].get<uint64_t>();
  }
  if (j.contains("stream")) {
    if (!j["stream"].is_number_unsigned() || j["stream"].get<uint64_t>() > UINT32_MAX)
      return Status::Invalid("a cursor's \"stream\" is a 32-bit unsigned tag");
    c.stream = j["stream"].get<uint32_t>();
  }
  if (j.contains("order") || j.contains("position")) {
    // A position is of one stream's order: without the tag it could be taken for this stream's
    // own seq and skip samples.
    if (!c.stream)
      return Status::Invalid(
          "a cursor with \"order\" and \"position\" names its \"stream\" too (a Batch's "
          "cursor has all three): an edited cursor is not resumed");
    if (!j.contains("order") || !j["order"].is_number_unsigned() ||
        j["order"].get<uint64_t>() > UINT32_MAX || j["order"].get<uint64_t>() == 0 ||
        !j.contains("position") || !j["position"].is_number_unsigned())
      return Status::Invalid(
          "a cursor's \"order\" (a non-zero 32-bit tag) and \"position\" (a non-negative "
          "integer) come together");
    c.order = j["order"].get<uint32_t>();
    c.position = j["position"].get<uint64_t>();
    for (auto [key, count] : {std::pair{"lanes", &c.lanes}, std::pair{"nodes", &c.nodes}}) {
      if (!j.contains(key)) continue;
      if (!j[key].is_number_unsigned() || j[key].get<uint64_t>() > UINT32_MAX ||
          j[key].get<uint64_t>() == 0)
        return Status::Invalid(std::string("a cursor's \"") + key +
                               "\" is a positive 32-bit integer");
      *count = j[key].get<uint32_t>();
    }
  }
  return c;
}

}  // namespace mmfeed
