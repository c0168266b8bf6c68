// JpegDecoder: decodes the part of a JPEG that an output needs, with libjpeg-turbo, row by row
// as the resampler reads them.
//
// Four things make it fast: the DCT scaling of libjpeg-turbo (decode at n/8 of full size when
// the output is much smaller), jpeg_crop_scanline (decode only the iMCU columns a crop covers),
// jpeg_skip_scanlines / stopping early (decode only the rows it covers), and decoding each row
// just before the resampler reads it into a window of a few rows, so that decoded pixels are
// read while they are still in the cache and no image-sized buffer exists. One decoder per
// worker thread; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdio>
// jpeglib.h needs size_t and FILE declared before it.
#include <jpeglib.h>

#include <csetjmp>
#include <opencv2/core.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "stages/common/resample.h"

namespace mmfeed {

bool LooksLikeJpeg(std::string_view data);

class JpegDecoder : public RowSource {
 public:
  JpegDecoder();
  ~JpegDecoder() override;
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Reads the header only: full-resolution width and height.
  Status ReadSize(std::string_view data, int* width, int* height);

  // The image's side `size` decoded at DCT scale `scale_num`/8 (libjpeg rounds up).
  static int ScaledSize(int size, int scale_num) { return (size * scale_num + 7) / 8; }

  // Starts decoding `region` of the image scaled by `scale_num`/8 (coordinates in the scaled
  // image, inside it) as RGB; `data` must outlive the decoding. The columns decoded are whole
  // iMCU columns covering the region: width() pixels from x0() on. Rows are decoded as Row asks
  // for them, into a window of the last `window_rows` rows (memory kept from image to image);
  // rows below the last one asked for are never decoded. End() stops; Start ends the previous
  // image. kUnsupported for JPEGs that cannot be given as RGB (CMYK).
  // REQUIRES: 1 <= scale_num <= 8, window_rows >= 1.
  Status Start(std::string_view data, int scale_num, const cv::Rect& region, int window_rows);
  // Row y of the scaled image, for region.y <= y < region.y + region.height and no more than
  // window_rows - 1 above the lowest row asked for since Start; nullptr when the row cannot be
  // decoded (a damaged or truncated file) or was not asked for that way: status() says why.
  const uint8_t* Row(int y) override;
  int x0() const override { return x0_; }
  int readable() const override { return width_ * 3 + kSlack; }
  int width() const { return width_; }
  const Status& status() const { return status_; }
  void End();

  struct ErrorManager {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
  };

 private:
  // libjpeg-turbo's SIMD colour conversion writes a row that starts on a 32-byte boundary with
  // non-temporal stores, which bypass the cache: the resampler's reads of it, right after, then
  // wait for memory. A row that starts 16 bytes off one is written with ordinary stores.
  static constexpr int kSlack = 16;  // bytes past the last row that may be read
  static uint8_t* Unaligned(uint8_t* p) {
    return p + (16 - reinterpret_cast<uintptr_t>(p) % 32 + 32) % 32;
  }
  uint8_t* WindowRow(int y) {
    return Unaligned(buffer_.data()) + static_cast<size_t>(y % window_) * width_ * 3;
  }

  jpeg_decompress_struct cinfo_;
  ErrorManager err_;
  bool started_ = false;
  int x0_ = 0, width_ = 0;
  int first_ = 0, end_ = 0;  // the region's rows: [first_, end_)
  int next_ = 0;             // the next row libjpeg gives
  int window_ = 1;
  Status status_;
  std::vector<uint8_t> buffer_;  // window_ rows of width_ pixels; row y at y % window_
};

}  // namespace mmfeed
