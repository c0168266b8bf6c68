// A reader of Thrift's compact protocol, the encoding of Parquet's metadata (its footer's
// FileMetaData, each page's PageHeader), written from the protocol's specification
// (thrift/doc/specs/thrift-compact-protocol.md). Bounded: every read checks the bytes left, a
// list may not claim more elements than bytes remain, structs nest at most kMaxDepth deep, and a
// field of a type the caller does not expect is an error naming the offset. Unknown fields are
// skipped, so newer writers' additions are read past.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace mmfeed::parquet {

class ThriftReader {
 public:
  // The compact protocol's types, as a field header or a list header carries them.
  enum Type : uint8_t {
    kStop = 0,
    kTrue = 1,  // a boolean field's value is its type
    kFalse = 2,
    kByte = 3,
    kI16 = 4,
    kI32 = 5,
    kI64 = 6,
    kDouble = 7,
    kBinary = 8,
    kList = 9,
    kSet = 10,
    kMap = 11,
    kStruct = 12,
  };
  static constexpr int kMaxDepth = 32;

  explicit ThriftReader(std::string_view bytes) : data_(bytes) {}

  // Reads one struct: `field(id, type)` is called for each field, and must read its value with
  // the readers below (or Skip it); the STOP byte ends it.
  using FieldFn = std::function<Status(int16_t id, uint8_t type)>;
  Status Struct(const FieldFn& field);
  // A field's value of the given wire type. Int: any of byte, i16, i32 and i64 (zigzag varints).
  Result<int64_t> Int(uint8_t type);
  Result<bool> Bool(uint8_t type);  // a struct field (type kTrue/kFalse) or a list element
  Result<double> Double(uint8_t type);
  Result<std::string> Binary(uint8_t type);
  // A list (or set): `element(type)` is called once per element, reading it.
  Status List(uint8_t type, const std::function<Status(uint8_t element_type)>& element);
  // Reads past a value of `type`.
  Status Skip(uint8_t type);
  // Bytes consumed so far.
  size_t offset() const { return at_; }

 private:
  Result<uint64_t> Varint();
  Result<uint8_t> Byte();
  Status Error(const std::string& what) const;
  std::string_view data_;
  size_t at_ = 0;
  int depth_ = 0;
  bool list_bool_ = false;  // reading a list's boolean elements (a byte each)
};

}  // namespace mmfeed::parquet
