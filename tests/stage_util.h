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
