// The Parquet source (`type: parquet`): which files a path names (a glob, a brace list, or a
// Hugging Face dataset folder and its split), which columns the stages' fields read, and a
// row's values as a sample's fields. The reading itself is source/parquet/dataset.h's.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "source/brace.h"
#include "source/catalog.h"

namespace mmfeed {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

// The paths `pattern` matches (glob(3): *, ?, [...]), sorted; none is not an error here.
std::vector<std::string> Glob(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> out;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}

bool HasGlob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// A Hugging Face dataset folder's files of `split`, as the Hub lays them out.
Result<std::vector<std::string>> SplitFiles(const std::string& dir, const std::string& split) {
  static const char* const kLayouts[] = {"data/{}-*.parquet", "data/{}/*.parquet", "{}/*.parquet",
                                         "*/{}-*.parquet", "{}-*.parquet"};
  for (const char* layout : kLayouts) {
    std::vector<std::string> files = Glob(dir + "/" + fmt::format(fmt::runtime(layout), split));
    if (!files.empty()) return files;
  }
  std::set<std::string> splits;  // to name the ones there are
  for (const std::string& f : Glob(dir + "/data/*.parquet")) {
    const std::string name = fs::path(f).filename().string();
    splits.insert(name.substr(0, name.find('-')));
  }
  for (const std::string& f : Glob(dir + "/data/*/*.parquet"))
    splits.insert(fs::path(f).parent_path().filename().string());
  return Status::NotFound(fmt::format(
      "{}: no Parquet files of split '{}' (looked for data/{}-*.parquet, data/{}/*.parquet, "
      "{}/*.parquet and {}-*.parquet){}",
      dir, split, split, split, split, split,
      splits.empty() ? "" : fmt::format("; the splits there: {}", fmt::join(splits, ", "))));
}

// A column's type, in words (parquet::TypeName), is one a field of files takes: bytes, a path
// (a string), an Image or Audio struct<bytes, path>, or a list of those.
bool MediaType(std::string_view t) {
  if (t.rfind("list<", 0) == 0) t.remove_prefix(5);
  return t.rfind("BYTE_ARRAY", 0) == 0 || t.rfind("FIXED_LEN_BYTE_ARRAY", 0) == 0 ||
         (t.rfind("struct<", 0) == 0 && (t.find("bytes: ") != std::string_view::npos ||
                                         t.find("path: ") != std::string_view::npos));
}

std::string Text(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

// One value of field `f` (not a list): bytes, a string (a path for a field of files, resolved
// under `dir`), an Image or Audio struct (its bytes, else its path), a number or a boolean (as
// text). Returns the reason it cannot be.
std::string OneValue(const json& v, const ParquetField& f, const std::string& dir,
                     FieldValue* out) {
  const json* path = nullptr;
  if (v.is_binary()) {
    out->kind = FieldValue::Kind::kBytes;
    out->data.assign(v.get_binary().begin(), v.get_binary().end());
    return "";
  }
  if (v.is_object() && (v.contains("bytes") || v.contains("path"))) {
    const json& bytes = v.contains("bytes") ? v["bytes"] : json();
    if (bytes.is_binary()) return OneValue(bytes, f, dir, out);
    if (v.contains("path") && v["path"].is_string()) path = &v["path"];
    if (!path)
      return fmt::format("field '{}' (column '{}') has neither bytes nor a path", f.name, f.column);
  } else if (v.is_string()) {
    if (!f.path) {
      out->kind = FieldValue::Kind::kText;
      out->data = v.get<std::string>();
      return "";
    }
    path = &v;
  } else if (v.is_number() || v.is_boolean()) {
    out->kind = FieldValue::Kind::kText;
    out->data = Text(v);
    return "";
  } else {
    return fmt::format("field '{}' (column '{}') holds {}, not a value", f.name, f.column,
                       v.type_name());
  }
  if (path->get_ref<const std::string&>().empty())
    return fmt::format("field '{}' (column '{}') has an empty path", f.name, f.column);
  out->kind = FieldValue::Kind::kPath;
  out->data = ResolvePath(dir, path->get<std::string>());
  return "";
}

// A row's value of field `f` as the stages read it: a list of values (a column of lists of
// them), one value, or, for other lists and structs (chat turns: list<struct<role, content>>),
// their JSON text.
std::string ToField(const json& v, const ParquetField& f, const std::string& dir, FieldValue* out) {
  auto simple = [](const json& x) {
    return x.is_binary() || x.is_string() || x.is_number() || x.is_boolean() ||
           (x.is_object() && (x.contains("bytes") || x.contains("path")));
  };
  if (v.is_array() && std::all_of(v.begin(), v.end(), simple)) {
    if (v.size() > kMaxListItems)
      return fmt::format("field '{}' is a list of {} values: at most {} are allowed", f.name,
                         v.size(), kMaxListItems);
    out->kind = FieldValue::Kind::kList;
    out->items.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      std::string reason = OneValue(v[i], f, dir, &out->items[i]);
      if (!reason.empty()) return reason;
    }
    return "";
  }
  if (v.is_array() || (v.is_object() && !simple(v))) {
    out->kind = FieldValue::Kind::kText;
    out->data = Text(v);
    return "";
  }
  return OneValue(v, f, dir, out);
}

}  // namespace

