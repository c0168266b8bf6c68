#include "stages/image/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mmfeed {

AxisMap AxisMap::Scaled(double factor, int size) const {
  AxisMap s = *this;
  s.origin = origin * factor;
  s.scale = scale * factor;
  s.lo = std::clamp(static_cast<int>(std::floor(lo * factor + 1e-9)), 0, size - 1);
  s.hi = std::clamp(static_cast<int>(std::ceil(hi * factor - 1e-9)), s.lo + 1, size);
  return s;
}

namespace {

// PIL's filters: the triangle (support 1) and Keys' cubic with a = -0.5 (support 2).
double Kernel(Filter f, double x) {
  x = std::abs(x);
  if (f == Filter::kBilinear) return std::max(0.0, 1.0 - x);
  constexpr double a = -0.5;
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

}  // namespace

// PIL's (torchvision's, torch's) antialiased taps: the filter widened by max(scale, 1), sampled
// at the source pixel centres, clipped to [lo, hi) and normalized. Positions are relative to
// lo, as in the cropped image those libraries resize.
void Resampler::Compute(const AxisMap& a, Filter filter, Taps* t) {
  const double widen = std::max(a.scale, 1.0), inv = 1.0 / widen;
  const double support = (filter == Filter::kBicubic ? 2.0 : 1.0) * widen;
  t->stride = static_cast<int>(std::ceil(2 * support)) + 1;
  t->first.resize(a.count);
  t->count.resize(a.count);
  t->weights.assign(static_cast<size_t>(a.count) * t->stride, 0.0f);
  t->lo = a.hi;
  t->hi = a.lo;
  const int size = a.hi - a.lo;
  for (int i = 0; i < a.count; ++i) {
    const double center = a.origin - a.lo + (a.start + i + 0.5) * a.scale;
    int xmin = std::max(static_cast<int>(std::floor(center - support + 0.5)), 0);
    int xmax = std::min(static_cast<int>(std::floor(center + support + 0.5)), size);
    xmin = std::min(xmin, size - 1);
    xmax = std::min(std::max(xmax, xmin + 1), xmin + t->stride);
    float* w = &t->weights[static_cast<size_t>(i) * t->stride];
    double total = 0;
    for (int j = xmin; j < xmax; ++j) {
      double v = Kernel(filter, (j - center + 0.5) * inv);
      w[j - xmin] = static_cast<float>(v);
      total += v;
    }
    if (total != 0) {
      for (int j = 0; j < xmax - xmin; ++j) w[j] = static_cast<float>(w[j] / total);
    } else {  // cannot happen for a window inside the source; nearest pixel
      w[0] = 1;
      xmax = xmin + 1;
    }
    t->first[i] = a.lo + xmin;
    t->count[i] = xmax - xmin;
    t->lo = std::min(t->lo, a.lo + xmin);
    t->hi = std::max(t->hi, a.lo + xmax);
  }
  for (int& f : t->first) f -= t->lo;
}

cv::Rect Resampler::Plan(const AxisMap& x, const AxisMap& y, Filter filter) {
  Compute(x, filter, &x_);
  Compute(y, filter, &y_);
  return {x_.lo, y_.lo, x_.hi - x_.lo, y_.hi - y_.lo};
}

namespace {

// The hot loops, compiled for x86-64-v3 (AVX2, FMA) as well and chosen at run time (the
// build is portable).
#define MMFEED_SIMD __attribute__((target_clones("arch=x86-64-v3", "default")))

// c = w * p (first tap) or c += w * p, over n values.
MMFEED_SIMD void AddRow(const uint8_t* __restrict p, float w, float* __restrict c, int n,
                        bool first) {
  if (first) {
    for (int i = 0; i < n; ++i) c[i] = w * static_cast<float>(p[i]);
  } else {
    for (int i = 0; i < n; ++i) c[i] += w * static_cast<float>(p[i]);
  }
}

// Four floats: a pixel's R, G, B and whatever follows (the next pixel's R), which no one reads.
// The horizontal pass works on whole pixels.
typedef float Pixel __attribute__((vector_size(16)));

inline Pixel LoadPixel(const float* p) {
  Pixel v;
  std::memcpy(&v, p, sizeof(v));  // unaligned
  return v;
}

// One output row: every output pixel reads `stride` taps (zero weights past its own) and its
// channels go to separate planes. Four output pixels at a time: their sums are independent,
// so the adds overlap instead of waiting for each other.
MMFEED_SIMD void FilterRow(const float* __restrict c, const int* __restrict first,
                           const float* __restrict weights, int stride, int out_w, bool flip,
                           float* __restrict r, float* __restrict g, float* __restrict b) {
  auto put = [&](int ox, Pixel sum) {
    const int d = flip ? out_w - 1 - ox : ox;
    r[d] = sum[0];
    g[d] = sum[1];
    b[d] = sum[2];
  };
  int ox = 0;
  for (; ox + 4 <= out_w; ox += 4) {
    const float *p0 = c + 3 * first[ox], *p1 = c + 3 * first[ox + 1], *p2 = c + 3 * first[ox + 2],
                *p3 = c + 3 * first[ox + 3];
    const float* w = weights + ox * stride;
    Pixel s0 = {0, 0, 0, 0}, s1 = s0, s2 = s0, s3 = s0;
    for (int k = 0; k < stride; ++k) {
      s0 += w[k] * LoadPixel(p0 + 3 * k);
      s1 += w[stride + k] * LoadPixel(p1 + 3 * k);
      s2 += w[2 * stride + k] * LoadPixel(p2 + 3 * k);
      s3 += w[3 * stride + k] * LoadPixel(p3 + 3 * k);
    }
    put(ox, s0);
    put(ox + 1, s1);
    put(ox + 2, s2);
    put(ox + 3, s3);
  }
  for (; ox < out_w; ++ox) {
    const float* p = c + 3 * first[ox];
    const float* w = weights + ox * stride;
    Pixel sum = {0, 0, 0, 0};
    for (int k = 0; k < stride; ++k) sum += w[k] * LoadPixel(p + 3 * k);
    put(ox, sum);
  }
}

// Rounded to 8 bits as torchvision's resize returns them (clamped to [0, 255]).
inline int Round8(float v) {
  const int q = static_cast<int>(v + 0.5f);  // v > -1 rounds to 0 either way
  return q < 0 ? 0 : q > 255 ? 255 : q;
}

MMFEED_SIMD void Normalize(const float* __restrict v, int n, float mul, float add,
                           float* __restrict out, int out_step) {
  for (int i = 0; i < n; ++i) out[i * out_step] = static_cast<float>(Round8(v[i])) * mul + add;
}

MMFEED_SIMD void NormalizeBf16(const float* __restrict v, int n, float mul, float add,
                               uint16_t* __restrict out, int out_step) {
  for (int i = 0; i < n; ++i)
    out[i * out_step] = ToBFloat16(static_cast<float>(Round8(v[i])) * mul + add);
}

MMFEED_SIMD void ToUint8(const float* __restrict v, int n, uint8_t* __restrict out, int out_step) {
  for (int i = 0; i < n; ++i) out[i * out_step] = static_cast<uint8_t>(Round8(v[i]));
}

}  // namespace

void Resampler::Run(const cv::Mat& src, cv::Point src_origin, const ResampleOutput& o,
                    uint8_t* out) {
  class MatRows : public RowSource {
   public:
    MatRows(const cv::Mat& m, cv::Point origin) : m_(m), origin_(origin) {}
    const uint8_t* Row(int y) override { return m_.ptr<uint8_t>(y - origin_.y); }
    int x0() const override { return origin_.x; }

   private:
    const cv::Mat& m_;
    cv::Point origin_;
  } rows(src, src_origin);
  Run(rows, o, out);
}

bool Resampler::Run(RowSource& src, const ResampleOutput& o, uint8_t* out) {
  const int out_w = static_cast<int>(x_.first.size()), out_h = static_cast<int>(y_.first.size());
  const int n = (x_.hi - x_.lo) * 3;
  // Taps past the source's end read zeros with zero weights (and one float more: see Pixel).
  column_.assign(static_cast<size_t>(n) + 3 * x_.stride + 1, 0.0f);
  row_.resize(static_cast<size_t>(out_w) * 3);
  float* planes[3] = {row_.data(), row_.data() + out_w, row_.data() + 2 * out_w};
  const size_t plane = static_cast<size_t>(out_w) * out_h;
  for (int oy = 0; oy < out_h; ++oy) {
    // Vertical: the source rows this output row reads, over the columns any output reads.
    const float* wy = &y_.weights[static_cast<size_t>(oy) * y_.stride];
    for (int k = 0; k < y_.count[oy]; ++k) {
      const uint8_t* row = src.Row(y_.lo + y_.first[oy] + k);
      if (!row) return false;
      AddRow(row + (x_.lo - src.x0()) * 3, wy[k], column_.data(), n, k == 0);
    }
    FilterRow(column_.data(), x_.first.data(), x_.weights.data(), x_.stride, out_w, o.flip,
              planes[0], planes[1], planes[2]);
    // Rounded to 8 bits as torchvision's resize returns them, then laid out.
    for (int ch = 0; ch < 3; ++ch) {
      const size_t at = o.chw ? ch * plane + static_cast<size_t>(oy) * out_w
                              : static_cast<size_t>(oy) * out_w * 3 + ch;
      const int step = o.chw ? 1 : 3;
      if (o.dtype == DType::kFloat32)
        Normalize(planes[ch], out_w, o.mul[ch], o.add[ch], reinterpret_cast<float*>(out) + at,
                  step);
      else if (o.dtype == DType::kBFloat16)
        NormalizeBf16(planes[ch], out_w, o.mul[ch], o.add[ch],
                      reinterpret_cast<uint16_t*>(out) + at, step);
      else
        ToUint8(planes[ch], out_w, out + at, step);
    }
  }
  return true;
}

}  // namespace mmfeed
