// Builds a registered stage with its default parameters plus overrides, as the YAML loader would.
#pragma once

#include <gtest/gtest.h>

#include <map>

#include "engine/registry.h"

namespace mmfeed::testing {

// The stage `type` named `name`, from its schema's defaults and `overrides`: a stage, or the
// factory's error (what a config with those params is refused with).
inline Result<std::unique_ptr<Stage>> BuildStage(
    const std::string& type, const std::string& name,
    const std::map<std::string, ParamValue>& overrides) {
  const StageSchema* schema = Registry::Get().Find(type);
  EXPECT_NE(schema, nullptr);
  if (!schema) return Status::Invalid("no stage type " + type);
  StageArgs args;
  args.name = name;
  for (const ParamSpec& p : schema->params)
    if (p.default_value) args.params.Set(p.name, *p.default_value);
  for (const auto& [k, v] : overrides) args.params.Set(k, v);
  return schema->factory(args);
}

inline std::unique_ptr<Stage> MakeStage(const std::string& type, const std::string& name,
                                        const std::map<std::string, ParamValue>& overrides) {
  Result<std::unique_ptr<Stage>> s = BuildStage(type, name, overrides);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? std::move(s.value()) : nullptr;
}

inline FieldValue PathField(const std::string& path) {
  FieldValue f;
  f.kind = FieldValue::Kind::kPath;
  f.data = path;
  return f;
}

}  // namespace mmfeed::testing

namespace mmfeed::testing {

// One output of a stage run in a test, with its own memory.
struct Output {
  TensorSpec spec;
  std::vector<uint8_t> data;
  template <typename T>
  T* As() {
    return reinterpret_cast<T*>(data.data());
  }
};

// Runs one sample through a fresh worker of `stage`.
inline Result<std::vector<Output>> RunStage(const Stage& stage, const SampleContext& ctx,
                                            const FieldValue& in) {
  std::vector<Output> outs;
  std::vector<uint8_t*> ptrs;
  for (const TensorSpec& s : stage.OutputSpecs())
    outs.push_back({s, std::vector<uint8_t>(s.NumBytes())});
  for (Output& o : outs) ptrs.push_back(o.data.data());
  Status st = stage.NewWorker()->Process(ctx, in, OutputRow(ptrs.data(), ptrs.size()));
  if (!st.ok()) return st;
  return outs;
}

// Measures one sample with a fresh worker of `stage` (StageWorker::Measure): the output
// Stage::Costs().patches names gets no memory and comes back empty.
inline Result<std::vector<Output>> MeasureStage(const Stage& stage, const SampleContext& ctx,
                                                const FieldValue& in) {
  std::vector<Output> outs;
  std::vector<uint8_t*> ptrs;
  const std::string patches = stage.Costs().patches;
  for (const TensorSpec& s : stage.OutputSpecs())
    outs.push_back({s, std::vector<uint8_t>(s.name == patches ? 0 : s.NumBytes())});
  for (Output& o : outs) ptrs.push_back(o.data.empty() ? nullptr : o.data.data());
  Status st = stage.NewWorker()->Measure(ctx, in, OutputRow(ptrs.data(), ptrs.size()));
  if (!st.ok()) return st;
  return outs;
}

}  // namespace mmfeed::testing
