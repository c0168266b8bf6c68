#include "engine/registry.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace mmfeed {

const char* ParamTypeName(ParamType t) {
  switch (t) {
    case ParamType::kBool:
      return "bool";
    case ParamType::kInt:
      return "int";
    case ParamType::kFloat:
      return "float";
    case ParamType::kString:
      return "string";
    case ParamType::kIntList:
      return "list of int";
    case ParamType::kFloatList:
      return "list of float";
  }
  return "?";
}

void Params::Misread(const std::string& name, bool present) {
  std::fprintf(stderr, "mmfeed: stage parameter '%s' %s\n", name.c_str(),
               present ? "read as another type than its schema declares"
                       : "is not declared in the stage's schema");
  std::abort();
}

Registry& Registry::Get() {
  static Registry registry;
  // The engine's own stage type (engine/collator.cc), there before any other registers.
  [[maybe_unused]] static const bool batch = registry.Add(BatchStageSchema());
  return registry;
}

bool Registry::Add(StageSchema schema) {
  if (schemas_.count(schema.type)) {
    std::fprintf(stderr, "mmfeed: stage type '%s' registered twice\n", schema.type.c_str());
    std::abort();
  }
  std::string type = schema.type;
  schemas_.emplace(type, std::move(schema));
  return true;
}

const StageSchema* Registry::Find(const std::string& type) const {
  auto it = schemas_.find(type);
  return it == schemas_.end() ? nullptr : &it->second;
}

std::vector<std::string> Registry::Types() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : schemas_) out.push_back(k);
  return out;
}

static std::string FormatValue(const ParamValue& v) {
  struct {
    std::string operator()(bool b) { return b ? "true" : "false"; }
    std::string operator()(int64_t i) { return std::to_string(i); }
    std::string operator()(double d) { return fmt::format("{}", d); }
    std::string operator()(const std::string& s) { return s.empty() ? "\"\"" : s; }
    std::string operator()(const std::vector<int64_t>& l) {
      return fmt::format("[{}]", fmt::join(l, ", "));
    }
    std::string operator()(const std::vector<double>& l) {
      return fmt::format("[{}]", fmt::join(l, ", "));
    }
  } visitor;
  return std::visit(visitor, v);
}

std::string Registry::Describe() const {
  std::string out;
  for (const auto& [type, s] : schemas_) {
    out += fmt::format("{} ({}): {}\n", type,
                       s.kind == StageKind::kBatch ? "inputs: [stages]" : "field: NAME", s.doc);
    for (const ParamSpec& p : s.params) {
      std::string type_name = ParamTypeName(p.type);
      if (p.list_size) type_name = fmt::format("{} of {}", type_name, p.list_size);
      if (!p.choices.empty()) type_name = fmt::format("{}", fmt::join(p.choices, "|"));
      out +=
          fmt::format("  {:<14} {:<22} {:<16} {}\n", p.name, type_name,
                      p.default_value ? "= " + FormatValue(*p.default_value) : "(required)", p.doc);
    }
  }
  return out;
}

std::string Params::Canonical() const {
  std::string out;
  for (const auto& [name, v] : values_) {
    out += name + "=";
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                        std::is_same_v<T, std::vector<double>>) {
            for (const auto& e : x) out += fmt::format("{},", e);
          } else {
            out += fmt::format("{}", x);
          }
        },
        v);
    out += ";";
  }
  return out;
}

}  // namespace mmfeed
