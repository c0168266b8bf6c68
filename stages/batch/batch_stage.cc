// The `batch` stage: joins its input stages by sample sequence number, restores each consumer
// rank's order and collates batches. It runs inside the pipeline's batch thread
// (stages/runtime/pipeline.cc); this file declares its schema.
#include "stages/runtime/registry.h"

namespace mmfeed {
namespace {

MMFEED_REGISTER_STAGE((StageSchema{
    "batch",
    "join the input stages per sample, restore the deterministic order, collate batches of batch_size",
    StageKind::kBatch,
    /*field_is_path=*/false,
    {
        {"batch_size", ParamType::kInt, std::nullopt, "samples per batch"},
        {"drop_last", ParamType::kBool, false, "drop a short last batch at the end of an epoch"},
    },
    nullptr}));

}  // namespace
}  // namespace mmfeed