Result<std::vector<std::string>> ParquetFiles(const SourceConfig& source) {
  std::error_code ec;
  if (fs::is_directory(source.path, ec)) return SplitFiles(source.path, source.split);
  MMFEED_ASSIGN_OR_RETURN(const std::vector<std::string> patterns, ExpandBraces(source.path));
  std::vector<std::string> files;
  for (const std::string& p : patterns) {
    if (!HasGlob(p)) {
      if (!fs::is_regular_file(p, ec)) return Status::NotFound(fmt::format("'{}' not found", p));
      files.push_back(p);
      continue;
    }
    std::vector<std::string> matched = Glob(p);
    if (matched.empty()) return Status::NotFound(fmt::format("no file matches '{}'", p));
    files.insert(files.end(), matched.begin(), matched.end());
  }
  return files;
}

Result<Catalog> LoadParquet(const SourceConfig& source, const std::set<std::string>& needed,
                            const std::set<std::string>& path_fields) {
  MMFEED_ASSIGN_OR_RETURN(const std::vector<std::string> files, ParquetFiles(source));
  Catalog cat;
  cat.needed = needed;
  cat.path_fields = path_fields;
  cat.keys = source.keys;
  cat.fields_optional = source.fields_optional;
  parquet::Dataset::Options options;
  options.cache_bytes = source.row_group_cache_bytes;
  auto column_of = [&](const std::string& top) {
    auto it = std::find(options.columns.begin(), options.columns.end(), top);
    if (it != options.columns.end()) return static_cast<size_t>(it - options.columns.begin());
    options.columns.push_back(top);
    return options.columns.size() - 1;
  };
  for (const std::string& name : needed) {
    ParquetField f;
    f.name = name;
    const auto key = source.keys.find(name);
    f.column = key == source.keys.end() ? name : key->second;
    f.path = path_fields.count(name) != 0;
    // "image.bytes": column image, then its key bytes.
    size_t at = f.column.find('.');
    f.top = column_of(f.column.substr(0, at));
    while (at != std::string::npos) {
      const size_t next = f.column.find('.', at + 1);
      f.inside.push_back(f.column.substr(at + 1, next == std::string::npos ? next : next - at - 1));
      at = next;
    }
    cat.parquet_fields.push_back(std::move(f));
  }
  cat.parquet_id = column_of("id");
  std::vector<parquet::Dataset::Damage> damage;
  MMFEED_ASSIGN_OR_RETURN(std::unique_ptr<parquet::Dataset> data,
                          parquet::Dataset::Open(files, options, &damage));
  for (parquet::Dataset::Damage& d : damage)
    cat.errors.push_back({std::move(d.origin), std::move(d.reason)});
  // Every file has each field's column, of a type the field takes: else the config is wrong
  // for this data, said before anything starts (--check too).
  for (size_t k = 0; k < data->file_count(); ++k)
    for (const ParquetField& f : cat.parquet_fields) {
      const std::string& top = options.columns[f.top];
      const std::string type = data->ColumnType(k, top);
      if (type.empty() && !cat.fields_optional)
        return Status::Invalid(fmt::format(
            "{}: no column '{}' for field '{}' (its columns: {}); name the column that holds it "
            "with `fields: {{{}: COLUMN}}` in the source",
            data->path(k), top, f.name, fmt::join(data->Columns(k), ", "), f.name));
      if (!type.empty() && f.path && f.inside.empty() && !MediaType(type))
        return Status::Invalid(fmt::format(
            "{}: column '{}' is {}: field '{}' reads bytes, a path, or an Image or Audio "
            "struct<bytes, path>",
            data->path(k), top, type, f.name));
    }
  cat.parquet = std::move(data);
  return cat;
}

Status Catalog::ReadParquet(size_t i, CatalogEntry* e) const {
  parquet::Dataset::Row row;
  const Status st = parquet->Read(i, &row);
  const std::string& file = parquet->path(row.file);
  e->origin = fmt::format("{}:row {}", file, row.row);
  e->id = fmt::format("{}:{}", fs::path(file).filename().string(), row.row);
  if (e->id.size() > shm::kMaxIdBytes) e->id = std::to_string(i);
  e->fields.clear();
  if (!st.ok()) return st;
  if (const json* id = row.column(parquet_id); id && !id->is_null()) {
    if (id->is_string())
      e->id = id->get<std::string>();
    else if (id->is_number_integer())
      e->id = Text(*id);
    else
      return Status::Corrupt("column 'id' must hold strings or integers");
    if (e->id.empty()) return Status::Corrupt("its 'id' is empty");
    if (e->id.size() > shm::kMaxIdBytes)
      return Status::Corrupt(fmt::format("its 'id' is longer than {} bytes", shm::kMaxIdBytes));
  }
  const std::string dir = fs::path(file).parent_path().string();
  for (const ParquetField& f : parquet_fields) {
    const json* v = row.column(f.top);
    for (const std::string& key : f.inside)
      v = v && v->is_object() && v->contains(key) ? &(*v)[key] : nullptr;
    if (!v || v->is_null()) {
      if (fields_optional) continue;
      return Status::Corrupt(fmt::format("field '{}' (column '{}') is null", f.name, f.column));
    }
    FieldValue value;
    std::string reason = ToField(*v, f, dir, &value);
    if (!reason.empty()) return Status::Corrupt(reason);
    e->fields.emplace_back(f.name, std::move(value));
  }
  if (fields_optional && e->fields.empty() && !needed.empty())
    return Status::Corrupt(
        fmt::format("has none of the fields the stages read ({})", fmt::join(needed, ", ")));
  return Status::Ok();
}

}  // namespace mmfeed
