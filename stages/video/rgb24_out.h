// The video stage's last step for a picked frame: swscale's RGB24 pixels into the output's
// layout and dtype, in one pass. Planar (TCHW, CTHW: three channel planes) or interleaved
// (THWC), uint8 as they are or float32/bfloat16 as pixel * mul[c] + add[c] (multiplied, then
// added: no FMA; bfloat16 rounded to nearest even as ToBFloat16). AVX2 where the CPU has it,
// eight pixels a step; the portable loops give the same bytes (base/simd.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/tensor.h"

namespace mmfeed {

// The output's values: the dtype, and for float32 and bfloat16 the factors.
struct Rgb24Out {
  DType dtype = DType::kUInt8;
  float mul[3] = {1, 1, 1}, add[3] = {0, 0, 0};  // float32, bfloat16: pixel * mul + add
};

// `n` pixels of `rgb` (3 bytes each) into `out`: the R, G and B planes (`planar`), or out[0]
// (interleaved).
void Rgb24ToOutput(const Rgb24Out& o, bool planar, const uint8_t* rgb, size_t n,
                   uint8_t* const out[3]);

}  // namespace mmfeed
