// The `batch` stage: joins its input stages by sample sequence number, restores each consumer
// rank's order and collates batches. It runs inside the pipeline's batch thread
// (engine/pipeline.cc); this file declares its schema.
#include "engine/registry.h"

namespace mmfeed {
namespace {

MMFEED_REGISTER_STAGE((StageSchema{
    "batch",
    "join the input stages per sample, restore the deterministic order, collate batches of "
    "batch_size "
    "samples, or of whole samples within a token/patch budget (every rank the same number per "
    "epoch)",
    StageKind::kBatch,
    /*field_is_path=*/false,
    {
        {"batch_size", ParamType::kInt, std::nullopt,
         "samples per batch (with a budget: the most; the ring holds this many)"},
        {"drop_last", ParamType::kBool, false, "drop a short last batch at the end of an epoch"},
        {"max_tokens", ParamType::kInt, int64_t{0},
         "token budget: whole samples until their text tokens (the text or qwen_chat stage's "
         "<name>_lengths, vision pads included) would pass this; 0: none"},
        {"max_patches", ParamType::kInt, int64_t{0},
         "patch budget: whole samples until their vision patches (qwen_vision, qwen_video) would "
         "pass this; 0: none"},
    },
    nullptr}));

}  // namespace
}  // namespace mmfeed
