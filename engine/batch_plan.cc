#include "engine/batch_plan.h"

#include <fmt/format.h>

#include <algorithm>

namespace mmfeed {
namespace {

// The batch stage's inputs' outputs in order; `first` (if not null) gets each input's first.
std::vector<TensorSpec> InputSpecs(const PipelineConfig& cfg, std::vector<size_t>* first) {
  std::vector<TensorSpec> specs;
  for (const std::string& in : cfg.stages[cfg.batch_stage].inputs) {
    if (first) first->push_back(specs.size());
    for (const StageConfig& s : cfg.stages)
      if (s.name == in)
        for (const TensorSpec& t : s.stage->OutputSpecs()) specs.push_back(t);
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

std::vector<TensorSpec> BatchSpecs(const PipelineConfig& cfg) { return InputSpecs(cfg, nullptr); }

std::vector<TensorSpec> PackedTextSpecs(const std::string& name, int64_t max_len) {
  return {{name, DType::kInt32, {max_len}},
          {name + "_lengths", DType::kInt32, {}},
          {name + "_doc_ids", DType::kInt32, {max_len}}};
}

Result<BatchPlan> PlanBatch(const PipelineConfig& cfg) {
  BatchPlan p;
  p.specs = InputSpecs(cfg, &p.first_tensor);
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
  std::vector<uint64_t> tensor_bytes;
  for (const TensorSpec& t : p.slot_specs) tensor_bytes.push_back(t.NumBytes() * cfg.batch_size);
  p.slot = shm::PlanSlot((shm::kMaxIdBytes + 1) * p.max_ids, tensor_bytes);
  const uint64_t stride =
      (p.slot.slot_bytes + shm::kPageBytes - 1) / shm::kPageBytes * shm::kPageBytes;
  p.ring_bytes = shm::kPageBytes + stride * cfg.ring_slots;
  return p;
}

}  // namespace mmfeed
