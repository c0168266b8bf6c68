#include "base/tensor.h"

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

}  // namespace mmfeed
