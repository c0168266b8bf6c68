// The `image` stage: decode (libjpeg-turbo for JPEG, OpenCV for the rest), crop, resize, flip,
// normalize, and lay out as uint8 HWC/CHW or float32 CHW/HWC. Random choices are drawn from
// Rng(seed, epoch, sample id, stage name): the same config gives the same bytes whatever the
// worker count.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "stages/image/jpeg_decoder.h"
#include "stages/runtime/registry.h"
#include "stages/runtime/rng.h"

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
};

// PNG keeps its size at a fixed place; read it so a huge PNG is refused before decoding.
bool PngSize(std::string_view d, int64_t* w, int64_t* h) {
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (d.size() < 24 || std::memcmp(d.data(), sig, 8) != 0) return false;
  auto be32 = [&](size_t o) {
    const auto* p = reinterpret_cast<const unsigned char*>(d.data() + o);
    return (int64_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
  };
  *w = be32(16);
  *h = be32(20);
  return true;
}

// torchvision.transforms.RandomResizedCrop.get_params, drawn from our Rng.
cv::Rect RandomResizedCropRect(int width, int height, const ImageParams& p, Rng& rng) {
  double area = static_cast<double>(width) * height;
  double log_lo = std::log(p.ratio_lo), log_hi = std::log(p.ratio_hi);
  for (int attempt = 0; attempt < 10; ++attempt) {
    double target = area * rng.Uniform(p.scale_lo, p.scale_hi);
    double aspect = std::exp(rng.Uniform(log_lo, log_hi));
    int w = static_cast<int>(std::lround(std::sqrt(target * aspect)));
    int h = static_cast<int>(std::lround(std::sqrt(target / aspect)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      int y = static_cast<int>(rng.Below(static_cast<uint64_t>(height - h + 1)));
      int x = static_cast<int>(rng.Below(static_cast<uint64_t>(width - w + 1)));
      return {x, y, w, h};
    }
  }
  double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < p.ratio_lo) h = static_cast<int>(std::lround(w / p.ratio_lo));
  else if (in_ratio > p.ratio_hi) w = static_cast<int>(std::lround(h * p.ratio_hi));
  return {(width - w) / 2, (height - h) / 2, w, h};
}

cv::Rect CropRect(int width, int height, const ImageParams& p, Rng& rng) {
  switch (p.crop) {
    case Crop::kNone: return {0, 0, width, height};
    case Crop::kRandomResized: return RandomResizedCropRect(width, height, p, rng);
    case Crop::kCenter: {
      double cw, ch;
      if (p.resize > 0) {
        double s = static_cast<double>(p.resize) / std::min(width, height);
        cw = std::min<double>(width, p.out_w / s);
        ch = std::min<double>(height, p.out_h / s);
      } else {  // the largest centered region with the output's aspect ratio
        double a = static_cast<double>(p.out_w) / p.out_h;
        cw = std::min<double>(width, height * a);
        ch = cw / a;
      }
      int w = std::max(1, static_cast<int>(std::lround(cw))), h = std::max(1, static_cast<int>(std::lround(ch)));
      return {(width - w) / 2, (height - h) / 2, w, h};
    }
  }
  return {0, 0, width, height};
}

class ImageWorker : public StageWorker {
 public:
  explicit ImageWorker(const ImageParams& p) : p_(p) {}

  Status Process(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) override {
    Result<std::string_view> bytes = FieldBytes(in, &file_);
    if (!bytes.ok()) return bytes.status();
    std::string_view data = *bytes;
    if (data.empty()) return Status::Corrupt("empty file (0 bytes)");
    Rng rng(ctx.seed, ctx.epoch, ctx.id, p_.name);
    cv::Mat region;
    cv::Rect2d roi;
    if (LooksLikeJpeg(data)) {
      int w = 0, h = 0;
      MMFEED_RETURN_IF_ERROR(jpeg_.ReadSize(data, &w, &h));
      MMFEED_RETURN_IF_ERROR(CheckPixels(w, h));
      cv::Rect crop = CropRect(w, h, p_, rng);
      // The smallest DCT scale that still leaves the crop at least as large as the output.
      // Only 1/8, 2/8, 4/8 and 8/8: libjpeg-turbo has SIMD IDCTs for those, while the other
      // scales run plain C (perf showed jpeg_idct_6x6, _10x10, _12x12 ... at the top).
      int n = 1;
      while (n < 8 && (crop.width * n < p_.out_w * 8 || crop.height * n < p_.out_h * 8)) n *= 2;
      Status st = jpeg_.DecodeRegion(data, crop, n, &region, &roi);
      if (st.code() == Status::Code::kUnsupported) {
        MMFEED_RETURN_IF_ERROR(DecodeWithOpenCv(data, &decoded_));
        region = decoded_;
        roi = cv::Rect2d(crop);
      } else if (!st.ok()) {
        return st;
      }
    } else {
      int64_t pw, ph;
      if (PngSize(data, &pw, &ph)) MMFEED_RETURN_IF_ERROR(CheckPixels(pw, ph));
      MMFEED_RETURN_IF_ERROR(DecodeWithOpenCv(data, &decoded_));
      MMFEED_RETURN_IF_ERROR(CheckPixels(decoded_.cols, decoded_.rows));
      region = decoded_;
      roi = cv::Rect2d(CropRect(decoded_.cols, decoded_.rows, p_, rng));
    }
    bool flip = p_.flip > 0 && rng.Uniform() < p_.flip;

    cv::Rect r(static_cast<int>(std::lround(roi.x)), static_cast<int>(std::lround(roi.y)),
               std::max(1, static_cast<int>(std::lround(roi.width))), std::max(1, static_cast<int>(std::lround(roi.height))));
    r &= cv::Rect(0, 0, region.cols, region.rows);
    if (r.empty()) return Status::Corrupt("crop outside the decoded image");
    bool shrink_a_lot = r.width > 2 * p_.out_w || r.height > 2 * p_.out_h;
    cv::resize(region(r), resized_, cv::Size(p_.out_w, p_.out_h), 0, 0,
               shrink_a_lot ? cv::INTER_AREA : cv::INTER_LINEAR);

    WriteOutput(resized_, flip, out[0]);
    return Status::Ok();
  }

  static TensorSpec OutputSpec(const ImageParams& p) {
    TensorSpec s;
    s.name = p.name;
    s.dtype = p.dtype;
    s.shape = p.chw ? std::vector<int64_t>{3, p.out_h, p.out_w} : std::vector<int64_t>{p.out_h, p.out_w, 3};
    return s;
  }

 private:
  Status CheckPixels(int64_t w, int64_t h) const {
    if (w <= 0 || h <= 0) return Status::Corrupt("image has no pixels");
    if (w * h > p_.max_pixels)
      return Status::TooLarge(fmt::format("image is {}x{} = {} pixels, above max_pixels {}", w, h, w * h, p_.max_pixels));
    return Status::Ok();
  }

  Status DecodeWithOpenCv(std::string_view data, cv::Mat* out) {
    cv::Mat buf(1, static_cast<int>(data.size()), CV_8UC1, const_cast<char*>(data.data()));
    cv::Mat bgr;
    try {
      bgr = cv::imdecode(buf, cv::IMREAD_COLOR);
    } catch (const cv::Exception& e) {
      return Status::Corrupt(std::string("image decode: ") + e.what());
    }
    if (bgr.empty()) return Status::Corrupt("not a decodable image (unknown or damaged format)");
    cv::cvtColor(bgr, *out, cv::COLOR_BGR2RGB);
    return Status::Ok();
  }

  // Flip, normalize and change layout in one pass over the resized pixels.
  void WriteOutput(const cv::Mat& rgb, bool flip, uint8_t* out) {
    const int H = p_.out_h, W = p_.out_w;
    if (p_.dtype == DType::kUInt8) {
      uint8_t* dst = out;
      for (int y = 0; y < H; ++y) {
        const uint8_t* row = rgb.ptr<uint8_t>(y);
        for (int x = 0; x < W; ++x) {
          const uint8_t* px = row + 3 * (flip ? W - 1 - x : x);
          for (int c = 0; c < 3; ++c) {
            if (p_.chw) dst[(c * H + y) * W + x] = px[c];
            else dst[(y * W + x) * 3 + c] = px[c];
          }
        }
      }
      return;
    }
    float* dst = reinterpret_cast<float*>(out);
    const cv::Mat* src = &rgb;
    if (flip) {
      cv::flip(rgb, flipped_, 1);
      src = &flipped_;
    }
    if (p_.chw) {  // deinterleave, then scale+shift each plane (both SIMD in OpenCV)
      cv::split(*src, planes_);
      for (int c = 0; c < 3; ++c)
        planes_[c].convertTo(cv::Mat(H, W, CV_32F, dst + c * H * W), CV_32F, p_.mul[c], p_.add[c]);
    } else {
      for (int y = 0; y < H; ++y) {
        const uint8_t* row = src->ptr<uint8_t>(y);
        for (int x = 0; x < W; ++x)
          for (int c = 0; c < 3; ++c) dst[(y * W + x) * 3 + c] = row[3 * x + c] * p_.mul[c] + p_.add[c];
      }
    }
  }

  const ImageParams& p_;
  JpegDecoder jpeg_;
  std::string file_;
  cv::Mat decoded_, resized_, flipped_;
  cv::Mat planes_[3];
};

class ImageStage : public Stage {
 public:
  explicit ImageStage(ImageParams p) : p_(std::move(p)) {}
  std::vector<TensorSpec> OutputSpecs() const override { return {ImageWorker::OutputSpec(p_)}; }
  std::unique_ptr<StageWorker> NewWorker() const override { return std::make_unique<ImageWorker>(p_); }

 private:
  ImageParams p_;
};

Result<std::unique_ptr<Stage>> MakeImageStage(const StageArgs& a) {
  // Our workers are the parallelism: OpenCV's own thread pool inside cv::resize would only
  // compete with them for the same cores.
  cv::setNumThreads(0);
  const Params& prm = a.params;
  ImageParams p;
  p.name = a.name;
  const std::string& crop = prm.GetString("crop");
  p.crop = crop == "center" ? Crop::kCenter : crop == "random_resized_crop" ? Crop::kRandomResized : Crop::kNone;
  const auto& size = prm.GetIntList("size");
  p.out_h = static_cast<int>(size[0]);
  p.out_w = static_cast<int>(size[1]);
  if (p.out_h < 1 || p.out_w < 1 || p.out_h > 16384 || p.out_w > 16384)
    return Status::Invalid("size must be [height, width] with each in 1..16384");
  p.resize = static_cast<int>(prm.GetInt("resize"));
  if (p.resize < 0) return Status::Invalid("resize must be >= 0");
  const auto& scale = prm.GetFloatList("scale");
  const auto& ratio = prm.GetFloatList("ratio");
  p.scale_lo = scale[0];
  p.scale_hi = scale[1];
  p.ratio_lo = ratio[0];
  p.ratio_hi = ratio[1];
  if (!(0 < p.scale_lo && p.scale_lo <= p.scale_hi && p.scale_hi <= 1))
    return Status::Invalid("scale must be [lo, hi] with 0 < lo <= hi <= 1");
  if (!(0 < p.ratio_lo && p.ratio_lo <= p.ratio_hi)) return Status::Invalid("ratio must be [lo, hi] with 0 < lo <= hi");
  p.flip = prm.GetFloat("flip");
  if (p.flip < 0 || p.flip > 1) return Status::Invalid("flip is a probability in [0, 1]");
  const auto& mean = prm.GetFloatList("mean");
  const auto& stdv = prm.GetFloatList("std");
  ParseDType(prm.GetString("dtype"), &p.dtype);
  p.chw = prm.GetString("layout") == "CHW";
  for (int c = 0; c < 3; ++c) {
    if (stdv[c] <= 0) return Status::Invalid("std values must be positive");
    if (p.dtype == DType::kFloat32) {
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
    "decode an image (JPEG via libjpeg-turbo with DCT scaling and region decode; PNG and others via "
    "OpenCV), crop, resize, flip, normalize. Output tensor: <stage name>",
    StageKind::kField,
    /*field_is_path=*/true,
    {
        {"crop", ParamType::kString, std::string("none"), "none | center | random_resized_crop", {"none", "center", "random_resized_crop"}},
        {"size", ParamType::kIntList, std::nullopt, "output [height, width]", {}, 2},
        {"resize", ParamType::kInt, int64_t{0}, "center crop: resize the shorter side to this first (0: largest centered crop)"},
        {"scale", ParamType::kFloatList, std::vector<double>{0.08, 1.0}, "random_resized_crop area range", {}, 2},
        {"ratio", ParamType::kFloatList, std::vector<double>{3.0 / 4, 4.0 / 3}, "random_resized_crop aspect range", {}, 2},
        {"flip", ParamType::kFloat, 0.0, "probability of a horizontal flip"},
        {"mean", ParamType::kFloatList, std::vector<double>{0, 0, 0}, "float32: per-channel mean (of pixel/255)", {}, 3},
        {"std", ParamType::kFloatList, std::vector<double>{1, 1, 1}, "float32: per-channel std (of pixel/255)", {}, 3},
        {"dtype", ParamType::kString, std::string("uint8"), "uint8 (raw pixels) | float32 (pixel/255, normalized)", {"uint8", "float32"}},
        {"layout", ParamType::kString, std::string("HWC"), "HWC | CHW", {"HWC", "CHW"}},
        {"max_pixels", ParamType::kInt, int64_t{89478485}, "refuse images with more pixels (checked before decoding)"},
    },
    MakeImageStage}));

}  // namespace
}  // namespace mmfeed
