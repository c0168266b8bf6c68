// The arithmetic of Qwen's vision preprocessing (Hugging Face's Qwen2VLImageProcessor and
// Qwen3VLVideoProcessor), shared by the qwen_vision and qwen_video stages and their tests.
#pragma once

#include <cstdint>
#include <vector>

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

// The video processor's smart_resize: the same over num_frames * height * width pixels (frames
// counted rounded to temporal_factor, as the reference does), after growing a side below
// `factor` to it. Fewer frames than temporal_factor, or an aspect ratio above 200, are refused.
Result<QwenSize> QwenVideoSmartResize(int64_t frames, int64_t height, int64_t width,
                                      int64_t temporal_factor, int64_t factor, int64_t min_pixels,
                                      int64_t max_pixels);

// The video processor's sample_frames: int(total / source_fps * fps) frames, clamped to
// [min_frames, max_frames] and to the video's total, at indices linspace(0, total - 1, n)
// rounded half to even.
std::vector<int64_t> QwenVideoFrameIndices(int64_t total, double source_fps, double fps,
                                           int64_t min_frames, int64_t max_frames);

struct QwenPatching {
  int patch_size = 16, temporal_patch_size = 2, merge_size = 2;
  int64_t PatchValues() const { return int64_t{3} * temporal_patch_size * patch_size * patch_size; }
};

// Cuts temporal_patch_size resized frames (8-bit CHW, sides multiples of patch_size *
// merge_size; an image is its frame given that many times) into the reference's rows:
// (height / patch_size) * (width / patch_size) rows of PatchValues() values, each 8-bit level v
// of channel c written as lut[c][v], as float32 or bfloat16.
void QwenPatchify(const uint8_t* const* frames, int height, int width, const QwenPatching& p,
                  const float* const lut[3], DType dtype, uint8_t* out);

}  // namespace mmfeed
