// The `qwen_vision` stage: an image as the Qwen2-VL / Qwen3-VL / Qwen3.5 vision encoders take
// it, computed as Hugging Face's Qwen2VLImageProcessor does: resized with PIL's antialiased
// bicubic to the size smart_resize gives (sides multiples of patch_size * merge_size, pixels
// within [min_pixels, max_pixels], aspect ratio kept), rescaled to [0, 1], normalized, repeated
// to temporal_patch_size frames and cut into patches, each merge window's patches together.
//
// The field is one image, or a list of up to max_images (a manifest's "images": [...]).
// Outputs, all ragged (a batch holds its samples' rows one after another): <name>, float32 or
// bfloat16 [patches, 3 * temporal_patch_size * patch_size^2] (every image's patches in order:
// [total patches, 1536] for Qwen3.5), <grid> int32 [images, 3] (each image's (t, h, w) in
// patches) and <grid>_count int32 [] (the sample's images).
#include "stages/image/qwen_vision.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/registry.h"
#include "stages/image/image_decoder.h"

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

namespace {

struct QwenParams {
  QwenStageParams q;
  int64_t max_source_pixels = 0;
  bool dct_scaling = true;
};

class QwenVisionWorker : public StageWorker {
 public:
  explicit QwenVisionWorker(const QwenParams& p) : p_(p) {}

  Status Process(const SampleContext&, const FieldValue& in, const OutputRow& out) override {
    return QwenEachItem(p_.q, "image", in, out,
                        [this](const FieldValue& one, size_t, uint8_t* rows, int32_t* grid) {
                          return Image(one, rows, grid);
                        });
  }

  Status Measure(const SampleContext&, const FieldValue& in, const OutputRow& out) override {
    return QwenEachItem(p_.q, "image", in, out,
                        [this](const FieldValue& one, size_t, uint8_t*, int32_t* grid) {
                          int w, h;
                          return Open(one, &w, &h, grid);
                        });
  }

 private:
  // Opens one image (its header read): its size and its grid, [1, h, w] in patches.
  Status Open(const FieldValue& in, int* w, int* h, int32_t* grid) {
    MMFEED_ASSIGN_OR_RETURN(std::string_view bytes, FieldBytes(in, &file_));
    MMFEED_RETURN_IF_ERROR(decoder_.Open(bytes, p_.max_source_pixels, "max_source_pixels", w, h));
    const QwenPatching& q = p_.q.patching;
    MMFEED_ASSIGN_OR_RETURN(QwenSize size, QwenSmartResize(*h, *w, q.patch_size * q.merge_size,
                                                           p_.q.min_pixels, p_.q.max_pixels));
    const int64_t patches = size.height * size.width / (q.patch_size * q.patch_size);
    if (patches > p_.q.max_patches)  // smart_resize's floor of one factor per side, at ratio ~200
      return Status::TooLarge(
          fmt::format("image is {}x{}: resized to {}x{} it has {} patches, "
                      "above the {} max_pixels allows",
                      *w, *h, size.width, size.height, patches, p_.q.max_patches));
    grid[0] = 1;
    grid[1] = static_cast<int32_t>(size.height / q.patch_size);
    grid[2] = static_cast<int32_t>(size.width / q.patch_size);
    return Status::Ok();
  }

  // One image's patches at `rows` and its grid.
  Status Image(const FieldValue& in, uint8_t* rows, int32_t* grid) {
    int w = 0, h = 0;
    MMFEED_RETURN_IF_ERROR(Open(in, &w, &h, grid));
    const QwenPatching& q = p_.q.patching;
    const int oh = grid[1] * q.patch_size, ow = grid[2] * q.patch_size;
    const AxisMap x{0, static_cast<double>(w) / ow, 0, w, 0, ow};
    const AxisMap y{0, static_cast<double>(h) / oh, 0, h, 0, oh};
    ResampleOutput o;
    o.chw = true;  // uint8, rounded as PIL's resize returns it
    resized_.resize(static_cast<size_t>(3) * oh * ow);
    MMFEED_RETURN_IF_ERROR(
        decoder_.Resample(x, y, Filter::kBicubic, p_.dct_scaling, o, &resampler_, resized_.data()));
    const float* lut[3] = {p_.q.lut[0], p_.q.lut[1], p_.q.lut[2]};
    const std::vector<const uint8_t*> frames(q.temporal_patch_size, resized_.data());
    QwenPatchify(frames.data(), oh, ow, q, lut, p_.q.dtype, rows);
    return Status::Ok();
  }

