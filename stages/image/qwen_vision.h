// The arithmetic of Qwen's vision preprocessing (Hugging Face's Qwen2VLImageProcessor), shared
// by the qwen_vision stage and its tests.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "base/tensor.h"

namespace mmfeed {

struct QwenSize {
  int64_t height = 0, width = 0;
};

// smart_resize: sides rounded to multiples of `factor`, scaled down (floor) to fit max_pixels or
// up (ceil) to reach min_pixels, the aspect ratio kept. An aspect ratio above 200 is refused.
Result<QwenSize> QwenSmartResize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                 int64_t max_pixels);

struct QwenPatching {
  int patch_size = 16, temporal_patch_size = 2, merge_size = 2;
  int64_t PatchValues() const { return int64_t{3} * temporal_patch_size * patch_size * patch_size; }
};

// Cuts a resized image (8-bit CHW, sides multiples of patch_size * merge_size) into the
// reference's rows: (height / patch_size) * (width / patch_size) rows of PatchValues() values,
// each 8-bit level v of channel c written as lut[c][v], as float32 or bfloat16.
void QwenPatchify(const uint8_t* chw, int height, int width, const QwenPatching& p,
                  const float* const lut[3], DType dtype, uint8_t* out);

}  // namespace mmfeed
