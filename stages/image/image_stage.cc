// The `image` stage: decode (libjpeg-turbo for JPEG, OpenCV for the rest), crop, resize, flip,
// normalize, and lay out as uint8 HWC/CHW or float32/bfloat16 CHW/HWC. Random choices are drawn
// from Rng(seed, epoch, sample id, stage name): the same config gives the same bytes whatever the
// worker count.
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <opencv2/core.hpp>

#include "base/rng.h"
#include "engine/registry.h"
#include "stages/image/image_decoder.h"

namespace mmfeed {
namespace {

enum class Crop { kNone, kCenter, kRandomResized };

struct ImageParams {
  std::string name;
  Crop crop = Crop::kNone;
  int out_h = 0, out_w = 0;
  int resize = 0;  // center crop: shorter side first resized to this (0: largest centered crop)
  double scale_lo = 0.08, scale_hi = 1.0, ratio_lo = 3.0 / 4, ratio_hi = 4.0 / 3;
  double flip = 0;
  float mul[3] = {1, 1, 1}, add[3] = {0, 0, 0};  // out = pixel * mul + add (normalize fused)
  DType dtype = DType::kUInt8;
  bool chw = false;
  int64_t max_pixels = 0;
  bool dct_scaling = true;  // decode JPEGs at 1/2, 1/4, 1/8 size when the output is that small
  bool dct_asked = false;   // dct_scaling: on (not auto)
  bool output_box = false;  // also output <name>_box: the source box shown, and the flip
};

// Python's round(): halves to even, as torchvision's arithmetic rounds.
int RoundHalfEven(double v) { return static_cast<int>(std::nearbyint(v)); }

// torchvision.transforms.RandomResizedCrop.get_params, drawn from our Rng.
cv::Rect RandomResizedCropRect(int width, int height, const ImageParams& p, Rng& rng) {
  double area = static_cast<double>(width) * height;
  double log_lo = std::log(p.ratio_lo), log_hi = std::log(p.ratio_hi);
  for (int attempt = 0; attempt < 10; ++attempt) {
    double target = area * rng.Uniform(p.scale_lo, p.scale_hi);
    double aspect = std::exp(rng.Uniform(log_lo, log_hi));
    int w = RoundHalfEven(std::sqrt(target * aspect));
    int h = RoundHalfEven(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      int y = static_cast<int>(rng.Below(static_cast<uint64_t>(height - h + 1)));
      int x = static_cast<int>(rng.Below(static_cast<uint64_t>(width - w + 1)));
      return {x, y, w, h};
    }
  }
  double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < p.ratio_lo)
    h = RoundHalfEven(w / p.ratio_lo);
  else if (in_ratio > p.ratio_hi)
    w = RoundHalfEven(h * p.ratio_hi);
  return {(width - w) / 2, (height - h) / 2, w, h};
}

// A box of the source resized to `out` pixels (torchvision's crop, then resize).
AxisMap BoxAxis(int box_start, int box_size, int out) {
  return {static_cast<double>(box_start),
          static_cast<double>(box_size) / out,
          box_start,
          box_start + box_size,
          0,
          out};
}

// What of the source each output pixel comes from, per axis, in source pixels; `*box` is the
// source region the output shows.
void MapAxes(int width, int height, const ImageParams& p, Rng& rng, AxisMap* x, AxisMap* y,
             cv::Rect* box) {
  switch (p.crop) {
    case Crop::kNone:
      *box = {0, 0, width, height};
      break;
    case Crop::kRandomResized:
      *box = RandomResizedCropRect(width, height, p, rng);
      break;
    case Crop::kCenter:
      if (p.resize > 0) {
        // torchvision's Resize(resize) + CenterCrop(size): the shorter side becomes `resize`,
        // the longer one int(resize * long / short); the crop starts at round((side - crop)/2).
        const bool portrait = width <= height;
        const int s = portrait ? width : height, l = portrait ? height : width;
        const int new_long = static_cast<int>(static_cast<int64_t>(p.resize) * l / s);
        const int new_w = portrait ? p.resize : new_long, new_h = portrait ? new_long : p.resize;
        const int left = RoundHalfEven((new_w - p.out_w) / 2.0),
                  top = RoundHalfEven((new_h - p.out_h) / 2.0);
        *x = {0, static_cast<double>(width) / new_w, 0, width, left, p.out_w};
        *y = {0, static_cast<double>(height) / new_h, 0, height, top, p.out_h};
        *box = {static_cast<int>(left * x->scale), static_cast<int>(top * y->scale),
                static_cast<int>(std::lround(p.out_w * x->scale)),
                static_cast<int>(std::lround(p.out_h * y->scale))};
        return;
      } else {  // the largest centered region with the output's aspect ratio
        const double a = static_cast<double>(p.out_w) / p.out_h;
        const double cw = std::min<double>(width, height * a);
        const int w = std::max(1, static_cast<int>(std::lround(cw))),
                  h = std::max(1, static_cast<int>(std::lround(cw / a)));
        *box = {(width - w) / 2, (height - h) / 2, w, h};
      }
      break;
  }
  *x = BoxAxis(box->x, box->width, p.out_w);
  *y = BoxAxis(box->y, box->height, p.out_h);
}

// What the workers decoded at full size for a `cache:` (OwnCache): the profile's estimate of a
// cache entry's bytes.
struct DecodeTally {
  std::atomic<uint64_t> images{0}, bytes{0};
};

class ImageWorker : public StageWorker {
 public:
  ImageWorker(const ImageParams& p, DecodeTally* tally) : p_(p), tally_(tally) {}

