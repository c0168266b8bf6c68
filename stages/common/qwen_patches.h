// The arithmetic of Qwen's vision preprocessing (Hugging Face's Qwen2VLImageProcessor and
// Qwen3VLVideoProcessor), shared by the qwen_vision and qwen_video stages and their tests: the
// stage families share it here (stages/common/), not through each other's folders.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/tensor.h"
#include "engine/registry.h"

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

// What the qwen_vision and qwen_video stages share: their outputs, the patching, the pixel
// budget, how many values a sample may list, and the normalization.
struct QwenStageParams {
  std::string name, grid_name;
  std::string cu_seqlens_name;  // "": no cu_seqlens output
  QwenPatching patching;
  int64_t min_pixels = 0, max_pixels = 0;
  int64_t max_patches = 0;  // per image or video: max_pixels / patch_size^2
  int max_items = 1;        // max_images, max_videos
  DType dtype = DType::kFloat32;
  float lut[3][256];  // normalized value of each 8-bit level, per channel
};

// Their shared schema entries: patch_size, temporal_patch_size, merge_size, mean, std, dtype,
// cu_seqlens.
std::vector<ParamSpec> QwenParamSpecs();

// Reads the shared entries and grid, min_pixels, max_pixels and `list_key` (max_images,
// max_videos). max_pixels must hold `min_windows` merge windows (a video: one per frame of a
// temporal patch).
Status ParseQwenParams(const StageArgs& a, const char* list_key, int64_t min_windows,
                       QwenStageParams* p);

// <name> [max_items * max_patches, PatchValues()] (ragged by the grid), <grid> int32
// [max_items, 3] (ragged by the count), <grid>_count int32 [].
std::vector<TensorSpec> QwenOutputSpecs(const QwenStageParams& p);
// With cu_seqlens set, appends <cu_seqlens> int32, filled when a batch is committed: where each
// temporal patch of each image or video of the batch begins among its patches, then their
// total ([sum of t + 1]), as Qwen's vision encoder computes from the grids for its
// variable-length attention. `per_item`: the most temporal patches one value has.
void AddQwenCuSeqlens(const QwenStageParams& p, int64_t per_item, std::vector<TensorSpec>* specs);

// Runs `one` on each value of the field (one, or a list of up to max_items; an empty list is
// a sample without any): value i writes its patches at `rows`, right after value i - 1's, and
// its [t, h, w] at `grid`. Fills the grid and count outputs; `noun` names a value in errors.
using QwenItemFn =
    std::function<Status(const FieldValue& in, size_t i, uint8_t* rows, int32_t* grid)>;
Status QwenEachItem(const QwenStageParams& p, const char* noun, const FieldValue& in,
                    const OutputRow& out, const QwenItemFn& one);

}  // namespace mmfeed
