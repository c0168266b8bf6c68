#include "engine/batch_plan.h"

#include <fmt/format.h>

#include <algorithm>

namespace mmfeed {
namespace {

// The batch stage's inputs' outputs in order, with a mixture's masks and source column (see
// BatchPlan); `p` gets each input's first tensor, mask and the source column.
std::vector<TensorSpec> InputSpecs(const PipelineConfig& cfg, BatchPlan* p) {
  std::vector<TensorSpec> specs;
  const bool mixed = cfg.mixed() && cfg.packed_stage < 0;
  for (const std::string& in : cfg.stages[cfg.batch_stage].inputs) {
    p->first_tensor.push_back(specs.size());
    p->present.push_back(-1);
    for (const StageConfig& s : cfg.stages) {
      if (s.name != in) continue;
      const std::vector<TensorSpec> outputs = s.stage->OutputSpecs();
      specs.insert(specs.end(), outputs.begin(), outputs.end());
      const bool fixed = std::all_of(outputs.begin(), outputs.end(), [](const TensorSpec& t) {
        return t.rows_from.empty() && t.starts_of.empty();
      });
      if (mixed && fixed) {
        p->present.back() = static_cast<int>(specs.size());
        specs.push_back({in + "_present", DType::kUInt8, {}});
      }
    }
  }
  if (mixed) {
    p->source = static_cast<int>(specs.size());
    specs.push_back({"source", DType::kInt32, {}});
  }
  return specs;
}

}  // namespace

bool IsGrid(const TensorSpec& s) {
  return s.dtype == DType::kInt32 && s.shape.size() == 2 && s.shape[1] == 3;
}

int BatchPlan::TensorIndex(const std::string& name) const {
  for (size_t k = 0; k < specs.size(); ++k)
    if (specs[k].name == name) return static_cast<int>(k);
  return -1;
}

size_t BatchPlan::InputOf(size_t t) const {
  size_t in = 0;
  while (in + 1 < first_tensor.size() && first_tensor[in + 1] <= t) ++in;
  return in;
}

std::vector<TensorSpec> BatchSpecs(const PipelineConfig& cfg) {
  BatchPlan p;
  return InputSpecs(cfg, &p);
}

std::vector<TensorSpec> PackedTextSpecs(const std::string& name, int64_t max_len) {
  return {{name, DType::kInt32, {max_len}},
          {name + "_lengths", DType::kInt32, {}},
          {name + "_doc_ids", DType::kInt32, {max_len}}};
}

Result<BatchPlan> PlanBatch(const PipelineConfig& cfg) {
  BatchPlan p;
  p.specs = InputSpecs(cfg, &p);
  for (size_t k = 0; k < p.specs.size(); ++k)  // names are how trainers find tensors
    for (size_t j = 0; j < k; ++j)
      if (p.specs[j].name == p.specs[k].name)
        return Status::Invalid(fmt::format(
            "two tensors of the batch are named '{}'{}", p.specs[k].name,
            static_cast<int>(k) == p.source || std::count(p.present.begin(), p.present.end(), k)
                ? " (a mixture adds `source` and a `<stage>_present` mask per fixed-shape stage: "
                  "rename the stage or output)"
                : ""));
  for (const TensorSpec& t : p.specs) {  // ragged tensors: where their row counts are
    int from = t.rows_from.empty() ? -1 : p.TensorIndex(t.rows_from);
    if (from >= 0 && p.specs[from].dtype != DType::kInt32) from = -1;
    if (!t.rows_from.empty() && (from < 0 || t.shape.empty()))
      return Status::Invalid(
          fmt::format("output '{}' takes its rows from '{}', which is not "
                      "an int32 output of the pipeline",
                      t.name, t.rows_from));
    p.rows_from.push_back(from);
  }
  for (const TensorSpec& t : p.specs) {  // starts tensors: of which ragged tensor
    int of = t.starts_of.empty() ? -1 : p.TensorIndex(t.starts_of);
    if (of >= 0 && p.rows_from[of] < 0) of = -1;
    // Of a grid: [the most grid rows * the most t + 1]; else two values per sample.
    const bool fits = of >= 0 && (IsGrid(p.specs[of]) ? t.shape.size() == 1 && t.shape[0] >= 2
                                                      : t.shape == std::vector<int64_t>{2});
    if (!t.starts_of.empty() && (!fits || t.dtype != DType::kInt32))
      return Status::Invalid(fmt::format(
          "output '{}' holds the row starts of '{}', which is not a ragged output of the "
          "pipeline (or it is not int32 [2], or of a grid int32 [n])",
          t.name, t.starts_of));
    p.starts_of.push_back(of);
  }
  // The ring slot: every sample id of a batch; a packed batch lists each document it holds, at
  // most one per token (bounded at 64 Ki ids).
  p.slot_specs = p.specs;
  p.max_ids = cfg.batch_size;
  if (cfg.packed_stage >= 0) {
    const StageConfig& packed = cfg.stages[cfg.packed_stage];
    const int64_t max_len = packed.params.GetInt("max_len");
    p.slot_specs = PackedTextSpecs(packed.name, max_len);
    p.max_ids = std::min<uint64_t>(cfg.batch_size * max_len, 1 << 16);
  }
  if (p.slot_specs.size() > shm::kMaxTensors)
    return Status::Invalid(fmt::format(
        "a batch holds at most {} tensors, this one {}{}", shm::kMaxTensors, p.slot_specs.size(),
        p.source >= 0 ? " (a mixture adds `source` and a `<stage>_present` mask per fixed-shape "
                        "stage)"
                      : ""));
  std::vector<uint64_t> tensor_bytes;
  for (const TensorSpec& t : p.slot_specs) tensor_bytes.push_back(t.NumBytes() * cfg.batch_size);
  p.slot = shm::PlanSlot((shm::kMaxIdBytes + 1) * p.max_ids, tensor_bytes);
  const uint64_t stride =
      (p.slot.slot_bytes + shm::kPageBytes - 1) / shm::kPageBytes * shm::kPageBytes;
  p.ring_bytes = shm::kPageBytes + stride * cfg.ring_slots;
  return p;
}

}  // namespace mmfeed
