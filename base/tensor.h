// Tensor descriptions: the dtype vocabulary shared with the ring format (shm/ring_format.h
// stores DType values as uint32) and the per-sample TensorSpec every stage declares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace mmfeed {

// kBFloat16: the upper half of a float32 (1 sign, 8 exponent, 7 mantissa bits), what trainers
// compute in; numpy has no such type, so the Python client and dumps give its bits as uint16.
enum class DType : uint32_t { kUInt8 = 1, kInt32 = 2, kFloat32 = 3, kInt64 = 4, kBFloat16 = 5 };
constexpr DType kLastDType = DType::kBFloat16;

size_t DTypeSize(DType t);
const char* DTypeName(DType t);        // "uint8", "int32", ...
const char* DTypeNumpyDescr(DType t);  // "|u1", "<i4", ...
bool ParseDType(const std::string& name, DType* out);

// float32 -> bfloat16 bits, rounded to the nearest even as torch's .to(torch.bfloat16) does;
// a NaN stays a (quiet) NaN.
inline uint16_t ToBFloat16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
}

// Shape and dtype of one per-sample output; the batch adds a leading batch dimension.
//
// A ragged output (`rows_from` set) has a number of rows that differs from sample to sample:
// shape[0] is the most rows one sample may have, and a sample's own count is the product of
// the int32 values of its output named `rows_from` (e.g. the patches of an image, from its
// [t, h, w] grid). A batch holds the samples' rows one after another, in row order: its tensor
// is [the samples' rows together, shape[1:]...] instead of [batch rows, shape...]; a ragged
// tensor of one axis (a token sequence) is one packed row: [1, the samples' tokens together].
//
// A starts tensor (`starts_of` set: int32, shape [2] per sample) is filled when the batch is
// committed with where each sample's rows begin in the ragged tensor `starts_of`, then their
// total: [batch rows + 1], the `cu_seqlens` of variable-length attention (two values per sample
// reserve room for the one more).
struct TensorSpec {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  std::string rows_from;
  std::string starts_of;
  size_t NumBytes() const;
};

// A sample's rows of a ragged tensor: the sum, over its rows_from tensor's last-axis vectors
// (one for a scalar or a vector), of each vector's product: an image's [t, h, w] grid gives
// t*h*w patches, several images' [n, 3] grids the sum of theirs, a count the count. Bounded by
// the tensor's most rows (a stage's bug stays in bounds).
int64_t RaggedRows(const TensorSpec& s, const TensorSpec& from, const uint8_t* counts);

}  // namespace mmfeed