  Status Process(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) override {
    int w = 0, h = 0;
    std::shared_ptr<const std::string> pixels;  // a `cache:`'s decoded image (OwnCache)
    if (ctx.memo) {
      MMFEED_RETURN_IF_ERROR(Decoded(*ctx.memo, in, &pixels, &w, &h));
    } else {
      MMFEED_ASSIGN_OR_RETURN(std::string_view bytes, FieldBytes(in, &file_));
      MMFEED_RETURN_IF_ERROR(decoder_.Open(bytes, p_.max_pixels, "max_pixels", &w, &h));
    }
    tally_->images.fetch_add(1, std::memory_order_relaxed);
    tally_->bytes.fetch_add(8 + static_cast<uint64_t>(w) * h * 3, std::memory_order_relaxed);
    Rng rng(ctx.seed, ctx.epoch, ctx.id, p_.name);
    AxisMap x, y;
    cv::Rect box;
    MapAxes(w, h, p_, rng, &x, &y, &box);
    ResampleOutput o;
    o.flip = p_.flip > 0 && rng.Uniform() < p_.flip;
    o.dtype = p_.dtype;
    o.chw = p_.chw;
    o.mul = p_.mul;
    o.add = p_.add;
    MMFEED_RETURN_IF_ERROR(
        decoder_.Resample(x, y, Filter::kBilinear, p_.dct_scaling, o, &resampler_, out[0]));
    if (p_.output_box) {
      const int32_t b[5] = {box.x, box.y, box.width, box.height, o.flip ? 1 : 0};
      std::memcpy(out[1], b, sizeof(b));
    }
    return Status::Ok();
  }

  static std::vector<TensorSpec> OutputSpecs(const ImageParams& p) {
    TensorSpec s;
    s.name = p.name;
    s.dtype = p.dtype;
    s.shape = p.chw ? std::vector<int64_t>{3, p.out_h, p.out_w}
                    : std::vector<int64_t>{p.out_h, p.out_w, 3};
    if (!p.output_box) return {s};
    TensorSpec b;
    b.name = p.name + "_box";
    b.dtype = DType::kInt32;
    b.shape = {5};
    return {s, b};
  }

 private:
  // The sample's image decoded at full size, from the cache or decoded now and offered to it:
  // its width and height (int32), then its RGB rows.
  Status Decoded(SampleMemo& memo, const FieldValue& in, std::shared_ptr<const std::string>* pixels,
                 int* w, int* h) {
    *pixels = memo.Find();
    if (!*pixels) {
      MMFEED_ASSIGN_OR_RETURN(std::string_view bytes, FieldBytes(in, &file_));
      MMFEED_RETURN_IF_ERROR(decoder_.Open(bytes, p_.max_pixels, "max_pixels", w, h));
      const int32_t size[2] = {*w, *h};
      std::string kept(sizeof size + static_cast<size_t>(*w) * *h * 3, '\0');
      std::memcpy(kept.data(), size, sizeof size);
      MMFEED_RETURN_IF_ERROR(
          decoder_.DecodeFull(reinterpret_cast<uint8_t*>(kept.data() + sizeof size)));
      *pixels = memo.Keep(std::move(kept));
    }
    int32_t size[2];
    std::memcpy(size, (*pixels)->data(), sizeof size);
    *w = size[0];
    *h = size[1];
    decoder_.UseDecoded(reinterpret_cast<const uint8_t*>((*pixels)->data() + sizeof size), *w, *h);
    return Status::Ok();
  }

