// ImageDecoder: the decoding half of the image stages. JPEGs are decoded with libjpeg-turbo row
// by row as the Resampler reads them (at a DCT scale when the output is much smaller, and only
// the rows and iMCU columns the resize reads); PNG and every other format OpenCV reads are
// decoded whole. One per worker thread; the bytes must outlive the decoding.
#pragma once

#include <cstdint>
#include <opencv2/core.hpp>
#include <string_view>

#include "base/status.h"
#include "stages/common/resample.h"
#include "stages/image/jpeg_decoder.h"

namespace mmfeed {

class ImageDecoder {
 public:
  // Reads the image's size: from a JPEG's header, else by decoding it (a PNG's header is read
  // first, so that a huge PNG is refused before it is decoded). An image of more than
  // `max_pixels` is kTooLarge (the message names the stage's parameter `limit_name`); an
  // empty or undecodable one kCorrupt.
  Status Open(std::string_view data, int64_t max_pixels, const char* limit_name, int* width,
              int* height);

  // Resizes the opened image as `x` and `y` say (in full-size pixels) into `out`. With
  // `dct_scaling`, a JPEG is decoded at the smallest of 1/8, 1/4, 1/2 of its size that leaves
  // it at least as large as the output (libjpeg-turbo's SIMD IDCTs; pixels differ slightly
  // from a full decode).
  Status Resample(const AxisMap& x, const AxisMap& y, Filter filter, bool dct_scaling,
                  const ResampleOutput& o, Resampler* resampler, uint8_t* out);

  // The opened image decoded whole at full size (a JPEG without DCT scaling, the same pixels a
  // region decode gives) into `rgb`: width x height RGB rows, what UseDecoded reads.
  Status DecodeFull(uint8_t* rgb);
  // Takes `rgb` (width x height RGB rows, outliving the decoding; from DecodeFull) as the
  // opened image, which Resample then reads as it reads a PNG (no DCT scaling).
  void UseDecoded(const uint8_t* rgb, int width, int height);

 private:
  Status DecodeWhole();

  std::string_view data_;
  int width_ = 0, height_ = 0;
  bool whole_ = false;  // decoded_ holds the image (not a JPEG, or one libjpeg will not give)
  int64_t max_pixels_ = 0;
  const char* limit_name_ = "";
  JpegDecoder jpeg_;
  cv::Mat decoded_;
  bool borrowed_ = false;  // decoded_ is UseDecoded's pixels (read only)
};

}  // namespace mmfeed
