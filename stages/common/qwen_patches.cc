// The arithmetic of Qwen's vision preprocessing, shared by the qwen_vision (stages/image/) and
// qwen_video (stages/video/) stages: smart_resize, frame sampling, patching, the shared
// parameters and outputs (stages/common/qwen_patches.h).
#include "stages/common/qwen_patches.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/registry.h"

namespace mmfeed {

Result<QwenSize> QwenSmartResize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                 int64_t max_pixels) {
  if (height <= 0 || width <= 0) return Status::Corrupt("image has no pixels");
  const double ratio =
      static_cast<double>(std::max(height, width)) / static_cast<double>(std::min(height, width));
  if (ratio > 200)
    return Status::Invalid(fmt::format(
        "image is {}x{}: its aspect ratio {:.0f} is above 200, which Qwen's smart_resize refuses",
        width, height, ratio));
  const double f = static_cast<double>(factor);
  // Python's round() (halves to even), math.floor and math.ceil, as smart_resize uses them.
  auto round_by = [&](double v) { return static_cast<int64_t>(std::nearbyint(v / f)) * factor; };
  auto floor_by = [&](double v) { return static_cast<int64_t>(std::floor(v / f)) * factor; };
  auto ceil_by = [&](double v) { return static_cast<int64_t>(std::ceil(v / f)) * factor; };
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  int64_t hb = round_by(h), wb = round_by(w);
  if (hb * wb > max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    hb = std::max(factor, floor_by(h / beta));
    wb = std::max(factor, floor_by(w / beta));
  } else if (hb * wb < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    hb = ceil_by(h * beta);
    wb = ceil_by(w * beta);
  }
  // A side the reference would round to 0 (under half a factor, with min_pixels 0): one factor.
  return QwenSize{std::max(hb, factor), std::max(wb, factor)};
}

Result<QwenSize> QwenVideoSmartResize(int64_t frames, int64_t height, int64_t width,
                                      int64_t temporal_factor, int64_t factor, int64_t min_pixels,
                                      int64_t max_pixels) {
  if (frames < temporal_factor)
    return Status::Invalid(fmt::format(
        "{} frame(s) sampled: Qwen's video processor needs at least temporal_patch_size ({})",
        frames, temporal_factor));
  if (height <= 0 || width <= 0) return Status::Corrupt("video has no pixels");
  double h = static_cast<double>(height), w = static_cast<double>(width);
  const double f = static_cast<double>(factor);
  if (height < factor || width < factor) {  // grown to one factor, truncated as int() does
    const double scale = std::max(f / h, f / w);
    h = std::trunc(h * scale);
    w = std::trunc(w * scale);
  }
  const double ratio = std::max(h, w) / std::min(h, w);
  if (ratio > 200)
    return Status::Invalid(fmt::format(
        "video is {}x{}: its aspect ratio {:.0f} is above 200, which Qwen's smart_resize refuses",
        width, height, ratio));
  auto round_by = [](double v, double by) { return std::nearbyint(v / by) * by; };
  const double n = static_cast<double>(frames);
  double hb = round_by(h, f), wb = round_by(w, f);
  const double tb = round_by(n, static_cast<double>(temporal_factor));
  if (tb * hb * wb > static_cast<double>(max_pixels)) {
    const double beta = std::sqrt(n * h * w / static_cast<double>(max_pixels));
    hb = std::max(f, std::floor(h / beta / f) * f);
    wb = std::max(f, std::floor(w / beta / f) * f);
  } else if (tb * hb * wb < static_cast<double>(min_pixels)) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (n * h * w));
    hb = std::ceil(h * beta / f) * f;
    wb = std::ceil(w * beta / f) * f;
  }
  return QwenSize{static_cast<int64_t>(hb), static_cast<int64_t>(wb)};
}

std::vector<int64_t> QwenVideoFrameIndices(int64_t total, double source_fps, double fps,
                                           int64_t min_frames, int64_t max_frames) {
  if (total < 1) return {};
  // int() of a positive float truncates; above max_frames (a tiny declared rate) it is clamped
  // anyway, so it is clamped before the conversion.
  const double want = static_cast<double>(total) / source_fps * fps;
  int64_t n = want < static_cast<double>(max_frames) ? static_cast<int64_t>(want) : max_frames;
  n = std::min({std::max(n, min_frames), max_frames, total});
  std::vector<int64_t> indices(n);
  // numpy's linspace: i * step, the last exactly the end; then round half to even.
  const double step = n > 1 ? static_cast<double>(total - 1) / static_cast<double>(n - 1) : 0.0;
  for (int64_t i = 0; i < n; ++i)
    indices[i] = static_cast<int64_t>(std::nearbyint(static_cast<double>(i) * step));
  if (n > 1) indices[n - 1] = total - 1;
  return indices;
}

