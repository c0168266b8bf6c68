#include "stages/image/jpeg_decoder.h"

#include <fmt/format.h>
#include <jerror.h>

#include <algorithm>

namespace mmfeed {
namespace {

void OnError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegDecoder::ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are mostly harmless, but a file that ends early would be padded with gray by
// libjpeg: we refuse it instead, so a truncated file is counted rather than trained on.
void OnMessage(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) OnError(cinfo);
}

}  // namespace

bool LooksLikeJpeg(std::string_view d) {
  return d.size() >= 3 && static_cast<unsigned char>(d[0]) == 0xFF &&
         static_cast<unsigned char>(d[1]) == 0xD8 && static_cast<unsigned char>(d[2]) == 0xFF;
}

JpegDecoder::JpegDecoder() {
  cinfo_.err = jpeg_std_error(&err_.pub);
  err_.pub.error_exit = OnError;
  err_.pub.emit_message = OnMessage;
  jpeg_create_decompress(&cinfo_);
}

JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&cinfo_); }

Status JpegDecoder::ReadSize(std::string_view data, int* width, int* height) {
  if (setjmp(err_.jump)) {
    jpeg_abort_decompress(&cinfo_);
    return Status::Corrupt(std::string("JPEG header: ") + err_.message);
  }
  jpeg_mem_src(&cinfo_, reinterpret_cast<const unsigned char*>(data.data()), data.size());
  jpeg_read_header(&cinfo_, TRUE);
  *width = static_cast<int>(cinfo_.image_width);
  *height = static_cast<int>(cinfo_.image_height);
  jpeg_abort_decompress(&cinfo_);
  return Status::Ok();
}

Status JpegDecoder::Start(std::string_view data, int scale_num, const cv::Rect& region,
                          int window_rows) {
  End();
  if (setjmp(err_.jump)) {
    jpeg_abort_decompress(&cinfo_);
    return Status::Corrupt(std::string("JPEG decode: ") + err_.message);
  }
  jpeg_mem_src(&cinfo_, reinterpret_cast<const unsigned char*>(data.data()), data.size());
  jpeg_read_header(&cinfo_, TRUE);
  if (cinfo_.jpeg_color_space == JCS_CMYK || cinfo_.jpeg_color_space == JCS_YCCK) {
    jpeg_abort_decompress(&cinfo_);
    return Status::Unsupported("CMYK JPEG");
  }
  cinfo_.out_color_space = JCS_RGB;
  cinfo_.scale_num = static_cast<unsigned>(scale_num);
  cinfo_.scale_denom = 8;
  // Accurate IDCT and fancy upsampling, as PIL and torchvision decode: the fast IDCT moved
  // pixels by 0.9 levels on average, merged upsampling by up to 95 on cropped decodes.
  cinfo_.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&cinfo_);
  const cv::Rect r = region & cv::Rect(0, 0, static_cast<int>(cinfo_.output_width),
                                       static_cast<int>(cinfo_.output_height));
  if (r.empty()) {
    jpeg_abort_decompress(&cinfo_);
    return Status::Corrupt("the region to decode is outside the image");
  }
  // One pixel more on each side where the image goes on: the fancy upsampling of the first and
  // last decoded columns of a crop has no chroma sample beyond them and repeats its own (up to
  // 13 levels off a full decode), so the region must not begin or end on the crop's iMCU
  // boundary; with them the region's pixels are a full decode's.
  const int left = r.x > 0 ? 1 : 0,
            right = r.x + r.width < static_cast<int>(cinfo_.output_width) ? 1 : 0;
  JDIMENSION xoff = static_cast<JDIMENSION>(r.x - left),
             w = static_cast<JDIMENSION>(r.width + left + right);
  if (w < cinfo_.output_width) jpeg_crop_scanline(&cinfo_, &xoff, &w);  // widens to iMCU bounds
  if (r.y > 0) jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(r.y));
  x0_ = static_cast<int>(xoff);
  width_ = static_cast<int>(w);
  first_ = next_ = r.y;
  end_ = r.y + r.height;
  window_ = std::max(1, window_rows);
  const size_t bytes = static_cast<size_t>(window_) * width_ * 3 + 32 + kSlack;  // + Unaligned
  if (buffer_.size() < bytes) buffer_.resize(bytes);
  status_ = Status::Ok();
  started_ = true;
  return Status::Ok();
}

const uint8_t* JpegDecoder::Row(int y) {
  if (!started_ || y < first_ || y >= end_ || y < next_ - window_) {
    if (status_.ok())
      status_ =
          Status::Invalid(fmt::format("JPEG row {} asked for outside the rows [{}, {}) "
                                      "decoded so far, or out of order",
                                      y, std::max(first_, next_ - window_), next_));
    return nullptr;
  }
  if (y >= next_) {
    if (setjmp(err_.jump)) {
      status_ = Status::Corrupt(std::string("JPEG decode: ") + err_.message);
      End();
      return nullptr;
    }
    while (next_ <= y) {
      JSAMPROW row = WindowRow(next_);
      jpeg_read_scanlines(&cinfo_, &row, 1);
      ++next_;
    }
  }
  return WindowRow(y);
}

void JpegDecoder::End() {
  if (!started_) return;
  started_ = false;
  jpeg_abort_decompress(&cinfo_);  // stop: the rows below are never decoded
}

}  // namespace mmfeed
