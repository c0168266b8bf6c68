#include "source/parquet/rows.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <utility>

namespace mmfeed::parquet {
namespace {

using json = nlohmann::ordered_json;

// parquet.thrift's ConvertedType numbers this reader looks at.
enum Converted : int32_t {
  kUtf8 = 0,
  kMap = 1,
  kMapKeyValue = 2,
  kList = 3,
  kEnum = 4,
  kUint8 = 11,
  kUint64 = 14,
  kJson = 19,
};

bool Annotated(const SchemaElement& e, const char* logical, int32_t converted) {
  return e.logical_type == logical || (e.converted_type && *e.converted_type == converted);
}

bool IsText(const SchemaElement& e) {
  return Annotated(e, "STRING", kUtf8) || Annotated(e, "ENUM", kEnum) ||
         Annotated(e, "JSON", kJson);
}

template <typename T>
T Load(std::string_view b) {
  T x;
  std::memcpy(&x, b.data(), sizeof(T));
  return x;
}

// One leaf value as JSON. REQUIRES: `b` is a value of `leaf`'s type (column.h checks sizes).
Result<json> LeafValue(const LeafColumn& leaf, const SchemaElement& e, std::string_view b) {
  const bool is_unsigned =
      e.converted_type && *e.converted_type >= kUint8 && *e.converted_type <= kUint64;
  auto need = [&](size_t n) -> Status {
    return b.size() == n
               ? Status::Ok()
               : Status::Corrupt(fmt::format("a {} value of {} bytes", Name(leaf.type), b.size()));
  };
  switch (leaf.type) {
    case PhysicalType::kBoolean:
      MMFEED_RETURN_IF_ERROR(need(1));
      return json(b[0] != 0);
    case PhysicalType::kInt32:
      MMFEED_RETURN_IF_ERROR(need(4));
      if (is_unsigned) return json(Load<uint32_t>(b));
      return json(Load<int32_t>(b));
    case PhysicalType::kInt64:
      MMFEED_RETURN_IF_ERROR(need(8));
      if (is_unsigned) return json(Load<uint64_t>(b));
      return json(Load<int64_t>(b));
    case PhysicalType::kFloat:
      MMFEED_RETURN_IF_ERROR(need(4));
      return json(Load<float>(b));
    case PhysicalType::kDouble:
      MMFEED_RETURN_IF_ERROR(need(8));
      return json(Load<double>(b));
    case PhysicalType::kByteArray:
      if (IsText(e)) return json(std::string(b));
      [[fallthrough]];
    default:  // INT96, FIXED_LEN_BYTE_ARRAY, binary
      return json::binary(json::binary_t::container_type(b.begin(), b.end()));
  }
}

// What leaf `leaf` says of each row of its top-level column: the nested value with only its
// own leaf in every group (null where it is null, [] where a list is empty).
Status AssembleLeaf(const FileMetaData& m, const LeafColumn& leaf, const ColumnValues& v,
                    std::vector<json>* out) {
  const size_t entries = v.definition.empty() ? v.size() : v.definition.size();
  if (!v.repetition.empty() && v.repetition.size() != entries)
    return Status::Corrupt(
        fmt::format("{} repetition levels for {} definition levels", v.repetition.size(), entries));
  const SchemaElement& last = m.schema[leaf.schema_index];
  const int64_t rows = static_cast<int64_t>(out->size());
  int64_t row = -1;
  size_t vi = 0;
  for (size_t k = 0; k < entries; ++k) {
    const int16_t d = v.definition.empty() ? leaf.max_definition : v.definition[k];
    const int16_t r = v.repetition.empty() ? 0 : v.repetition[k];
    if (r == 0 && ++row >= rows)
      return Status::Corrupt(
          fmt::format("its levels hold more rows than the row group's {}", rows));
    if (row < 0) return Status::Corrupt("its first value continues a row (repetition level > 0)");
    json* cur = &(*out)[static_cast<size_t>(row)];
    int16_t def = 0, rep = 0;
    for (size_t j = 0; j < leaf.elements.size(); ++j) {
      const SchemaElement& e = m.schema[leaf.elements[j]];
      if (e.repetition == Repetition::kOptional && d < ++def) break;  // null here
      if (e.repetition == Repetition::kRepeated) {
        ++def;
        ++rep;
        if (cur->is_null()) *cur = json::array();
        if (!cur->is_array())
          return Status::Corrupt("its levels repeat a value that is not a list");
        if (d < def) break;  // an empty list
        if (rep < r) {
          if (cur->empty()) return Status::Corrupt("a repetition level continues an empty list");
          cur = &cur->back();
        } else {
          cur->push_back(json());
          cur = &cur->back();
        }
      }
      if (j + 1 == leaf.elements.size()) {
        if (vi >= v.size())
          return Status::Corrupt(
              fmt::format("its levels hold more values than its {} values", v.size()));
        MMFEED_ASSIGN_OR_RETURN(*cur, LeafValue(leaf, last, v.value(vi++)));
      } else {
        if (cur->is_null()) *cur = json::object();
        if (!cur->is_object()) return Status::Corrupt("its levels nest a value in a list's place");
        cur = &(*cur)[m.schema[leaf.elements[j + 1]].name];
      }
    }
  }
  if (row + 1 != rows)
    return Status::Corrupt(
        fmt::format("its levels hold {} rows, the row group says {}", row + 1, rows));
  if (vi != v.size())
    return Status::Corrupt(fmt::format("{} values, its levels place {}", v.size(), vi));
  return Status::Ok();
}

// `b`, another leaf's view of the same value, folded into `a`.
Status Merge(json& a, json&& b) {
  if (a.is_null()) {
    a = std::move(b);
    return Status::Ok();
  }
  if (b.is_null()) return Status::Ok();
  if (a.is_object() && b.is_object()) {
    for (auto& [k, v] : b.items()) MMFEED_RETURN_IF_ERROR(Merge(a[k], std::move(v)));
    return Status::Ok();
  }
  if (a.is_array() && b.is_array() && a.size() == b.size()) {
    for (size_t i = 0; i < a.size(); ++i) MMFEED_RETURN_IF_ERROR(Merge(a[i], std::move(b[i])));
    return Status::Ok();
  }
  return Status::Corrupt("its leaf columns disagree on the shape of a value");
}

class Shaper {
 public:
  Shaper(const FileMetaData& m, const SchemaTree& t) : s_(m.schema), t_(t) {}