void QwenPatchify(const uint8_t* const* frames, int height, int width, const QwenPatching& p,
                  const float* const lut[3], DType dtype, uint8_t* out) {
  const int ps = p.patch_size, ms = p.merge_size, tps = p.temporal_patch_size;
  const size_t plane = static_cast<size_t>(height) * width;
  const size_t row_len = static_cast<size_t>(3) * tps * ps * ps;
  const size_t frame = static_cast<size_t>(ps) * ps, value = DTypeSize(dtype);
  auto* f32 = reinterpret_cast<float*>(out);
  auto* b16 = reinterpret_cast<uint16_t*>(out);
  size_t row = 0;
  // The reference's order: merge windows in raster order, the patches of a window in raster
  // order; within a patch, channel, then time, then the patch's rows and columns.
  for (int by = 0; by < height / (ps * ms); ++by)
    for (int bx = 0; bx < width / (ps * ms); ++bx)
      for (int my = 0; my < ms; ++my)
        for (int mx = 0; mx < ms; ++mx, ++row) {
          const int y0 = (by * ms + my) * ps, x0 = (bx * ms + mx) * ps;
          size_t at = row * row_len;
          for (int c = 0; c < 3; ++c) {
            for (int t = 0; t < tps; ++t) {
              if (t > 0 && frames[t] == frames[t - 1]) {  // an image: its frame again
                std::memcpy(out + (at + t * frame) * value, out + (at + (t - 1) * frame) * value,
                            frame * value);
                continue;
              }
              for (int py = 0; py < ps; ++py) {
                const uint8_t* src =
                    frames[t] + c * plane + static_cast<size_t>(y0 + py) * width + x0;
                const size_t d = at + t * frame + static_cast<size_t>(py) * ps;
                if (dtype == DType::kBFloat16)
                  for (int px = 0; px < ps; ++px) b16[d + px] = ToBFloat16(lut[c][src[px]]);
                else
                  for (int px = 0; px < ps; ++px) f32[d + px] = lut[c][src[px]];
              }
            }
            at += tps * frame;
          }
        }
}

std::vector<ParamSpec> QwenParamSpecs() {
  return {
      Ranged({"patch_size", ParamType::kInt, int64_t{16}, "side of a patch, in pixels"}, 1, 64),
      Ranged(
          {"temporal_patch_size", ParamType::kInt, int64_t{2},
           "frames per patch (an image is its frame repeated; a video's last frame repeats to fill "
           "its last patch)"},
          1, 8),
      Ranged({"merge_size", ParamType::kInt, int64_t{2},
              "patches per side of a merge window: sides are multiples of patch_size * merge_size"},
             1, 8),
      {"mean",
       ParamType::kFloatList,
       std::vector<double>{0.5, 0.5, 0.5},
       "per-channel mean (of pixel/255)",
       {},
       3},
      {"std",
       ParamType::kFloatList,
       std::vector<double>{0.5, 0.5, 0.5},
       "per-channel std (of pixel/255)",
       {},
       3},
      {"dtype",
       ParamType::kString,
       std::string("float32"),
       "float32 | bfloat16 (the float32 value rounded to the nearest bfloat16)",
       {"float32", "bfloat16"}},
      {"cu_seqlens", ParamType::kString, std::string(""),
       "name of an int32 output [sum of t + 1] per batch: where each temporal patch of each "
       "image/video begins among the batch's patches, then the total (the vision encoder's "
       "cu_seqlens); \"\": none"},
  };
}

