#include "stages/image/jpeg_decoder.h"

#include <fmt/format.h>
#include <jerror.h>

#include <algorithm>
#include <cmath>

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

Status JpegDecoder::DecodeRegion(std::string_view data, const cv::Rect& roi, int scale_num, cv::Mat* out,
                                 cv::Rect2d* roi_in_out) {
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
  cinfo_.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&cinfo_);
  const double s = static_cast<double>(cinfo_.output_width) / cinfo_.image_width;
  const double sy = static_cast<double>(cinfo_.output_height) / cinfo_.image_height;
  // The roi in scaled coordinates, widened to whole pixels.
  int x0 = std::clamp(static_cast<int>(std::floor(roi.x * s)), 0, static_cast<int>(cinfo_.output_width) - 1);
  int x1 = std::clamp(static_cast<int>(std::ceil((roi.x + roi.width) * s)), x0 + 1, static_cast<int>(cinfo_.output_width));
  int y0 = std::clamp(static_cast<int>(std::floor(roi.y * sy)), 0, static_cast<int>(cinfo_.output_height) - 1);
  int y1 = std::clamp(static_cast<int>(std::ceil((roi.y + roi.height) * sy)), y0 + 1, static_cast<int>(cinfo_.output_height));
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), w = static_cast<JDIMENSION>(x1 - x0);
  if (w < cinfo_.output_width) jpeg_crop_scanline(&cinfo_, &xoff, &w);  // widens to iMCU bounds
  if (y0 > 0) jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(y0));
  out->create(y1 - y0, static_cast<int>(w), CV_8UC3);
  while (cinfo_.output_scanline < static_cast<JDIMENSION>(y1)) {
    JSAMPROW row = out->ptr<uint8_t>(static_cast<int>(cinfo_.output_scanline) - y0);
    jpeg_read_scanlines(&cinfo_, &row, 1);
  }
  jpeg_abort_decompress(&cinfo_);  // stop: the rows below the roi are never decoded
  *roi_in_out = cv::Rect2d(roi.x * s - xoff, roi.y * sy - y0, roi.width * s, roi.height * sy);
  return Status::Ok();
}

}  // namespace mmfeed