  // The value of element `el` (not repeated, or one item of a repeated one) as the user sees
  // it: LIST and MAP groups as arrays.
  json Shape(json v, size_t el) const {
    const SchemaElement& e = s_[el];
    if (v.is_null() || e.type) return v;
    const std::vector<size_t>& kids = t_.children[el];
    const bool list = Annotated(e, "LIST", kList);
    const bool map = Annotated(e, "MAP", kMap) || Annotated(e, "MAP", kMapKeyValue);
    if ((list || map) && kids.size() == 1 && s_[kids[0]].repetition == Repetition::kRepeated) {
      const SchemaElement& r = s_[kids[0]];
      json items = v.contains(r.name) ? std::move(v[r.name]) : json::array();
      json out = json::array();
      // The three-level form (a repeated group of one element), else the repeated node is the
      // element (the older forms the specification keeps readable).
      const bool three = list && !r.type && t_.children[kids[0]].size() == 1 && r.name != "array" &&
                         r.name != e.name + "_tuple";
      for (json& item : items) {
        if (three) {
          const size_t element = t_.children[kids[0]][0];
          json inner = item.contains(s_[element].name) ? std::move(item[s_[element].name]) : json();
          out.push_back(Shape(std::move(inner), element));
        } else {
          out.push_back(Shape(std::move(item), kids[0]));
        }
      }
      return out;
    }
    json out = json::object();
    for (size_t c : kids) {
      json cv = v.contains(s_[c].name) ? std::move(v[s_[c].name]) : json();
      out[s_[c].name] = Field(std::move(cv), c);
    }
    return out;
  }

