// Tensor: a named, typed, shaped block of bytes owned by one stage at a time (move-only in
// practice: stages hand tensors on with std::move). Also the dtype vocabulary shared with the
// ring format (shm/ring_format.h stores DType values as uint32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mmfeed {

enum class DType : uint32_t { kUInt8 = 1, kInt32 = 2, kFloat32 = 3, kInt64 = 4 };

size_t DTypeSize(DType t);
const char* DTypeName(DType t);         // "uint8", "int32", ...
const char* DTypeNumpyDescr(DType t);   // "|u1", "<i4", ...
bool ParseDType(const std::string& name, DType* out);

// Shape and dtype of one per-sample output; the batch adds a leading batch dimension.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  size_t NumBytes() const;
};

// Bytes that are not zeroed on allocation: a stage writes every byte of its outputs, and at
// thousands of images a second the memset would cost as much as a copy.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) : data_(new uint8_t[n]), size_(n) {}
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  uint8_t& operator[](size_t i) { return data_[i]; }
  uint8_t operator[](size_t i) const { return data_[i]; }
  bool operator==(const Buffer& o) const;

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
};

struct Tensor {
  TensorSpec spec;
  Buffer data;

  static Tensor Make(TensorSpec spec) {
    Tensor t;
    t.data = Buffer(spec.NumBytes());
    t.spec = std::move(spec);
    return t;
  }
  template <typename T>
  T* As() { return reinterpret_cast<T*>(data.data()); }
};

}  // namespace mmfeed
