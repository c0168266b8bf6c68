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
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/registry.h"
#include "stages/common/qwen_patches.h"
#include "stages/image/image_decoder.h"

namespace mmfeed {

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
  WhyNot WhyNotCacheable() const override { return std::nullopt; }

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
