// Tensor descriptions: the dtype vocabulary shared with the ring format (shm/ring_format.h
// stores DType values as uint32) and the per-sample TensorSpec every stage declares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mmfeed {

enum class DType : uint32_t { kUInt8 = 1, kInt32 = 2, kFloat32 = 3, kInt64 = 4 };

size_t DTypeSize(DType t);
const char* DTypeName(DType t);        // "uint8", "int32", ...
const char* DTypeNumpyDescr(DType t);  // "|u1", "<i4", ...
bool ParseDType(const std::string& name, DType* out);

// Shape and dtype of one per-sample output; the batch adds a leading batch dimension.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  size_t NumBytes() const;
};

}  // namespace mmfeed