Status ParseQwenParams(const StageArgs& a, const char* list_key, int64_t min_windows,
                       QwenStageParams* p) {
  const Params& prm = a.params;
  p->name = a.name;
  p->grid_name = prm.GetString("grid");
  if (p->grid_name.empty() || p->grid_name == p->name)
    return Status::Invalid("grid must name an output other than the stage's own");
  p->cu_seqlens_name = prm.GetString("cu_seqlens");
  for (const std::string& taken :
       {p->name, p->grid_name, p->grid_name + "_count", p->grid_name + "_seconds"})
    if (p->cu_seqlens_name == taken)
      return Status::Invalid("cu_seqlens must name an output of its own");
  QwenPatching& q = p->patching;
  q.patch_size = static_cast<int>(prm.GetInt("patch_size"));
  q.temporal_patch_size = static_cast<int>(prm.GetInt("temporal_patch_size"));
  q.merge_size = static_cast<int>(prm.GetInt("merge_size"));
  if (q.patch_size < 1 || q.patch_size > 64 || q.merge_size < 1 || q.merge_size > 8 ||
      q.temporal_patch_size < 1 || q.temporal_patch_size > 8)
    return Status::Invalid(
        "patch_size must be in 1..64, merge_size and temporal_patch_size in 1..8");
  const int64_t factor = q.patch_size * q.merge_size;
  p->min_pixels = prm.GetInt("min_pixels");
  p->max_pixels = prm.GetInt("max_pixels");
  const int64_t least = factor * factor * min_windows;
  if (p->max_pixels < least || p->max_pixels > (int64_t{1} << 30))
    return Status::Invalid(
        fmt::format("max_pixels must be in {}..{} (at least {} {}x{} merge window(s))", least,
                    int64_t{1} << 30, min_windows, factor, factor));
  if (p->min_pixels < 0 || p->min_pixels > p->max_pixels)
    return Status::Invalid(fmt::format("min_pixels must be in 0..max_pixels ({})", p->max_pixels));
  p->max_patches = p->max_pixels / (q.patch_size * q.patch_size);
  const int64_t items = prm.GetInt(list_key);
  if (items < 1 || items > static_cast<int64_t>(kMaxListItems))
    return Status::Invalid(fmt::format("{} must be in 1..{}", list_key, kMaxListItems));
  p->max_items = static_cast<int>(items);
  ParseDType(prm.GetString("dtype"), &p->dtype);
  const auto& mean = prm.GetFloatList("mean");
  const auto& stdv = prm.GetFloatList("std");
  for (int c = 0; c < 3; ++c) {
    if (stdv[c] <= 0) return Status::Invalid("std values must be positive");
    // As the reference computes it: v * (1/255), then (x - mean) / std, in float32.
    const float mean_c = static_cast<float>(mean[c]), std_c = static_cast<float>(stdv[c]);
    for (int v = 0; v < 256; ++v)
      p->lut[c][v] = (static_cast<float>(v * (1.0 / 255)) - mean_c) / std_c;
  }
  return Status::Ok();
}

std::vector<TensorSpec> QwenOutputSpecs(const QwenStageParams& p) {
  const std::string count = p.grid_name + "_count";
  return {{p.name, p.dtype, {p.max_items * p.max_patches, p.patching.PatchValues()}, p.grid_name},
          {p.grid_name, DType::kInt32, {p.max_items, 3}, count},
          {count, DType::kInt32, {}}};
}

void AddQwenCuSeqlens(const QwenStageParams& p, int64_t per_item, std::vector<TensorSpec>* specs) {
  if (p.cu_seqlens_name.empty()) return;
  specs->push_back(
      {p.cu_seqlens_name, DType::kInt32, {p.max_items * per_item + 1}, "", p.grid_name});
}

Status QwenEachItem(const QwenStageParams& p, const char* noun, const FieldValue& in,
                    const OutputRow& out, const QwenItemFn& one) {
  const bool list = in.kind == FieldValue::Kind::kList;
  const size_t n = list ? in.items.size() : 1;
  if (n > static_cast<size_t>(p.max_items))
    return Status::TooLarge(fmt::format("{} {}s, above max_{}s {}", n, noun, noun, p.max_items));
  auto* grids = out.As<int32_t>(1);
  std::memset(grids, 0, sizeof(int32_t) * 3 * p.max_items);  // rows past the last value
  *out.As<int32_t>(2) = static_cast<int32_t>(n);
  const size_t row_bytes = static_cast<size_t>(p.patching.PatchValues()) * DTypeSize(p.dtype);
  uint8_t* rows = out[0];
  for (size_t i = 0; i < n; ++i) {
    int32_t* grid = grids + 3 * i;
    Status st = one(list ? in.items[i] : in, i, rows, grid);
    if (!st.ok()) return list ? st.WithContext(fmt::format("{} {} of {}", noun, i + 1, n)) : st;
    if (rows)
      rows += static_cast<size_t>(grid[0]) * grid[1] * grid[2] * row_bytes;  // Measure: null
  }
  return Status::Ok();
}

}  // namespace mmfeed
