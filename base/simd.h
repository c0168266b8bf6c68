// What the hand-vectorised kernels (the image resampler, the video stage's conversion, the audio
// log-mel) share: whether to run their AVX2 or AVX-512 code, vectors of 8 and 16 floats, and the
// AVX2 float -> bfloat16 step and float stores. Every kernel keeps a portable version that gives
// the same bytes; tests compare the two.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "base/tensor.h"

namespace mmfeed {

// True when the CPU has AVX2 and tests have not asked for the portable code.
bool UseAvx2();
// True when the CPU has AVX-512F and tests have not asked for the portable code.
bool UseAvx512();
// Tests: run the portable code even where the CPU has AVX2 or AVX-512.
void UsePortableKernels(bool portable);

// Eight and sixteen floats as GCC vectors: their operators work lane by lane, and a float operand
// is broadcast, so one template reads the same for a float and a vector of them. Code that does
// arithmetic on them runs in AVX2 (Float8) or AVX-512 (Float16) functions; they are passed by
// reference (by value, outside such code, they would change the calling convention).
using Float8 = float __attribute__((vector_size(32)));
using Float16 = float __attribute__((vector_size(64)));

// Eight floats as bfloat16 bits, rounded as ToBFloat16 (base/tensor.h) rounds them: to the
// nearest even, a NaN quieted instead.
__attribute__((target("avx2"))) inline __m128i BFloat16x8(__m256 f) {
  const __m256i b = _mm256_castps_si256(f);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), odd), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
  const __m256i h = _mm256_blendv_epi8(rounded, quiet, nan);
  // [h0-3 h0-3 | h4-7 h4-7] as 16 bits, then the first quarter of each lane.
  const __m256i packed = _mm256_packus_epi32(h, h);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// Eight floats to values [at, at + 8) of a float32 or bfloat16 buffer `base`.
template <DType D>
__attribute__((target("avx2"))) inline void Store8(__m256 v, uint8_t* base, size_t at) {
  static_assert(D == DType::kFloat32 || D == DType::kBFloat16);
  if constexpr (D == DType::kFloat32)
    _mm256_storeu_ps(reinterpret_cast<float*>(base) + at, v);
  else
    _mm_storeu_si128(reinterpret_cast<__m128i*>(reinterpret_cast<uint16_t*>(base) + at),
                     BFloat16x8(v));
}

// Interleaved RGB values: 24 (eight pixels) are three runs of eight whose channels repeat with
// period 3. Run k's factors (value i is channel (8k + i) % 3's), from per-channel `mul`, `add`.
struct Period3Factors {
  __m256 mul[3], add[3];
  __attribute__((target("avx2"))) Period3Factors(const float* m, const float* a) {
    for (int k = 0; k < 3; ++k) {
      float mk[8], ak[8];
      for (int i = 0; i < 8; ++i) {
        mk[i] = m[(8 * k + i) % 3];
        ak[i] = a[(8 * k + i) % 3];
      }
      mul[k] = _mm256_loadu_ps(mk);
      add[k] = _mm256_loadu_ps(ak);
    }
  }
  // The 24 uint8 values at `rgb` as values [at, at + 24) of `out`: v x mul + add (multiply,
  // then add: no FMA, as the portable loops round).
  template <DType D>
  __attribute__((target("avx2"))) void Convert24(const uint8_t* rgb, uint8_t* out,
                                                 size_t at) const {
    for (int k = 0; k < 3; ++k) {
      const __m256i b =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rgb + 8 * k)));
      Store8<D>(_mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(b), mul[k]), add[k]), out,
                at + 8 * k);
    }
  }
};

}  // namespace mmfeed
