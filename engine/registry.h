// The stage registry: every stage type declares a schema (parameters with types, defaults and
// docs) and a factory, and registers it with one MMFEED_REGISTER_STAGE line beside its code.
// Registration happens during static initialisation (the stage sources live in an object
// library so the linker keeps them); afterwards the registry is read-only and any thread may
// look types up.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/status.h"
#include "engine/stage.h"

namespace mmfeed {

enum class ParamType { kBool, kInt, kFloat, kString, kIntList, kFloatList };
const char* ParamTypeName(ParamType t);

using ParamValue =
    std::variant<bool, int64_t, double, std::string, std::vector<int64_t>, std::vector<double>>;

struct ParamSpec {
  std::string name;
  ParamType type;
  std::optional<ParamValue> default_value;  // nullopt: required
  std::string doc;
  std::vector<std::string> choices;  // for kString: the allowed values, if restricted
  int list_size = 0;                 // for lists: the required length, 0 = any
  // For numbers and lists of numbers (each element): the range the parser enforces, naming the
  // line, and the schema carries (mmfeedd --schema); nullopt: unbounded on that side.
  std::optional<double> minimum, maximum;
};
// `spec` with the range [lo, hi] (std::nullopt: unbounded).
inline ParamSpec Ranged(ParamSpec spec, std::optional<double> lo, std::optional<double> hi) {
  spec.minimum = lo;
  spec.maximum = hi;
  return spec;
}

// `dtype`, `mean` and `std` of the stages that output pixels: uint8 as decoded, or float32 =
// (pixel/255 - mean) / std, or that rounded to bfloat16.
inline ParamSpec PixelDTypeParam() {
  return {"dtype",
          ParamType::kString,
          std::string("uint8"),
          "uint8 (raw RGB) | float32 (pixel/255, normalized) | bfloat16 (the same, rounded to the "
          "nearest bfloat16)",
          {"uint8", "float32", "bfloat16"}};
}
inline ParamSpec PixelMeanParam() {
  return {"mean",
          ParamType::kFloatList,
          std::vector<double>{0, 0, 0},
          "float32, bfloat16: per-channel mean (of pixel/255)",
          {},
          3};
}
inline ParamSpec PixelStdParam() {
  return {"std",
          ParamType::kFloatList,
          std::vector<double>{1, 1, 1},
          "float32, bfloat16: per-channel std (of pixel/255)",
          {},
          3};
}

// Parameter values after validation; every declared parameter is present (given or default).
// The getters never throw: REQUIRES `name` declared in the stage's schema with the getter's
// type (ParseConfig checked every value against the schema, so a stage reading its own
// parameters meets it); anything else is a programming error, which aborts naming the
// parameter.
class Params {
 public:
  void Set(const std::string& name, ParamValue v) { values_[name] = std::move(v); }
  bool GetBool(const std::string& name) const { return Get<bool>(name); }
  int64_t GetInt(const std::string& name) const { return Get<int64_t>(name); }
  double GetFloat(const std::string& name) const { return Get<double>(name); }
  const std::string& GetString(const std::string& name) const { return Get<std::string>(name); }
  const std::vector<int64_t>& GetIntList(const std::string& name) const {
    return Get<std::vector<int64_t>>(name);
  }
  const std::vector<double>& GetFloatList(const std::string& name) const {
    return Get<std::vector<double>>(name);
  }
  // Every parameter as "name=value;", in name order: equal strings, equal parameters.
  std::string Canonical() const;

 private:
  template <typename T>
  const T& Get(const std::string& name) const {
    auto it = values_.find(name);
    const T* v = it == values_.end() ? nullptr : std::get_if<T>(&it->second);
    if (!v) Misread(name, it != values_.end());
    return *v;
  }
  [[noreturn]] static void Misread(const std::string& name, bool present);

  std::map<std::string, ParamValue> values_;
};

// What a stage's factory gets: its validated parameters and the pipeline-wide settings.
struct StageArgs {
  std::string name;
  Params params;
  std::string base_dir;  // folder of the config file, for relative paths in parameters
};

enum class StageKind {
  kField,  // reads one source field (`field:`), runs on `workers` threads
  kBatch,  // joins other stages (`inputs:`) and collates batches
};

struct StageSchema {
  std::string type;
  std::string doc;
  StageKind kind = StageKind::kField;
  // kField stages: true if a plain string in a manifest names a file to read (image, video,
  // audio), false if it is the value itself (text).
  bool field_is_path = false;
  std::vector<ParamSpec> params;
  // Builds the stage. A returned error is a config error about the stage's `params`.
  std::function<Result<std::unique_ptr<Stage>>(const StageArgs&)> factory;
};

class Registry {
 public:
  static Registry& Get();
  // Returns true; aborts with a message on a duplicate type (a programming error).
  bool Add(StageSchema schema);
  const StageSchema* Find(const std::string& type) const;
  std::vector<std::string> Types() const;
  // Human-readable listing of every type and its parameters (mmfeedd --list-stages).
  std::string Describe() const;

 private:
  std::map<std::string, StageSchema> schemas_;
};

// The `batch` stage's schema: its work is the pipeline's batch thread (engine/collator.cc).
// Registered by Registry::Get itself, so it exists wherever the registry does.
StageSchema BatchStageSchema();

#define MMFEED_CONCAT_INNER(a, b) a##b
#define MMFEED_CONCAT(a, b) MMFEED_CONCAT_INNER(a, b)
// Named by __COUNTER__, not __LINE__: a unity build compiles several stages' files as one source,
// where two registrations may share a line number of their files (GCC numbers an invocation by
// its first line, clang by its last: the clash showed with clang).
#define MMFEED_REGISTER_STAGE(schema_expr)                           \
  static const bool MMFEED_CONCAT(mmfeed_registered_, __COUNTER__) = \
      ::mmfeed::Registry::Get().Add(schema_expr)

}  // namespace mmfeed
