// JpegDecoder: decodes the part of a JPEG that an output needs, with libjpeg-turbo.
//
// Three things make it fast: the DCT scaling of libjpeg-turbo (decode at n/8 of full size when
// the output is much smaller), jpeg_crop_scanline (decode only the iMCU columns a crop covers)
// and jpeg_skip_scanlines / stopping early (decode only the rows it covers). One decoder per
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

namespace mmfeed {

bool LooksLikeJpeg(std::string_view data);

class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Reads the header only: full-resolution width and height.
  Status ReadSize(std::string_view data, int* width, int* height);

  // The image's side `size` decoded at DCT scale `scale_num`/8 (libjpeg rounds up).
  static int ScaledSize(int size, int scale_num) { return (size * scale_num + 7) / 8; }

  // Decodes `region` of the image scaled by `scale_num`/8 (coordinates in the scaled image,
  // inside it) into RGB: `*out` covers it, possibly wider (whole iMCU columns), and `*origin` is
  // where out's top-left pixel lies in the scaled image. Rows below the region are not decoded.
  // `*out` refers to the decoder's own memory, valid until its next DecodeRegion.
  // REQUIRES: 1 <= scale_num <= 8.
  Status DecodeRegion(std::string_view data, int scale_num, const cv::Rect& region, cv::Mat* out,
                      cv::Point* origin);

  struct ErrorManager {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
  };

 private:
  jpeg_decompress_struct cinfo_;
  ErrorManager err_;
  std::vector<uint8_t> buffer_;  // the decoded pixels, reused
};

}  // namespace mmfeed
