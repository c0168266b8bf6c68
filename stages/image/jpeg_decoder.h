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

  // Decodes `roi` (full-resolution pixel coordinates) at DCT scale `scale_num`/8 into RGB.
  // `*out` receives a region at least covering the scaled roi; `*roi_in_out` is where the scaled
  // roi lies inside it (fractional, for the resampler).
  // REQUIRES: ReadSize succeeded on the same data; 1 <= scale_num <= 8.
  Status DecodeRegion(std::string_view data, const cv::Rect& roi, int scale_num, cv::Mat* out,
                      cv::Rect2d* roi_in_out);

  struct ErrorManager {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
  };

 private:
  jpeg_decompress_struct cinfo_;
  ErrorManager err_;
};

}  // namespace mmfeed