  const ImageParams& p_;
  DecodeTally* tally_;
  ImageDecoder decoder_;
  Resampler resampler_;
  std::string file_;
};

class ImageStage : public Stage {
 public:
  explicit ImageStage(ImageParams p) : p_(std::move(p)) {}
  std::vector<TensorSpec> OutputSpecs() const override { return ImageWorker::OutputSpecs(p_); }
  std::unique_ptr<StageWorker> NewWorker() const override {
    return std::make_unique<ImageWorker>(p_, &tally_);
  }
  WhyNot WhyNotCacheable() const override {
    const std::string decoded =
        p_.dct_asked ? "; with dct_scaling: auto or off, a cache keeps the decoded pixels" : "";
    if (p_.crop == Crop::kRandomResized)
      return "crop: random_resized_crop draws a new crop every epoch" + decoded;
    if (p_.flip > 0) return "flip draws a new flip every epoch" + decoded;
    return std::nullopt;
  }
  std::optional<std::string> OwnCache() const override {
    if (p_.dct_asked) return std::nullopt;  // a full decode's pixels are not those it asked for
    return "each image decoded at full size (width x height x 3 bytes), then cropped, resized and "
           "flipped per epoch: outputs equal dct_scaling: off";
  }
  std::vector<std::string> CpuAdvice() const override {
    std::vector<std::string> out;
    if (p_.dtype != DType::kUInt8)
      out.push_back(fmt::format(
          "dtype: uint8 with the normalization on the GPU (mmfeed.torch.normalize, or the CUDA "
          "feeder's kernel): {} of {}'s bytes to write and copy, and no float math here",
          p_.dtype == DType::kFloat32 ? "a quarter" : "half", DTypeName(p_.dtype)));
    if (!p_.dct_scaling)
      out.push_back(
          "dct_scaling: on (JPEGs decoded at 1/2, 1/4 or 1/8 size when the output is that much "
          "smaller; pixels differ slightly from a full decode)");
    return out;
  }
  double CacheEntryBytes() const override {
    if (!WhyNotCacheable()) return Stage::CacheEntryBytes();
    if (!OwnCache()) return 0;
    const uint64_t n = tally_.images.load(std::memory_order_relaxed);
    return n ? static_cast<double>(tally_.bytes.load(std::memory_order_relaxed)) / n : 0;
  }

