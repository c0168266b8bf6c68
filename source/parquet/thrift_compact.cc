#include "source/parquet/thrift_compact.h"

#include <fmt/format.h>

#include <cstring>

namespace mmfeed::parquet {

Status ThriftReader::Error(const std::string& what) const {
  return Status::Corrupt(fmt::format("thrift metadata at byte {}: {}", at_, what));
}

Result<uint8_t> ThriftReader::Byte() {
  if (at_ >= data_.size()) return Error("ends early");
  return static_cast<uint8_t>(data_[at_++]);
}

Result<uint64_t> ThriftReader::Varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    MMFEED_ASSIGN_OR_RETURN(const uint8_t b, Byte());
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  return Error("a varint longer than 10 bytes");
}

Status ThriftReader::Struct(const FieldFn& field) {
  if (++depth_ > kMaxDepth) return Error(fmt::format("structs nested over {} deep", kMaxDepth));
  int16_t last = 0;
  while (true) {
    MMFEED_ASSIGN_OR_RETURN(const uint8_t header, Byte());
    const uint8_t type = header & 0x0f;
    if (type == kStop) break;
    int16_t id;
    if (const uint8_t delta = header >> 4; delta != 0) {
      id = static_cast<int16_t>(last + delta);
    } else {
      MMFEED_ASSIGN_OR_RETURN(const uint64_t z, Varint());
      id = static_cast<int16_t>((z >> 1) ^ (~(z & 1) + 1));
    }
    if (type > kStruct) return Error(fmt::format("field {} has unknown type {}", id, type));
    const bool list_bool = list_bool_;
    list_bool_ = false;
    MMFEED_RETURN_IF_ERROR(field(id, type));
    list_bool_ = list_bool;
    last = id;
  }
  --depth_;
  return Status::Ok();
}

Result<int64_t> ThriftReader::Int(uint8_t type) {
  if (type == kByte) {
    MMFEED_ASSIGN_OR_RETURN(const uint8_t b, Byte());
    return static_cast<int8_t>(b);
  }
  if (type != kI16 && type != kI32 && type != kI64)
    return Error(fmt::format("an integer was expected, not type {}", type));
  MMFEED_ASSIGN_OR_RETURN(const uint64_t z, Varint());
  return static_cast<int64_t>((z >> 1) ^ (~(z & 1) + 1));
}

Result<bool> ThriftReader::Bool(uint8_t type) {
  if (list_bool_) {  // a list's element: one byte, 1 for true
    MMFEED_ASSIGN_OR_RETURN(const uint8_t b, Byte());
    return b == 1;
  }
  if (type != kTrue && type != kFalse)
    return Error(fmt::format("a boolean was expected, not type {}", type));
  return type == kTrue;
}

Result<double> ThriftReader::Double(uint8_t type) {
  if (type != kDouble) return Error(fmt::format("a double was expected, not type {}", type));
  if (data_.size() - at_ < 8) return Error("ends early");
  double d;
  std::memcpy(&d, data_.data() + at_, 8);  // little-endian, as the hosts we run on
  at_ += 8;
  return d;
}

Result<std::string> ThriftReader::Binary(uint8_t type) {
  if (type != kBinary) return Error(fmt::format("a string was expected, not type {}", type));
  MMFEED_ASSIGN_OR_RETURN(const uint64_t n, Varint());
  if (n > data_.size() - at_)
    return Error(fmt::format("a string of {} bytes where {} remain", n, data_.size() - at_));
  std::string s(data_.substr(at_, n));
  at_ += n;
  return s;
}

Status ThriftReader::List(uint8_t type, const std::function<Status(uint8_t)>& element) {
  if (type != kList && type != kSet)
    return Error(fmt::format("a list was expected, not type {}", type));
  MMFEED_ASSIGN_OR_RETURN(const uint8_t header, Byte());
  uint64_t n = header >> 4;
  if (n == 15) {
    MMFEED_ASSIGN_OR_RETURN(n, Varint());
  }
  const uint8_t elem = header & 0x0f;
  if (elem == kStop || elem > kStruct) return Error(fmt::format("list of unknown type {}", elem));
  // Every element takes a byte at least: a claim of more is a forgery, refused before a loop.
  if (n > data_.size() - at_)
    return Error(fmt::format("a list of {} elements where {} bytes remain", n, data_.size() - at_));
  if (++depth_ > kMaxDepth) return Error(fmt::format("lists nested over {} deep", kMaxDepth));
  for (uint64_t i = 0; i < n; ++i) {
    list_bool_ = elem == kTrue || elem == kFalse;
    Status st = element(elem);
    list_bool_ = false;
    MMFEED_RETURN_IF_ERROR(st);
  }
  --depth_;
  return Status::Ok();
}

Status ThriftReader::Skip(uint8_t type) {
  switch (type) {
    case kTrue:
    case kFalse:
      return Bool(type).status();
    case kByte:
    case kI16:
    case kI32:
    case kI64:
      return Int(type).status();
    case kDouble:
      return Double(type).status();
    case kBinary:
      return Binary(type).status();
    case kList:
    case kSet:
      return List(type, [this](uint8_t e) { return Skip(e); });
    case kMap: {
      MMFEED_ASSIGN_OR_RETURN(const uint64_t n, Varint());
      if (n == 0) return Status::Ok();
      MMFEED_ASSIGN_OR_RETURN(const uint8_t kinds, Byte());
      if (2 * n > data_.size() - at_) return Error("a map longer than the bytes left");
      if (++depth_ > kMaxDepth) return Error("maps nested too deep");
      for (uint64_t i = 0; i < n; ++i) {
        MMFEED_RETURN_IF_ERROR(Skip(kinds >> 4));
        MMFEED_RETURN_IF_ERROR(Skip(kinds & 0x0f));
      }
      --depth_;
      return Status::Ok();
    }
    case kStruct:
      return Struct([this](int16_t, uint8_t t) { return Skip(t); });
    default:
      return Error(fmt::format("unknown type {}", type));
  }
}

}  // namespace mmfeed::parquet