  const QwenParams& p_;
  ImageDecoder decoder_;
  Resampler resampler_;
  std::string file_;
  std::vector<uint8_t> resized_;
};

class QwenVisionStage : public Stage {
 public:
  explicit QwenVisionStage(QwenParams p) : p_(std::move(p)) {}
  std::vector<TensorSpec> OutputSpecs() const override {
    std::vector<TensorSpec> specs = QwenOutputSpecs(p_.q);
    AddQwenCuSeqlens(p_.q, 1, &specs);
    return specs;
  }
  std::unique_ptr<StageWorker> NewWorker() const override {
    return std::make_unique<QwenVisionWorker>(p_);
  }
  CostOutputs Costs() const override { return {"", p_.q.name}; }
  std::string WhyNotCacheable() const override { return ""; }

 private:
  QwenParams p_;
};

Result<std::unique_ptr<Stage>> MakeQwenVisionStage(const StageArgs& a) {
  QwenParams p;
  MMFEED_RETURN_IF_ERROR(ParseQwenParams(a, "max_images", 1, &p.q));
  p.max_source_pixels = a.params.GetInt("max_source_pixels");
  if (p.max_source_pixels < 1) return Status::Invalid("max_source_pixels must be positive");
  p.dct_scaling = a.params.GetString("dct_scaling") == "on";
  return std::unique_ptr<Stage>(new QwenVisionStage(std::move(p)));
}

std::vector<ParamSpec> QwenVisionParamSpecs() {
  std::vector<ParamSpec> specs = QwenParamSpecs();
  specs.insert(
      specs.end(),
      {
          Ranged(
              {"min_pixels", ParamType::kInt, int64_t{65536}, "smart_resize: smaller images grow"},
              0, std::nullopt),
          Ranged(
              {"max_pixels", ParamType::kInt, int64_t{16777216},
               "smart_resize: larger images shrink; also sizes the ring (max_pixels / patch_size^2 "
               "patches per image)"},
              std::nullopt, 1073741824),
          {"dct_scaling",
           ParamType::kString,
           std::string("on"),
           "on: decode JPEGs at 1/2, 1/4 or 1/8 size when the resized image is at least that "
           "much smaller (faster; pixels differ slightly from a full decode) | off: always full "
           "size",
           {"on", "off"}},
          Ranged({"max_source_pixels", ParamType::kInt, int64_t{89478485},
                  "refuse source images with more pixels (checked before decoding)"},
                 1, std::nullopt),
          {"grid", ParamType::kString, std::string("image_grid_thw"),
           "name of the grid output ([t, h, w] per image; <grid>_count: the sample's images)"},
          Ranged(
              {"max_images", ParamType::kInt, int64_t{1},
               "the most images a sample's field may list (\"images\": [...]); the ring reserves "
               "max_images * max_pixels / patch_size^2 patches per sample"},
              1, kMaxListItems),
      });
  return specs;
}

MMFEED_REGISTER_STAGE((StageSchema{
    "qwen_vision",
    "an image as Qwen2-VL/Qwen3-VL/Qwen3.5 vision encoders take it (Hugging Face's "
    "Qwen2VLImageProcessor): smart_resize, PIL's antialiased bicubic, normalize, patches in the "
    "reference's order; one image or a list. Outputs (ragged: a batch holds its samples' rows "
    "one after another): <name> [patches, 3 * temporal_patch_size * patch_size^2] "
    "([total_patches, 1536]), <grid> int32 [images, 3] (t, h, w in patches), <grid>_count "
    "int32 [] (images per sample)",
    StageKind::kField,
    /*field_is_path=*/true, QwenVisionParamSpecs(), MakeQwenVisionStage}));

}  // namespace
}  // namespace mmfeed
