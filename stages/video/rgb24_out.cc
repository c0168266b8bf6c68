#include "stages/video/rgb24_out.h"

#include <immintrin.h>

#include <cstring>

#include "base/simd.h"

namespace mmfeed {
namespace {

// Pixels [from, n) as T, each value stored by store(byte, channel, T*).
template <typename T, typename Store>
void PortableAs(bool planar, const uint8_t* rgb, size_t from, size_t n, uint8_t* const out[3],
                Store store) {
  if (planar) {
    for (int c = 0; c < 3; ++c) {
      T* plane = reinterpret_cast<T*>(out[c]);
      for (size_t i = from; i < n; ++i) store(rgb[3 * i + c], c, &plane[i]);
    }
    return;
  }
  T* px = reinterpret_cast<T*>(out[0]);
  for (size_t i = from; i < n; ++i)
    for (int c = 0; c < 3; ++c) store(rgb[3 * i + c], c, &px[3 * i + c]);
}

void Portable(const Rgb24Out& o, bool planar, const uint8_t* rgb, size_t from, size_t n,
              uint8_t* const out[3]) {
  const float* mul = o.mul;
  const float* add = o.add;
  switch (o.dtype) {
    case DType::kFloat32:
      PortableAs<float>(planar, rgb, from, n, out, [&](uint8_t p, int c, float* v) {
        *v = static_cast<float>(p) * mul[c] + add[c];
      });
      break;
    case DType::kBFloat16:
      PortableAs<uint16_t>(planar, rgb, from, n, out, [&](uint8_t p, int c, uint16_t* v) {
        *v = ToBFloat16(static_cast<float>(p) * mul[c] + add[c]);
      });
      break;
    default:
      PortableAs<uint8_t>(planar, rgb, from, n, out, [](uint8_t p, int, uint8_t* v) { *v = p; });
  }
}

// Planar: eight pixels a step, bytes 0-11 in the low lane and 12-23 in the high one, so that
// one byte shuffle puts a channel's four pixels of each lane in 32-bit slots. Reads 4 bytes
// past a step's 24: stops 10 pixels before the end. Returns the pixels done.
template <DType D>
__attribute__((target("avx2"))) size_t PlanarAvx2(const Rgb24Out& o, const uint8_t* rgb, size_t n,
                                                  uint8_t* const out[3]) {
  constexpr char z = -1;
  const __m256i channel[3] = {_mm256_setr_epi8(0, z, z, z, 3, z, z, z, 6, z, z, z, 9, z, z, z,  //
                                               0, z, z, z, 3, z, z, z, 6, z, z, z, 9, z, z, z),
                              _mm256_setr_epi8(1, z, z, z, 4, z, z, z, 7, z, z, z, 10, z, z, z,  //
                                               1, z, z, z, 4, z, z, z, 7, z, z, z, 10, z, z, z),
                              _mm256_setr_epi8(2, z, z, z, 5, z, z, z, 8, z, z, z, 11, z, z, z,  //
                                               2, z, z, z, 5, z, z, z, 8, z, z, z, 11, z, z, z)};
  // uint8: each lane's R, G and B runs of four, then the runs of both lanes side by side.
  const __m256i runs = _mm256_setr_epi8(0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11, z, z, z, z,  //
                                        0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11, z, z, z, z);
  const __m256i pair = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256 mul[3], add[3];
  for (int c = 0; c < 3; ++c) {
    mul[c] = _mm256_set1_ps(o.mul[c]);
    add[c] = _mm256_set1_ps(o.add[c]);
  }
  size_t i = 0;
  for (; i + 10 <= n; i += 8) {
    const uint8_t* p = rgb + 3 * i;
    const __m256i px = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 12)), 1);
    if constexpr (D == DType::kUInt8) {
      const __m256i v = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(px, runs), pair);
      const uint64_t r = _mm256_extract_epi64(v, 0), g = _mm256_extract_epi64(v, 1),
                     b = _mm256_extract_epi64(v, 2);
      std::memcpy(out[0] + i, &r, 8);
      std::memcpy(out[1] + i, &g, 8);
      std::memcpy(out[2] + i, &b, 8);
    } else {
      for (int c = 0; c < 3; ++c) {
        const __m256 f = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(px, channel[c]));
        Store8<D>(_mm256_add_ps(_mm256_mul_ps(f, mul[c]), add[c]), out[c], i);
      }
    }
  }
  return i;
}

// Interleaved float32/bfloat16: eight pixels are 24 values in three runs of eight, whose
// channels repeat with period 3. Returns the pixels done.
template <DType D>
__attribute__((target("avx2"))) size_t InterleavedAvx2(const Rgb24Out& o, const uint8_t* rgb,
                                                       size_t n, uint8_t* const out[3]) {
  const Period3Factors f(o.mul, o.add);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) f.Convert24<D>(rgb + 3 * i, out[0], 3 * i);
  return i;
}

size_t Avx2(const Rgb24Out& o, bool planar, const uint8_t* rgb, size_t n, uint8_t* const out[3]) {
  switch (o.dtype) {
    case DType::kFloat32:
      return planar ? PlanarAvx2<DType::kFloat32>(o, rgb, n, out)
                    : InterleavedAvx2<DType::kFloat32>(o, rgb, n, out);
    case DType::kBFloat16:
      return planar ? PlanarAvx2<DType::kBFloat16>(o, rgb, n, out)
                    : InterleavedAvx2<DType::kBFloat16>(o, rgb, n, out);
    default:  // uint8; interleaved never comes here (Rgb24ToOutput copies it as it is)
      return planar ? PlanarAvx2<DType::kUInt8>(o, rgb, n, out) : 0;
  }
}

}  // namespace

void Rgb24ToOutput(const Rgb24Out& o, bool planar, const uint8_t* rgb, size_t n,
                   uint8_t* const out[3]) {
  if (n == 0) return;  // (memcpy is not given an empty vector's null data)
  if (!planar && o.dtype == DType::kUInt8) {
    std::memcpy(out[0], rgb, 3 * n);
    return;
  }
  const size_t done = UseAvx2() ? Avx2(o, planar, rgb, n, out) : 0;
  Portable(o, planar, rgb, done, n, out);
}

}  // namespace mmfeed
