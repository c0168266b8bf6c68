#include "base/tensor.h"

#include <algorithm>
#include <cstring>

namespace mmfeed {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kUInt8:
      return 1;
    case DType::kInt32:
      return 4;
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kUInt8:
      return "uint8";
    case DType::kInt32:
      return "int32";
    case DType::kFloat32:
      return "float32";
    case DType::kInt64:
      return "int64";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

const char* DTypeNumpyDescr(DType t) {
  switch (t) {
    case DType::kUInt8:
      return "|u1";
    case DType::kInt32:
      return "<i4";
    case DType::kFloat32:
      return "<f4";
    case DType::kInt64:
      return "<i8";
    case DType::kBFloat16:
      return "<u2";  // its bits: numpy has no bfloat16
  }
  return "";
}

bool ParseDType(const std::string& name, DType* out) {
  for (DType t : {DType::kUInt8, DType::kInt32, DType::kFloat32, DType::kInt64, DType::kBFloat16}) {
    if (name == DTypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

size_t TensorSpec::NumBytes() const {
  size_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

int64_t RaggedRows(const TensorSpec& s, const TensorSpec& from, const uint8_t* counts) {
  const size_t values = from.NumBytes() / sizeof(int32_t);
  const size_t width = from.shape.empty() ? 1 : static_cast<size_t>(from.shape.back());
  int64_t total = 0;
  for (size_t v = 0; v + width <= values; v += width) {
    int64_t n = 1;
    for (size_t k = 0; k < width; ++k) {
      int32_t c;
      std::memcpy(&c, counts + (v + k) * sizeof c, sizeof c);
      n = std::min<int64_t>(n * std::max(c, 0), s.shape[0]);
    }
    total = std::min<int64_t>(total + n, s.shape[0]);
  }
  return total;
}

}  // namespace mmfeed