  // Element `el`'s value where it stands: a repeated one's is the array of its items.
  json Field(json v, size_t el) const {
    if (s_[el].repetition != Repetition::kRepeated) return Shape(std::move(v), el);
    json out = json::array();
    if (v.is_array())
      for (json& item : v) out.push_back(Shape(std::move(item), el));
    return out;
  }

 private:
  const std::vector<SchemaElement>& s_;
  const SchemaTree& t_;
};

}  // namespace

SchemaTree::SchemaTree(const FileMetaData& m) : children(m.schema.size()) {
  // Depth first: each group's children follow it, each after the whole subtree of the one
  // before (metadata.cc checked the tree accounts for every element).
  std::vector<std::pair<size_t, int32_t>> open;  // (group, children still to come)
  for (size_t i = 0; i < m.schema.size(); ++i) {
    while (!open.empty() && open.back().second == 0) open.pop_back();
    if (!open.empty()) {
      children[open.back().first].push_back(i);
      --open.back().second;
    }
    if (!m.schema[i].type && m.schema[i].num_children > 0)
      open.emplace_back(i, m.schema[i].num_children);
  }
}

size_t SchemaTree::Top(const FileMetaData& m, const std::string& name) const {
  if (children.empty()) return npos;
  for (size_t c : children[0])
    if (m.schema[c].name == name) return c;
  return npos;
}

Result<std::vector<json>> AssembleColumn(const FileMetaData& m, const SchemaTree& tree, size_t top,
                                         const std::vector<size_t>& leaves,
                                         const std::vector<ColumnValues>& values, int64_t rows,
                                         const std::string& name) {
  // Every row has an entry in each leaf: a row count past a leaf's entries is a lie, refused
  // before anything is made for it.
  for (size_t k = 0; k < leaves.size(); ++k) {
    const ColumnValues& v = values[k];
    const size_t entries = v.definition.empty() ? v.size() : v.definition.size();
    if (rows < 0 || static_cast<uint64_t>(rows) > entries)
      return Status::Corrupt(fmt::format("{}: column '{}': {} entries for the row group's {} rows",
                                         name, fmt::join(m.leaves[leaves[k]].path, "."), entries,
                                         rows));
  }
  std::vector<json> out(static_cast<size_t>(rows));
  for (size_t k = 0; k < leaves.size(); ++k) {
    const LeafColumn& leaf = m.leaves[leaves[k]];
    std::vector<json> one(out.size());
    Status st = AssembleLeaf(m, leaf, values[k], &one);
    for (size_t i = 0; st.ok() && i < out.size(); ++i) st = Merge(out[i], std::move(one[i]));
    if (!st.ok())
      return Status::Corrupt(
          fmt::format("{}: column '{}': {}", name, fmt::join(leaf.path, "."), st.message()));
  }
  const Shaper shaper(m, tree);
  for (json& v : out) v = shaper.Field(std::move(v), top);
  return out;
}

std::string TypeName(const FileMetaData& m, const SchemaTree& tree, size_t el) {
  const SchemaElement& e = m.schema[el];
  std::string t;
  if (e.type) {
    t = Name(*e.type);
    if (!e.logical_type.empty())
      t += " (" + e.logical_type + ")";
    else if (IsText(e))
      t += " (STRING)";
  } else {
    const std::vector<size_t>& kids = tree.children[el];
    const bool list = Annotated(e, "LIST", kList);
    if (list && kids.size() == 1 && m.schema[kids[0]].repetition == Repetition::kRepeated) {
      const std::vector<size_t>& inner = tree.children[kids[0]];
      const bool three = !m.schema[kids[0]].type && inner.size() == 1;
      return "list<" + TypeName(m, tree, three ? inner[0] : kids[0]) + ">";
    }
    std::vector<std::string> fields;
    for (size_t c : kids) fields.push_back(m.schema[c].name + ": " + TypeName(m, tree, c));
    t = fmt::format("struct<{}>", fmt::join(fields, ", "));
  }
  return e.repetition == Repetition::kRepeated ? "repeated " + t : t;
}

}  // namespace mmfeed::parquet
