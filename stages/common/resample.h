// Resampler: antialiased resizing as PIL's ImagingResample computes it (torchvision resizes PIL
// images with it; torch's _upsample_bilinear2d_aa shares the arithmetic): each output pixel is
// a normalized filter over the source (bilinear's triangle, or bicubic's a = -0.5 kernel, as
// Hugging Face image processors resize), widened by the scale when shrinking. As in PIL, the
// horizontal pass runs first on each source row, its results are rounded to 8 bits, then the
// vertical pass; both in fixed point (16-bit weights: PIL's are 22-bit, which moves a value by
// one level where the exact sum falls within a few thousandths of a rounding boundary). The
// passes are AVX2 kernels where the CPU has AVX2, else portable code with the same integer
// arithmetic (the same bytes).
//
// It computes a window of a virtual resize: "resize the source's [lo, hi) to N pixels, keep
// outputs [start, start + count)". torchvision's Resize(256) + CenterCrop(224) is one window
// of the full image's resize, and a crop box resized to the output (RandomResizedCrop) is the
// whole of a resize of the box; only the source pixels the window needs are read, so the
// decoder decodes only those. Flip, normalization and the output layout are fused into the
// last pass. Buffers are reused across images; one Resampler per worker thread.
#pragma once

#include <cstdint>
#include <opencv2/core.hpp>
#include <vector>

#include "base/tensor.h"

namespace mmfeed {

// One axis of a resize, in source pixel coordinates: output pixel i (of the whole resize) is
// centred at origin + (i + 0.5) * scale, and only source pixels in [lo, hi) are used.
struct AxisMap {
  double origin = 0, scale = 1;
  int lo = 0, hi = 0;
  int start = 0, count = 0;  // the outputs computed: [start, start + count)
  // The same axis on a source decoded at `factor` of its size (JPEG DCT scaling), `size` pixels.
  AxisMap Scaled(double factor, int size) const;
};

struct ResampleOutput {
  bool flip = false;            // mirror left-right
  DType dtype = DType::kUInt8;  // uint8, float32 or bfloat16
  bool chw = false;             // else HWC
  const float* mul = nullptr;   // float32, bfloat16: out = round(pixel) * mul[c] + add[c]
  const float* add = nullptr;
};

// The source pixels Resampler::Run reads, row by row, in the coordinates Plan used. Run asks for
// each row of Plan's rectangle once, top to bottom, and is done with it before it asks for the
// next (window_rows() is 1): a decoder can produce rows as they are asked for into one row of
// memory (JpegDecoder does).
class RowSource {
 public:
  virtual ~RowSource() = default;
  // Row y's 8-bit RGB pixels from column x0() on, or nullptr when it cannot be had (the source
  // says why).
  virtual const uint8_t* Row(int y) = 0;
  virtual int x0() const = 0;
  // The bytes that may be read from a Row() pointer on (at least the rectangle's pixels; a
  // source with padding past them lets the kernels' wide loads cover every output).
  virtual int readable() const = 0;
};

enum class Filter { kBilinear, kBicubic };

class Resampler {
 public:
  // Computes the filter taps of both axes; returns the source rectangle they read.
  cv::Rect Plan(const AxisMap& x, const AxisMap& y, Filter filter = Filter::kBilinear);
  // The rows a RowSource must keep for Run.
  int window_rows() const { return 1; }
  // Writes count_y x count_x pixels of 3 channels to `out` as `o` says, reading Plan's rectangle
  // from `src`. False when `src` failed to give a row.
  bool Run(RowSource& src, const ResampleOutput& o, uint8_t* out);
  // The same from an image in memory (8-bit RGB) that holds the source pixels from
  // `src_origin` on and covers Plan's rectangle.
  void Run(const cv::Mat& src, cv::Point src_origin, const ResampleOutput& o, uint8_t* out);

 private:
  struct Taps {
    std::vector<int> first;        // per output: its first source pixel, counted from `lo`
    std::vector<int> count;        // per output: taps
    std::vector<int16_t> weights;  // per output: `stride` weights (zero past `count`), in
                                   // fixed point: 1.0 is 1 << bits
    int stride = 0;
    int most = 0;  // the largest count
    int bits = 0;
    int lo = 0, hi = 0;  // source pixels read
  };
  static void Compute(const AxisMap& a, Filter filter, Taps* t, std::vector<double>* scratch);
  Taps x_, y_;
  std::vector<double> scratch_;
  // The horizontal taps laid out for the AVX2 kernel.
  std::vector<int16_t> x_pairs_;
  std::vector<int32_t> y_pairs_;  // the vertical taps in pairs for the AVX2 kernel
  std::vector<const uint8_t*> taps_;
  std::vector<uint8_t> rows_;     // the last y_.stride source rows after the horizontal pass, RGBX
  std::vector<uint8_t> out_row_;  // one output row after both passes, RGBX
};

}  // namespace mmfeed
