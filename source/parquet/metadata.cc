#include "source/parquet/metadata.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "source/index_file.h"
#include "source/parquet/thrift_compact.h"

namespace mmfeed::parquet {
namespace {

constexpr char kMagic[] = "PAR1";
// Metadata is read into memory whole: larger than this is refused (a forged length, or a file
// of millions of row groups, which mmfeed would index differently).
constexpr uint64_t kMaxMetadataBytes = 256ull << 20;

using T = ThriftReader;

Result<int32_t> Int32(ThriftReader& r, uint8_t type) {
  MMFEED_ASSIGN_OR_RETURN(const int64_t v, r.Int(type));
  if (v < INT32_MIN || v > INT32_MAX) return Status::Corrupt(fmt::format("{} is out of range", v));
  return static_cast<int32_t>(v);
}

// A physical type (parquet.thrift's Type: 0 to 7).
Result<PhysicalType> Physical(ThriftReader& r, uint8_t type) {
  MMFEED_ASSIGN_OR_RETURN(const int32_t t, Int32(r, type));
  if (t < 0 || t > 7) return Status::Corrupt(fmt::format("unknown physical type {}", t));
  return static_cast<PhysicalType>(t);
}

Status Strings(ThriftReader& r, uint8_t type, std::vector<std::string>* out) {
  return r.List(type, [&](uint8_t e) -> Status {
    MMFEED_ASSIGN_OR_RETURN(std::string s, r.Binary(e));
    out->push_back(std::move(s));
    return Status::Ok();
  });
}

// LogicalType is a union of empty (or small) structs: the field's id names it.
Result<std::string> LogicalType(ThriftReader& r) {
  static const char* const kNames[] = {"",        "STRING",  "MAP",      "LIST",      "ENUM",
                                       "DECIMAL", "DATE",    "TIME",     "TIMESTAMP", "",
                                       "INTEGER", "NULL",    "JSON",     "BSON",      "UUID",
                                       "FLOAT16", "VARIANT", "GEOMETRY", "GEOGRAPHY"};
  std::string name;
  MMFEED_RETURN_IF_ERROR(r.Struct([&](int16_t id, uint8_t type) {
    if (id > 0 && id < static_cast<int16_t>(std::size(kNames))) name = kNames[id];
    if (name.empty()) name = fmt::format("logical type {}", id);
    return r.Skip(type);
  }));
  return name;
}

Status ReadSchemaElement(ThriftReader& r, SchemaElement* e) {
  return r.Struct([&](int16_t id, uint8_t type) -> Status {
    switch (id) {
      case 1: {
        MMFEED_ASSIGN_OR_RETURN(e->type, Physical(r, type));
        return Status::Ok();
      }
      case 2: {
        MMFEED_ASSIGN_OR_RETURN(e->type_length, Int32(r, type));
        return Status::Ok();
      }
      case 3: {
        MMFEED_ASSIGN_OR_RETURN(const int32_t rep, Int32(r, type));
        if (rep < 0 || rep > 2) return Status::Corrupt(fmt::format("unknown repetition {}", rep));
        e->repetition = static_cast<Repetition>(rep);
        return Status::Ok();
      }
      case 4: {
        MMFEED_ASSIGN_OR_RETURN(e->name, r.Binary(type));
        return Status::Ok();
      }
      case 5: {
        MMFEED_ASSIGN_OR_RETURN(e->num_children, Int32(r, type));
        return Status::Ok();
      }
      case 6: {
        MMFEED_ASSIGN_OR_RETURN(const int32_t c, Int32(r, type));
        e->converted_type = c;
        return Status::Ok();
      }
      case 10: {
        if (type != T::kStruct) return r.Skip(type);
        MMFEED_ASSIGN_OR_RETURN(e->logical_type, LogicalType(r));
        return Status::Ok();
      }
      default:
        return r.Skip(type);
    }
  });
}

Status ReadColumnMeta(ThriftReader& r, ColumnChunk* c) {
  return r.Struct([&](int16_t id, uint8_t type) -> Status {
    switch (id) {
      case 1: {
        MMFEED_ASSIGN_OR_RETURN(c->type, Physical(r, type));
        return Status::Ok();
      }
      case 2:
        return r.List(type, [&](uint8_t e) -> Status {
          MMFEED_ASSIGN_OR_RETURN(const int32_t enc, Int32(r, e));
          c->encodings.push_back(enc);
          return Status::Ok();
        });
      case 3:
        return Strings(r, type, &c->path);
      case 4: {
        MMFEED_ASSIGN_OR_RETURN(const int32_t codec, Int32(r, type));
        if (codec < 0 || codec > 7) return Status::Corrupt(fmt::format("unknown codec {}", codec));
        c->codec = static_cast<Codec>(codec);
        return Status::Ok();
      }
      case 5: {
        MMFEED_ASSIGN_OR_RETURN(c->num_values, r.Int(type));
        return Status::Ok();
      }
      case 6: {
        MMFEED_ASSIGN_OR_RETURN(c->total_uncompressed_size, r.Int(type));
        return Status::Ok();
      }
      case 7: {
        MMFEED_ASSIGN_OR_RETURN(c->total_compressed_size, r.Int(type));
        return Status::Ok();
      }
      case 9: {
        MMFEED_ASSIGN_OR_RETURN(c->data_page_offset, r.Int(type));
        return Status::Ok();
      }
      case 11: {
        MMFEED_ASSIGN_OR_RETURN(const int64_t off, r.Int(type));
        c->dictionary_page_offset = off;
        return Status::Ok();
      }
      default:
        return r.Skip(type);
    }
  });
}

Status ReadColumnChunk(ThriftReader& r, ColumnChunk* c) {
  bool has_meta = false;
  MMFEED_RETURN_IF_ERROR(r.Struct([&](int16_t id, uint8_t type) -> Status {
    if (id == 1) {
      MMFEED_ASSIGN_OR_RETURN(c->file_path, r.Binary(type));
      return Status::Ok();
    }
    if (id == 3 && type == T::kStruct) {
      has_meta = true;
      return ReadColumnMeta(r, c);
    }
    return r.Skip(type);
  }));
  if (!has_meta) return Status::Corrupt("a column chunk without its metadata");
  return Status::Ok();
}

Status ReadRowGroup(ThriftReader& r, RowGroup* g) {
  return r.Struct([&](int16_t id, uint8_t type) -> Status {
    switch (id) {
      case 1:
        return r.List(type, [&](uint8_t e) -> Status {
          if (e != T::kStruct) return Status::Corrupt("a column chunk that is not a struct");
          g->columns.emplace_back();
          return ReadColumnChunk(r, &g->columns.back());
        });
      case 2: {
        MMFEED_ASSIGN_OR_RETURN(g->total_byte_size, r.Int(type));
        return Status::Ok();
      }
      case 3: {
        MMFEED_ASSIGN_OR_RETURN(g->num_rows, r.Int(type));
        return Status::Ok();
      }
      default:
        return r.Skip(type);
    }
  });
}

Status ReadFileMetaData(ThriftReader& r, FileMetaData* m) {
  return r.Struct([&](int16_t id, uint8_t type) -> Status {
    switch (id) {
      case 1: {
        MMFEED_ASSIGN_OR_RETURN(m->version, Int32(r, type));
        return Status::Ok();
      }
      case 2:
        return r.List(type, [&](uint8_t e) -> Status {
          if (e != T::kStruct) return Status::Corrupt("a schema element that is not a struct");
          m->schema.emplace_back();
          return ReadSchemaElement(r, &m->schema.back());
        });
      case 3: {
        MMFEED_ASSIGN_OR_RETURN(m->num_rows, r.Int(type));
        return Status::Ok();
      }
      case 4:
        return r.List(type, [&](uint8_t e) -> Status {
          if (e != T::kStruct) return Status::Corrupt("a row group that is not a struct");
          m->row_groups.emplace_back();
          return ReadRowGroup(r, &m->row_groups.back());
        });
      case 5:
        return r.List(type, [&](uint8_t e) -> Status {
          if (e != T::kStruct) return Status::Corrupt("a key/value that is not a struct");
          std::pair<std::string, std::string> kv;
          MMFEED_RETURN_IF_ERROR(r.Struct([&](int16_t kid, uint8_t kt) -> Status {
            if (kid == 1 || kid == 2) {
              MMFEED_ASSIGN_OR_RETURN(std::string s, r.Binary(kt));
              (kid == 1 ? kv.first : kv.second) = std::move(s);
              return Status::Ok();
            }
            return r.Skip(kt);
          }));
          m->key_value.push_back(std::move(kv));
          return Status::Ok();
        });
      case 6: {
        MMFEED_ASSIGN_OR_RETURN(m->created_by, r.Binary(type));
        return Status::Ok();
      }
      default:
        return r.Skip(type);
    }
  });
}

// The schema's leaves, depth first, with their levels; the tree must account for every element.
Status Leaves(FileMetaData* m) {
  const std::vector<SchemaElement>& s = m->schema;
  if (s.empty()) return Status::Corrupt("the schema is empty");
  if (s[0].type) return Status::Corrupt("the schema's root is not a group");
  size_t next = 1;
  std::vector<std::string> path;
  std::vector<size_t> elements;
  // Depth first: element `i` at depth `depth` (bounded: each level takes an element).
  std::function<Status(size_t, int16_t, int16_t)> walk = [&](size_t children, int16_t def,
                                                             int16_t rep) -> Status {
    for (size_t c = 0; c < children; ++c) {
      if (next >= s.size())
        return Status::Corrupt(
            fmt::format("the schema's groups claim more than its {} elements", s.size()));
      const size_t i = next++;
      const SchemaElement& e = s[i];
      const int16_t d = static_cast<int16_t>(def + (e.repetition != Repetition::kRequired));
      const int16_t rr = static_cast<int16_t>(rep + (e.repetition == Repetition::kRepeated));
      path.push_back(e.name);
      elements.push_back(i);
      if (e.type) {
        if (e.num_children > 0)
          return Status::Corrupt(fmt::format("column '{}' has a type and children", e.name));
        m->leaves.push_back({path, *e.type, e.type_length, d, rr, i, elements});
      } else {
        if (e.num_children <= 0)
          return Status::Corrupt(fmt::format("group '{}' has no children", e.name));
        if (path.size() > 64) return Status::Corrupt("the schema nests over 64 levels");
        MMFEED_RETURN_IF_ERROR(walk(static_cast<size_t>(e.num_children), d, rr));
      }
      path.pop_back();
      elements.pop_back();
    }
    return Status::Ok();
  };
  if (s[0].num_children < 0) return Status::Corrupt("the schema's root has no children");
  MMFEED_RETURN_IF_ERROR(walk(static_cast<size_t>(s[0].num_children), 0, 0));
  if (next != s.size())
    return Status::Corrupt(fmt::format("the schema has {} elements, its tree {}", s.size(), next));
  return Status::Ok();
}

// Every row group: one chunk per leaf, in order, inside the file's data; the rows add up.
Status Check(const FileMetaData& m, uint64_t data_end) {
  if (m.num_rows < 0) return Status::Corrupt(fmt::format("num_rows {}", m.num_rows));
  int64_t rows = 0;
  for (size_t g = 0; g < m.row_groups.size(); ++g) {
    const RowGroup& rg = m.row_groups[g];
    const std::string where = fmt::format("row group {}", g);
    if (rg.num_rows < 0 || rg.num_rows > m.num_rows - rows)
      return Status::Corrupt(
          fmt::format("{}: {} rows, past the file's {}", where, rg.num_rows, m.num_rows));
    rows += rg.num_rows;
    if (rg.columns.size() != m.leaves.size())
      return Status::Corrupt(fmt::format("{}: {} column chunks for {} columns", where,
                                         rg.columns.size(), m.leaves.size()));
    for (size_t k = 0; k < rg.columns.size(); ++k) {
      const ColumnChunk& c = rg.columns[k];
      const LeafColumn& leaf = m.leaves[k];
      const std::string column = fmt::format("{}, column '{}'", where, fmt::join(leaf.path, "."));
      if (!c.file_path.empty())
        return Status::Unsupported(
            fmt::format("{}: its data is in another file ({}); mmfeed reads self-contained files",
                        column, c.file_path));
      if (c.path != leaf.path)
        return Status::Corrupt(
            fmt::format("{}: the chunk names '{}'", column, fmt::join(c.path, ".")));
      if (c.type != leaf.type)
        return Status::Corrupt(fmt::format("{}: the chunk is {}, the schema says {}", column,
                                           Name(c.type), Name(leaf.type)));
      const int64_t start = c.start();
      if (start < 4 || c.total_compressed_size < 0 || c.num_values < 0 ||
          c.total_uncompressed_size < 0 || static_cast<uint64_t>(start) > data_end ||
          static_cast<uint64_t>(c.total_compressed_size) >
              data_end - static_cast<uint64_t>(start) ||
          c.data_page_offset < start)
        return Status::Corrupt(fmt::format(
            "{}: bytes {}+{} (first data page at {}) are not inside the file's data (4 to {})",
            column, start, c.total_compressed_size, c.data_page_offset, data_end));
    }
  }
  if (rows != m.num_rows)
    return Status::Corrupt(
        fmt::format("the row groups hold {} rows, the file says {}", rows, m.num_rows));
  return Status::Ok();
}

}  // namespace

const char* Name(PhysicalType t) {
  static const char* const kNames[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                       "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
  const auto i = static_cast<size_t>(t);
  return i < std::size(kNames) ? kNames[i] : "?";
}

const char* Name(Codec c) {
  static const char* const kNames[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
                                       "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
  const auto i = static_cast<size_t>(c);
  return i < std::size(kNames) ? kNames[i] : "?";
}

const char* EncodingName(int32_t e) {
  static const char* const kNames[] = {
      "PLAIN",          "GROUP_VAR_INT",       "PLAIN_DICTIONARY",        "RLE",
      "BIT_PACKED",     "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
      "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  return e >= 0 && static_cast<size_t>(e) < std::size(kNames) ? kNames[e] : "?";
}

Result<uint64_t> MetadataLength(std::string_view last8, uint64_t size, const std::string& name) {
  if (size < 12 || last8.size() != kFooterBytes)
    return Status::Corrupt(fmt::format("{}: {} bytes, too short for a Parquet file", name, size));
  if (last8.substr(4) != std::string_view(kMagic, 4))
    return Status::Corrupt(
        fmt::format("{}: not a Parquet file (it does not end with PAR1{})", name,
                    last8.substr(4) == "PARE" ? "; PARE: encrypted, refused" : ""));
  uint32_t len;
  std::memcpy(&len, last8.data(), 4);
  if (len > size - 12 || len > kMaxMetadataBytes)
    return Status::Corrupt(fmt::format(
        "{}: its footer claims {} bytes of metadata, more than the file's {} bytes hold{}", name,
        len, size, len > kMaxMetadataBytes ? " (or over 256 MiB)" : ""));
  return len;
}

Result<FileMetaData> ParseMetadata(std::string_view bytes, uint64_t size, const std::string& name) {
  FileMetaData m;
  ThriftReader r(bytes);
  Status st = ReadFileMetaData(r, &m);
  if (st.ok()) st = Leaves(&m);
  if (st.ok()) st = Check(m, size - kFooterBytes - bytes.size());
  if (!st.ok()) return st.WithContext(name);
  return m;
}

Result<FileMetaData> ReadFooter(int fd, uint64_t size, const std::string& name) {
  char last8[kFooterBytes];
  if (size >= kFooterBytes && !index_file::FullPread(fd, last8, kFooterBytes, size - kFooterBytes))
    return Status::Io(fmt::format("{}: {}", name, std::strerror(errno)));
  MMFEED_ASSIGN_OR_RETURN(
      const uint64_t len,
      MetadataLength(std::string_view(last8, size >= kFooterBytes ? kFooterBytes : 0), size, name));
  std::string meta(len, '\0');
  if (!index_file::FullPread(fd, meta.data(), meta.size(), size - kFooterBytes - len))
    return Status::Io(fmt::format("{}: {}", name, std::strerror(errno)));
  return ParseMetadata(meta, size, name);
}

Result<FileMetaData> ReadFooter(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Io(fmt::format("{}: {}", path, std::strerror(errno)));
  struct stat st {};
  Result<FileMetaData> m = Status::Invalid(fmt::format("{}: not a regular file", path));
  if (::fstat(fd, &st) != 0)
    m = Status::Io(fmt::format("{}: {}", path, std::strerror(errno)));
  else if (S_ISREG(st.st_mode))
    m = ReadFooter(fd, static_cast<uint64_t>(st.st_size), path);
  ::close(fd);
  return m;
}

std::string MetadataJson(const FileMetaData& m) {
  nlohmann::json j;
  j["version"] = m.version;
  j["num_rows"] = m.num_rows;
  j["created_by"] = m.created_by;
  j["schema"] = nlohmann::json::array();
  static const char* const kRepetition[] = {"REQUIRED", "OPTIONAL", "REPEATED"};
  for (const SchemaElement& e : m.schema)
    j["schema"].push_back({{"name", e.name},
                           {"type", e.type ? nlohmann::json(Name(*e.type)) : nlohmann::json()},
                           {"repetition", kRepetition[static_cast<int>(e.repetition)]},
                           {"num_children", e.num_children},
                           {"logical_type", e.logical_type}});
  j["columns"] = nlohmann::json::array();
  for (const LeafColumn& c : m.leaves) {
    const SchemaElement& e = m.schema[c.schema_index];
    j["columns"].push_back({{"path", fmt::format("{}", fmt::join(c.path, "."))},
                            {"type", Name(c.type)},
                            {"logical_type", e.logical_type},
                            {"max_definition_level", c.max_definition},
                            {"max_repetition_level", c.max_repetition}});
  }
  j["row_groups"] = nlohmann::json::array();
  for (const RowGroup& g : m.row_groups) {
    nlohmann::json cols = nlohmann::json::array();
    for (const ColumnChunk& c : g.columns) {
      std::vector<std::string> enc;
      for (int32_t e : c.encodings) enc.push_back(EncodingName(e));
      cols.push_back({{"path", fmt::format("{}", fmt::join(c.path, "."))},
                      {"codec", Name(c.codec)},
                      {"encodings", enc},
                      {"num_values", c.num_values},
                      {"data_page_offset", c.data_page_offset},
                      {"dictionary_page_offset", c.dictionary_page_offset
                                                     ? nlohmann::json(*c.dictionary_page_offset)
                                                     : nlohmann::json()},
                      {"total_compressed_size", c.total_compressed_size},
                      {"total_uncompressed_size", c.total_uncompressed_size}});
    }
    j["row_groups"].push_back({{"num_rows", g.num_rows}, {"columns", cols}});
  }
  j["key_value"] = nlohmann::json::object();
  for (const auto& [k, v] : m.key_value) j["key_value"][k] = v;
  // Names are bytes: a name that is not UTF-8 is shown with U+FFFD in its place.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace mmfeed::parquet