 private:
  ImageParams p_;
  mutable DecodeTally tally_;
};

Result<std::unique_ptr<Stage>> MakeImageStage(const StageArgs& a) {
  // Our workers are the parallelism: OpenCV's own thread pool inside cv::resize would only
  // compete with them for the same cores.
  cv::setNumThreads(0);
  const Params& prm = a.params;
  ImageParams p;
  p.name = a.name;
  const std::string& crop = prm.GetString("crop");
  p.crop = crop == "center"                ? Crop::kCenter
           : crop == "random_resized_crop" ? Crop::kRandomResized
                                           : Crop::kNone;
  const auto& size = prm.GetIntList("size");
  p.out_h = static_cast<int>(size[0]);
  p.out_w = static_cast<int>(size[1]);
  if (p.out_h < 1 || p.out_w < 1 || p.out_h > 16384 || p.out_w > 16384)
    return Status::Invalid("size must be [height, width] with each in 1..16384");
  p.resize = static_cast<int>(prm.GetInt("resize"));
  if (p.resize < 0) return Status::Invalid("resize must be >= 0");
  if (p.resize > 0 && p.resize < std::max(p.out_h, p.out_w))
    return Status::Invalid(
        fmt::format("resize {} is smaller than size [{}, {}]: the center crop "
                    "would leave the resized image",
                    p.resize, p.out_h, p.out_w));
  // DCT scaling changes pixels a little (up to ~2 levels mean on photos over twice the output):
  // the evaluation transform (center) stays exact unless asked.
  const std::string& dct = prm.GetString("dct_scaling");
  p.dct_scaling = dct == "on" || (dct == "auto" && p.crop != Crop::kCenter);
  p.dct_asked = dct == "on";
  p.output_box = prm.GetBool("output_box");
  const auto& scale = prm.GetFloatList("scale");
  const auto& ratio = prm.GetFloatList("ratio");
  p.scale_lo = scale[0];
  p.scale_hi = scale[1];
  p.ratio_lo = ratio[0];
  p.ratio_hi = ratio[1];
  if (!(0 < p.scale_lo && p.scale_lo <= p.scale_hi && p.scale_hi <= 1))
    return Status::Invalid("scale must be [lo, hi] with 0 < lo <= hi <= 1");
  if (!(0 < p.ratio_lo && p.ratio_lo <= p.ratio_hi))
    return Status::Invalid("ratio must be [lo, hi] with 0 < lo <= hi");
  p.flip = prm.GetFloat("flip");
  if (p.flip < 0 || p.flip > 1) return Status::Invalid("flip is a probability in [0, 1]");
  const auto& mean = prm.GetFloatList("mean");
  const auto& stdv = prm.GetFloatList("std");
  ParseDType(prm.GetString("dtype"), &p.dtype);
  p.chw = prm.GetString("layout") == "CHW";
  for (int c = 0; c < 3; ++c) {
    if (stdv[c] <= 0) return Status::Invalid("std values must be positive");
    if (p.dtype != DType::kUInt8) {
      p.mul[c] = static_cast<float>(1.0 / (255.0 * stdv[c]));
      p.add[c] = static_cast<float>(-mean[c] / stdv[c]);
    }
  }
  p.max_pixels = prm.GetInt("max_pixels");
  if (p.max_pixels < 1) return Status::Invalid("max_pixels must be positive");
  return std::unique_ptr<Stage>(new ImageStage(std::move(p)));
}

MMFEED_REGISTER_STAGE((StageSchema{
    "image",
    "decode an image (JPEG via libjpeg-turbo with DCT scaling and region decode; PNG and others "
    "via "
    "OpenCV), crop, resize, flip, normalize. Output tensor: <stage name>",
    StageKind::kField,
    /*field_is_path=*/true,
    {
        {"crop",
         ParamType::kString,
         std::string("none"),
         "none | center | random_resized_crop",
         {"none", "center", "random_resized_crop"}},
        Ranged({"size", ParamType::kIntList, std::nullopt, "output [height, width]", {}, 2}, 1,
               16384),
        Ranged({"resize", ParamType::kInt, int64_t{0},
                "center crop: resize the shorter side to this first (0: largest centered crop)"},
               0, std::nullopt),
        {"scale",
         ParamType::kFloatList,
         std::vector<double>{0.08, 1.0},
         "random_resized_crop area range",
         {},
         2},
        {"ratio",
         ParamType::kFloatList,
         std::vector<double>{3.0 / 4, 4.0 / 3},
         "random_resized_crop aspect range",
         {},
         2},
        Ranged({"flip", ParamType::kFloat, 0.0, "probability of a horizontal flip"}, 0, 1),
        PixelMeanParam(),
        PixelStdParam(),
        PixelDTypeParam(),
        {"layout", ParamType::kString, std::string("HWC"), "HWC | CHW", {"HWC", "CHW"}},
        Ranged({"max_pixels", ParamType::kInt, int64_t{89478485},
                "refuse images with more pixels (checked before decoding)"},
               1, std::nullopt),
        {"dct_scaling",
         ParamType::kString,
         std::string("auto"),
         "on: decode JPEGs at 1/2, 1/4 or 1/8 size when the output is at least that much smaller "
         "(faster; pixels differ slightly from a full decode) | off: always at full size | auto: "
         "on, except for crop: center (the evaluation transform stays exact)",
         {"auto", "on", "off"}},
        {"output_box", ParamType::kBool, false,
         "also output <name>_box, int32 [x, y, width, height, flipped]: the source pixels the "
         "output shows"},
    },
    MakeImageStage}));

}  // namespace
}  // namespace mmfeed
