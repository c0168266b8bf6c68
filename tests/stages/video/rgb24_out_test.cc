#include "stages/video/rgb24_out.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/simd.h"

namespace mmfeed {
namespace {

// Every layout and dtype, pixel counts around the AVX2 steps (8 pixels, stopping 10 before the
// end when planar): the AVX2 kernels give the portable loops' bytes, and those are the formula.
// Factors: mean/std-like ones, pixel + 0.5 (every pixel from 128 on is a bfloat16 tie, rounded
// to even), an infinite one (NaN at pixel 0) and a NaN with a payload (quieted as ToBFloat16
// does, not rounded).
TEST(Rgb24OutTest, Avx2GivesThePortableBytesAndThoseTheFormula) {
  std::mt19937 rng(7);
  for (DType dtype : {DType::kUInt8, DType::kFloat32, DType::kBFloat16})
    for (bool planar : {true, false})
      for (int factors = 0; factors < 3; ++factors)
        for (size_t n : {0, 1, 7, 8, 9, 10, 11, 17, 18, 19, 33, 1000, 1003}) {
          SCOPED_TRACE(testing::Message() << "dtype " << static_cast<int>(dtype) << " planar "
                                          << planar << " factors " << factors << " pixels " << n);
          Rgb24Out o;
          o.dtype = dtype;
          for (int c = 0; c < 3; ++c) {
            o.mul[c] = 1.0f / (255.0f * (0.2f + 0.05f * c + 0.001f * (n % 7)));
            o.add[c] = -(0.4f + 0.03f * c) / (0.2f + 0.05f * c);
            if (factors == 1) {
              o.mul[c] = 1.0f;
              o.add[c] = 0.5f;
            }
          }
          if (factors == 2) {
            o.mul[1] = std::numeric_limits<float>::infinity();
            const uint32_t payload = 0x7fc0ffffu;  // a NaN whose low bits would round up
            std::memcpy(&o.add[2], &payload, 4);
          }
          std::vector<uint8_t> rgb(3 * n);
          for (uint8_t& b : rgb) b = static_cast<uint8_t>(rng());
          const size_t size = DTypeSize(dtype), bytes = 3 * n * size;
          std::vector<uint8_t> fast(bytes + 1, 0xAB), portable(bytes + 1, 0xAB);
          auto parts = [&](std::vector<uint8_t>& v) -> std::array<uint8_t*, 3> {
            if (!planar) return {v.data(), nullptr, nullptr};
            return {v.data(), v.data() + n * size, v.data() + 2 * n * size};
          };
          Rgb24ToOutput(o, planar, rgb.data(), n, parts(fast).data());
          UsePortableKernels(true);
          Rgb24ToOutput(o, planar, rgb.data(), n, parts(portable).data());
          UsePortableKernels(false);
          ASSERT_EQ(fast, portable);
          EXPECT_EQ(fast[bytes], 0xAB) << "wrote past the output";
          for (size_t i = 0; i < n; ++i)
            for (int c = 0; c < 3; ++c) {
              const size_t at = planar ? c * n + i : 3 * i + c;
              const uint8_t p = rgb[3 * i + c];
              const float v = static_cast<float>(p) * o.mul[c] + o.add[c];
              if (dtype == DType::kUInt8)
                ASSERT_EQ(fast[at], p);
              else if (dtype == DType::kFloat32)
                ASSERT_EQ(std::memcmp(fast.data() + 4 * at, &v, 4), 0);
              else
                ASSERT_EQ(reinterpret_cast<const uint16_t*>(fast.data())[at], ToBFloat16(v));
            }
        }
}

}  // namespace
}  // namespace mmfeed
