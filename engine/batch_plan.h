// A batch's layout as one value: which tensors a batch holds and in what order, how a ragged
// tensor finds its rows, what a ring slot holds (packed text's rows instead of the samples'),
// and the slot's and ring's size. Made once from a validated config by a pure function, and
// used by the pipeline (where each sample's outputs go), the daemon's ring planner and --check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/tensor.h"
#include "engine/config.h"
#include "shm/ring.h"

namespace mmfeed {

struct BatchPlan {
  // Every tensor a batch's samples fill, per sample, in order: the batch stage's inputs in
  // order, each stage's outputs in order (BatchSpecs); in a mixture each fixed-shape input's
  // `<stage>_present` mask after its outputs, and `source` last.
  std::vector<TensorSpec> specs;
  std::vector<size_t> first_tensor;  // per batch input (a pipeline branch): its first tensor
  // A mixture (PipelineConfig::mixed), whose samples may lack fields (SourceConfig::
  // fields_optional): per batch input, its `<stage>_present` uint8 mask (1: the sample had the
  // stage's field; 0: it did not, and the stage's rows are zeros), or -1 for an input whose
  // outputs are ragged (it reads a missing field as an empty list); and the `source` int32
  // tensor (each row's index in `sources:`), or -1. Packed text has neither.
  std::vector<int> present;
  int source = -1;
  std::vector<int> rows_from;  // per tensor: its rows_from tensor's index, or -1
  std::vector<int> starts_of;  // per tensor: the ragged tensor it holds starts of, or -1
  // What a ring slot holds, per row: `specs`, or for packed text (PipelineConfig::packed_stage)
  // the packed rows' tensors (PackedTextSpecs); batch_size rows of each.
  std::vector<TensorSpec> slot_specs;
  uint64_t max_ids = 0;     // sample ids a slot has room for (shm::kMaxIdBytes each)
  shm::SlotLayout slot;     // one slot
  uint64_t ring_bytes = 0;  // one rank's ring: its header page and ring_slots slots

  // The tensor named `name`: its index in `specs`, or -1.
  int TensorIndex(const std::string& name) const;
  // The batch input whose outputs include tensor `t`.
  size_t InputOf(size_t t) const;
};

// REQUIRES: `cfg` from ParseConfig. Errors name the output whose rows_from or starts_of does
// not fit the pipeline's other outputs.
Result<BatchPlan> PlanBatch(const PipelineConfig& cfg);

// Every tensor of a batch, per sample, in order (BatchPlan::specs).
std::vector<TensorSpec> BatchSpecs(const PipelineConfig& cfg);

// A grid: int32 [n, 3], a [t, h, w] per row (Qwen's image_grid_thw, video_grid_thw).
bool IsGrid(const TensorSpec& s);

// Packed text's tensors (engine/text_packing.h), per row: `name` [max_len],
// `name`_lengths [] and `name`_doc_ids [max_len], all int32.
std::vector<TensorSpec> PackedTextSpecs(const std::string& name, int64_t max_len);

}  // namespace mmfeed
