#include "stages/image/image_decoder.h"

#include <fmt/format.h>

#include <cstring>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

namespace mmfeed {
namespace {

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

Status CheckPixels(int64_t w, int64_t h, int64_t max_pixels, const char* limit_name) {
  if (w <= 0 || h <= 0) return Status::Corrupt("image has no pixels");
  if (w * h > max_pixels)
    return Status::TooLarge(fmt::format("image is {}x{} = {} pixels, above {} {}", w, h, w * h,
                                        limit_name, max_pixels));
  return Status::Ok();
}

}  // namespace

Status ImageDecoder::Open(std::string_view data, int64_t max_pixels, const char* limit_name,
                          int* width, int* height) {
  data_ = data;
  max_pixels_ = max_pixels;
  limit_name_ = limit_name;
  whole_ = false;
  if (borrowed_) decoded_ = cv::Mat();  // never decode into the cache's pixels
  borrowed_ = false;
  if (data.empty()) return Status::Corrupt("empty file (0 bytes)");
  if (LooksLikeJpeg(data)) {
    MMFEED_RETURN_IF_ERROR(jpeg_.ReadSize(data, &width_, &height_));
    MMFEED_RETURN_IF_ERROR(CheckPixels(width_, height_, max_pixels, limit_name));
  } else {
    int64_t pw, ph;
    if (PngSize(data, &pw, &ph))
      MMFEED_RETURN_IF_ERROR(CheckPixels(pw, ph, max_pixels, limit_name));
    MMFEED_RETURN_IF_ERROR(DecodeWhole());
  }
  *width = width_;
  *height = height_;
  return Status::Ok();
}

Status ImageDecoder::DecodeWhole() {
  cv::Mat buf(1, static_cast<int>(data_.size()), CV_8UC1, const_cast<char*>(data_.data()));
  cv::Mat bgr;
  try {
    bgr = cv::imdecode(buf, cv::IMREAD_COLOR);
  } catch (const cv::Exception& e) {
    return Status::Corrupt(std::string("image decode: ") + e.what());
  }
  if (bgr.empty()) return Status::Corrupt("not a decodable image (unknown or damaged format)");
  MMFEED_RETURN_IF_ERROR(CheckPixels(bgr.cols, bgr.rows, max_pixels_, limit_name_));
  cv::cvtColor(bgr, decoded_, cv::COLOR_BGR2RGB);
  width_ = decoded_.cols;
  height_ = decoded_.rows;
  whole_ = true;
  return Status::Ok();
}

Status ImageDecoder::DecodeFull(uint8_t* rgb) {
  const size_t row = static_cast<size_t>(width_) * 3;
  if (!whole_) {
    Status st = jpeg_.Start(data_, 8, cv::Rect(0, 0, width_, height_), 1);
    if (st.ok()) {
      for (int y = 0; y < height_; ++y) {
        const uint8_t* r = jpeg_.Row(y);
        if (!r) {
          jpeg_.End();
          return jpeg_.status();
        }
        std::memcpy(rgb + y * row, r, row);
      }
      jpeg_.End();
      return Status::Ok();
    }
    if (st.code() != Status::Code::kUnsupported) return st;
    MMFEED_RETURN_IF_ERROR(DecodeWhole());  // as Resample does
  }
  for (int y = 0; y < height_; ++y) std::memcpy(rgb + y * row, decoded_.ptr<uint8_t>(y), row);
  return Status::Ok();
}

void ImageDecoder::UseDecoded(const uint8_t* rgb, int width, int height) {
  decoded_ = cv::Mat(height, width, CV_8UC3, const_cast<uint8_t*>(rgb));
  borrowed_ = true;
  width_ = width;
  height_ = height;
  whole_ = true;
}

Status ImageDecoder::Resample(const AxisMap& x, const AxisMap& y, Filter filter, bool dct_scaling,
                              const ResampleOutput& o, Resampler* resampler, uint8_t* out) {
  if (!whole_) {
    // Only 1/8, 2/8, 4/8 and 8/8: libjpeg-turbo has SIMD IDCTs for those, while the other
    // scales run plain C (perf showed jpeg_idct_6x6, _10x10, _12x12 ... at the top).
    int n = dct_scaling ? 1 : 8;
    while (n < 8 && (x.scale * n < 8 || y.scale * n < 8)) n *= 2;
    AxisMap sx = x, sy = y;
    if (n < 8) {
      sx = x.Scaled(n / 8.0, JpegDecoder::ScaledSize(width_, n));
      sy = y.Scaled(n / 8.0, JpegDecoder::ScaledSize(height_, n));
    }
    const cv::Rect need = resampler->Plan(sx, sy, filter);
    Status st = jpeg_.Start(data_, n, need, resampler->window_rows());
    if (st.ok()) {
      const bool ok = resampler->Run(jpeg_, o, out);
      jpeg_.End();
      return ok ? Status::Ok() : jpeg_.status();
    }
    if (st.code() != Status::Code::kUnsupported) return st;
    MMFEED_RETURN_IF_ERROR(DecodeWhole());  // a JPEG libjpeg-turbo will not give as RGB (CMYK)
  }
  resampler->Plan(x, y, filter);
  resampler->Run(decoded_, {0, 0}, o, out);
  return Status::Ok();
}

}  // namespace mmfeed
