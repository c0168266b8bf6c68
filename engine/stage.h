// Stage and StageWorker: the interface every processing stage type implements.
//
// A Stage is built once from its config (on the supervisor thread) and is immutable afterwards.
// It creates one StageWorker per worker thread; a worker keeps whatever per-thread state it
// needs (decoder handles, scratch buffers) and is only ever called from its own thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/tensor.h"
#include "source/sample.h"

namespace mmfeed {

// Why something cannot be done; nothing (std::nullopt) when it can.
using WhyNot = std::optional<std::string>;

// A stage's `cache:` for a stage that keeps the deterministic first part of its own work
// (Stage::OwnCache): what it kept for this sample in an earlier epoch, and a way to keep it.
class SampleMemo {
 public:
  virtual ~SampleMemo() = default;
  // The bytes kept for this sample, or null.
  virtual std::shared_ptr<const std::string> Find() = 0;
  // Offers this sample's bytes to the cache (kept if its eviction keeps them); returns them.
  virtual std::shared_ptr<const std::string> Keep(std::string bytes) = 0;
};

// What a worker may know about the sample it processes. Random choices must be drawn from
// Rng(seed, epoch, id, stage name) so they do not depend on the worker that runs the sample.
struct SampleContext {
  uint64_t seed = 0;
  uint32_t epoch = 0;
  std::string_view id;
  std::string_view origin;  // where the sample came from, for error messages
  // What Stage::Inputs() asked for, in its order: the sample's other fields, and other stages'
  // outputs for this sample (each tensor's one-sample bytes, laid out as its TensorSpec says).
  const FieldValue* const* fields = nullptr;
  const uint8_t* const* tensors = nullptr;
  const TensorSpec* const* tensor_specs = nullptr;  // the tensors' shapes
  SampleMemo* memo = nullptr;  // the stage's cache, when it keeps its own (Stage::OwnCache)
};

// Where a worker writes one sample's outputs: out[k] has room for exactly
// OutputSpecs()[k].NumBytes() bytes. In the daemon these point straight into the batch's
// shared-memory slot, so a sample is written once and never copied.
class OutputRow {
 public:
  OutputRow(uint8_t* const* ptrs, size_t count) : ptrs_(ptrs), count_(count) {}
  uint8_t* operator[](size_t k) const { return ptrs_[k]; }
  size_t size() const { return count_; }
  template <typename T>
  T* As(size_t k) const {
    return reinterpret_cast<T*>(ptrs_[k]);
  }

 private:
  uint8_t* const* ptrs_;
  size_t count_;
};

class StageWorker {
 public:
  virtual ~StageWorker() = default;
  // Turns one field into the stage's outputs, written to `out` in the order of
  // Stage::OutputSpecs(). Errors are per-sample (the pipeline applies its on_error policy);
  // after an error the contents of `out` are undefined.
  virtual Status Process(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) = 0;
  // For token-budget batches (engine/budget.h): writes what the outputs will say of
  // the sample's size without the costly work (an image's grid from its header, a text's
  // tokens), i.e. every output but the one Stage::Costs().patches names, whose
  // pointers are null. Its errors are the sample's. Unsupported by default.
  virtual Status Measure(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) {
    (void)ctx, (void)in, (void)out;
    return Status::Unsupported("this stage cannot measure a sample before processing it");
  }
};

class Stage {
 public:
  virtual ~Stage() = default;
  // Per-sample outputs (name, dtype, shape); fixed for the life of the stage so the ring can
  // size its slots up front.
  virtual std::vector<TensorSpec> OutputSpecs() const = 0;
  virtual std::unique_ptr<StageWorker> NewWorker() const = 0;
  // What a worker reads besides its own field: other fields of the sample (the source loads
  // them as it loads `field:`; a sample without one fails), and outputs of other stages for the
  // same sample (by tensor name; the stage then runs on a sample after the stages that make
  // them, e.g. a chat template that needs the image's patch grid). None by default.
  struct Inputs {
    std::vector<std::string> fields, tensors;
  };
  virtual Inputs ExtraInputs() const { return {}; }
  // Figures a stage keeps about its own work, shown in the profile (the video stage: frames
  // decoded per frame sampled, seeks); none by default. Called from any thread.
  virtual std::vector<std::pair<std::string, double>> Metrics() const { return {}; }
  // What token-budget batches count of this stage's outputs: `tokens`, an int32 [] output
  // holding the sample's text tokens; `patches`, a ragged output whose rows are vision patches.
  // Empty names: the stage adds nothing to a budget.
  struct CostOutputs {
    std::string tokens, patches;
  };
  virtual CostOutputs Costs() const { return {}; }
  // Why a `cache:` cannot keep this stage's outputs, or nothing when they are a function of
  // the sample alone (its fields, and the tensors it reads of other such stages): the same in
  // every epoch, so that a later epoch may copy them (engine/sample_cache.h).
  virtual WhyNot WhyNotCacheable() const {
    return "its outputs are not declared the same in every epoch";
  }
  // For a stage whose outputs change per epoch: what a `cache:` keeps of its work instead (it
  // reads and fills SampleContext::memo), and what its outputs then equal; nothing if it keeps
  // none.
  virtual std::optional<std::string> OwnCache() const { return std::nullopt; }
  // What the profile may advise when this stage limits the job on CPU: its own settings that
  // would make each item cheaper, each "key: value (why)", only those not in force already.
  virtual std::vector<std::string> CpuAdvice() const { return {}; }
  // The bytes a `cache:` keeps per sample of this stage: its outputs when they are cacheable and
  // of fixed size, what OwnCache keeps when the stage measures it, else 0 (not known).
  virtual double CacheEntryBytes() const {
    if (WhyNotCacheable()) return 0;
    double bytes = 0;
    for (const TensorSpec& s : OutputSpecs()) {
      if (!s.rows_from.empty()) return 0;  // ragged: its size depends on the sample
      bytes += static_cast<double>(s.NumBytes());
    }
    return bytes;
  }
};

}  // namespace mmfeed
