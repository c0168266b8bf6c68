// Builds a registered stage with its default parameters plus overrides, as the YAML loader would.
#pragma once

#include <gtest/gtest.h>

#include <map>

#include "stages/runtime/registry.h"

namespace mmfeed::testing {

inline std::unique_ptr<Stage> MakeStage(const std::string& type, const std::string& name,
                                        const std::map<std::string, ParamValue>& overrides) {
  const StageSchema* schema = Registry::Get().Find(type);
  EXPECT_NE(schema, nullptr);
  StageArgs args;
  args.name = name;
  for (const ParamSpec& p : schema->params)
    if (p.default_value) args.params.Set(p.name, *p.default_value);
  for (const auto& [k, v] : overrides) args.params.Set(k, v);
  Result<std::unique_ptr<Stage>> s = schema->factory(args);
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
  T* As() { return reinterpret_cast<T*>(data.data()); }
};

// Runs one sample through a fresh worker of `stage`.
inline Result<std::vector<Output>> RunStage(const Stage& stage, const SampleContext& ctx, const FieldValue& in) {
  std::vector<Output> outs;
  std::vector<uint8_t*> ptrs;
  for (const TensorSpec& s : stage.OutputSpecs()) outs.push_back({s, std::vector<uint8_t>(s.NumBytes())});
  for (Output& o : outs) ptrs.push_back(o.data.data());
  Status st = stage.NewWorker()->Process(ctx, in, OutputRow(ptrs.data(), ptrs.size()));
  if (!st.ok()) return st;
  return outs;
}

}  // namespace mmfeed::testing
