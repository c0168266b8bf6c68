#include "stages/common/resample.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/simd.h"

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

// Bytes the AVX2 kernels may read or write past the end of the Resampler's own rows.
constexpr int kPad = 32;

// A fixed-point sum (rounding term included) to 8 bits, clamped as PIL's clip8.
inline uint8_t Clip8(int32_t sum, int bits) {
  const int32_t v = sum >> bits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

// PIL's (torchvision's, torch's) antialiased taps: the filter widened by max(scale, 1), sampled
// at the source pixel centres, clipped to [lo, hi) and normalized. Positions are relative to
// lo, as in the cropped image those libraries resize. The weights are then rounded to fixed
// point with as many fractional bits as 16-bit integers allow (at most PIL's 22).
void Resampler::Compute(const AxisMap& a, Filter filter, Taps* t, std::vector<double>* scratch) {
  const double widen = std::max(a.scale, 1.0), inv = 1.0 / widen;
  const double support = (filter == Filter::kBicubic ? 2.0 : 1.0) * widen;
  t->stride = static_cast<int>(std::ceil(2 * support)) + 1;
  t->first.resize(a.count);
  t->count.resize(a.count);
  std::vector<double>& w = *scratch;
  w.assign(static_cast<size_t>(a.count) * t->stride, 0.0);
  t->lo = a.hi;
  t->hi = a.lo;
  const int size = a.hi - a.lo;
  double largest = 0;
  t->most = 0;
  for (int i = 0; i < a.count; ++i) {
    const double center = a.origin - a.lo + (a.start + i + 0.5) * a.scale;
    int xmin = std::max(static_cast<int>(std::floor(center - support + 0.5)), 0);
    int xmax = std::min(static_cast<int>(std::floor(center + support + 0.5)), size);
    xmin = std::min(xmin, size - 1);
    xmax = std::min(std::max(xmax, xmin + 1), xmin + t->stride);
    double* wi = &w[static_cast<size_t>(i) * t->stride];
    double total = 0;
    for (int j = xmin; j < xmax; ++j) {
      wi[j - xmin] = Kernel(filter, (j - center + 0.5) * inv);
      total += wi[j - xmin];
    }
    if (total != 0) {
      for (int j = 0; j < xmax - xmin; ++j) wi[j] /= total;
    } else {  // cannot happen for a window inside the source; nearest pixel
      wi[0] = 1;
      xmax = xmin + 1;
    }
    for (int j = 0; j < xmax - xmin; ++j) largest = std::max(largest, std::abs(wi[j]));
    t->first[i] = a.lo + xmin;
    t->count[i] = xmax - xmin;
    t->most = std::max(t->most, xmax - xmin);
    t->lo = std::min(t->lo, a.lo + xmin);
    t->hi = std::max(t->hi, a.lo + xmax);
  }
  for (int& f : t->first) f -= t->lo;
  t->bits = 22;
  while (t->bits > 1 && std::lround(largest * (1 << t->bits)) > 32767) --t->bits;
  t->weights.resize(w.size());
  const double one = 1 << t->bits;
  for (size_t k = 0; k < w.size(); ++k)  // rounded half away from zero, as PIL does
    t->weights[k] = static_cast<int16_t>(w[k] < 0 ? w[k] * one - 0.5 : w[k] * one + 0.5);
}

cv::Rect Resampler::Plan(const AxisMap& x, const AxisMap& y, Filter filter) {
  Compute(x, filter, &x_, &scratch_);
  Compute(y, filter, &y_, &scratch_);
  // The AVX2 horizontal kernel: two outputs at a time, four taps per 16-byte load. Per pair and
  // group of four taps, two 16-lane vectors of weights: lanes 0-7 for the first output, 8-15
  // for the second, each [w0 w1 w0 w1 w0 w1 0 0] then [w2 w3 w2 w3 w2 w3 0 0].
  const int out_w = static_cast<int>(x_.first.size());
  const int groups = (x_.most + 3) / 4, pairs = (out_w + 1) / 2;
  x_pairs_.assign(static_cast<size_t>(pairs) * groups * 32, 0);
  for (int i = 0; i < out_w; ++i)
    for (int k = 0; k < x_.count[i]; ++k) {
      const int g = k / 4, half = (k % 4) / 2, odd = k % 2;
      int16_t* v =
          &x_pairs_[((static_cast<size_t>(i / 2) * groups + g) * 2 + half) * 16 + (i % 2) * 8];
      v[odd] = v[2 + odd] = v[4 + odd] = x_.weights[static_cast<size_t>(i) * x_.stride + k];
    }
  // The vertical taps in pairs for the AVX2 kernel: tap k + 1's weight in the high half.
  const int y_pair_stride = (y_.stride + 1) / 2;
  y_pairs_.assign(y_.first.size() * y_pair_stride, 0);
  for (size_t i = 0; i < y_.first.size(); ++i)
    for (int k = 0; k < y_.count[i]; ++k) {
      const uint32_t w = static_cast<uint16_t>(y_.weights[i * y_.stride + k]);
      y_pairs_[i * y_pair_stride + k / 2] |= static_cast<int32_t>(w << (16 * (k % 2)));
    }
  return {x_.lo, y_.lo, x_.hi - x_.lo, y_.hi - y_.lo};
}

namespace {

// The passes. `in` is a source row from the first column Plan reads (RGB), or the rows after
// the horizontal pass (RGBX); outputs are RGBX, X zero.

// Horizontal, portable: outputs [from, to).
void HorizontalPortable(const uint8_t* in, const int* first, const int* count,
                        const int16_t* weights, int stride, int bits, int from, int to,
                        uint8_t* out) {
  for (int i = from; i < to; ++i) {
    const uint8_t* p = in + 3 * first[i];
    const int16_t* w = weights + static_cast<size_t>(i) * stride;
    int32_t r = 1 << (bits - 1), g = r, b = r;
    for (int k = 0; k < count[i]; ++k) {
      r += p[3 * k] * w[k];
      g += p[3 * k + 1] * w[k];
      b += p[3 * k + 2] * w[k];
    }
    out[4 * i] = Clip8(r, bits);
    out[4 * i + 1] = Clip8(g, bits);
    out[4 * i + 2] = Clip8(b, bits);
    out[4 * i + 3] = 0;
  }
}

// Horizontal, AVX2: outputs [0, fast) (fast even; their loads stay readable). Each 128-bit
// lane holds one output: 16 bytes from its first tap, shuffled into 16-bit pairs of
// neighbouring taps per channel, multiplied and summed pairwise by vpmaddwd; `halves` pairs of
// taps per output (the last group of four may use only its first pair). kHalves is `halves`
// when known at compile time (the loop unrolled), 0 otherwise.
template <int kHalves>
__attribute__((target("avx2"))) inline __m256i TwoOutputs(const uint8_t* p0, const uint8_t* p1,
                                                          const __m256i* w, int halves,
                                                          __m256i round) {
  const __m256i taps01 = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                          0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m256i taps23 =
      _mm256_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1, 6, -1, 9, -1, 7,
                       -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1);
  if (kHalves > 0) halves = kHalves;
  __m256i sum = round;
  for (int h = 0; h < halves; h += 2) {
    const __m256i px = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + 6 * h))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + 6 * h)), 1);
    sum = _mm256_add_epi32(
        sum, _mm256_madd_epi16(_mm256_shuffle_epi8(px, taps01), _mm256_loadu_si256(w + h)));
    if (h + 1 < halves)
      sum = _mm256_add_epi32(
          sum, _mm256_madd_epi16(_mm256_shuffle_epi8(px, taps23), _mm256_loadu_si256(w + h + 1)));
  }
  return sum;
}

template <int kHalves>
__attribute__((target("avx2"))) void HorizontalAvx2(const uint8_t* in, const int* first,
                                                    const int16_t* pairs, int halves, int bits,
                                                    int fast, uint8_t* out) {
  if (kHalves > 0) halves = kHalves;
  const __m256i round = _mm256_set1_epi32(1 << (bits - 1));
  const __m128i shift = _mm_cvtsi32_si128(bits);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const int stride = (halves + 1) / 2 * 2;  // weight vectors per output pair
  const __m256i* w = reinterpret_cast<const __m256i*>(pairs);
  int i = 0;
  for (; i + 4 <= fast; i += 4, w += 2 * stride) {  // four outputs, packed together
    const __m256i a = _mm256_sra_epi32(
        TwoOutputs<kHalves>(in + 3 * first[i], in + 3 * first[i + 1], w, halves, round), shift);
    const __m256i b =
        _mm256_sra_epi32(TwoOutputs<kHalves>(in + 3 * first[i + 2], in + 3 * first[i + 3],
                                             w + stride, halves, round),
                         shift);
    // [i, i+2 | i+1, i+3] as words, then bytes; dwords 0, 4, 1, 5 are outputs i..i+3.
    const __m256i words = _mm256_packs_epi32(a, b);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(words, words), order);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4 * i), _mm256_castsi256_si128(bytes));
  }
  if (i < fast) {
    const __m256i a = _mm256_sra_epi32(
        TwoOutputs<kHalves>(in + 3 * first[i], in + 3 * first[i + 1], w, halves, round), shift);
    const __m256i words = _mm256_packs_epi32(a, a);
    const __m256i bytes = _mm256_packus_epi16(words, words);  // lane: the output's RGBX
    const uint32_t lo = static_cast<uint32_t>(_mm256_cvtsi256_si32(bytes));
    const uint32_t hi = static_cast<uint32_t>(_mm256_extract_epi32(bytes, 4));
    std::memcpy(out + 4 * i, &lo, 4);
    std::memcpy(out + 4 * i + 4, &hi, 4);
  }
}

using HorizontalKernel = void (*)(const uint8_t*, const int*, const int16_t*, int, int, int,
                                  uint8_t*);

// Up to 8 taps (a downscale by up to 3.5x, bilinear) unrolled; more in a loop.
HorizontalKernel PickHorizontal(int halves) {
  switch (halves) {
    case 1:
      return HorizontalAvx2<1>;
    case 2:
      return HorizontalAvx2<2>;
    case 3:
      return HorizontalAvx2<3>;
    case 4:
      return HorizontalAvx2<4>;
    default:
      return HorizontalAvx2<0>;
  }
}

// Vertical: out[j] = sum over taps k of w[k] * rows[k][j], j < n.
void VerticalPortable(const uint8_t* const* rows, const int16_t* w, int taps, int bits, int n,
                      uint8_t* out) {
  for (int j = 0; j < n; ++j) {
    int32_t s = 1 << (bits - 1);
    for (int k = 0; k < taps; ++k) s += rows[k][j] * w[k];
    out[j] = Clip8(s, bits);
  }
}

// Vertical, AVX2: 32 bytes at a time; two rows' bytes interleaved into 16-bit pairs and
// multiplied by their two weights (`pair_w`: taps k and k + 1 as the low and high halves) with
// vpmaddwd. Reads and writes up to 31 bytes past n.
__attribute__((target("avx2"))) void VerticalAvx2(const uint8_t* const* rows, const int32_t* pair_w,
                                                  int taps, int bits, int n, uint8_t* out) {
  const __m256i round = _mm256_set1_epi32(1 << (bits - 1)), zero = _mm256_setzero_si256();
  const __m128i shift = _mm_cvtsi32_si128(bits);
  for (int j = 0; j < n; j += 32) {
    // Per 128-bit lane, bytes 0-3, 4-7, 8-11, 12-15 of the lane's 16.
    __m256i s0 = round, s1 = round, s2 = round, s3 = round;
    for (int k = 0; k < taps; k += 2) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k] + j));
      const __m256i b = k + 1 < taps
                            ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k + 1] + j))
                            : zero;
      const __m256i w = _mm256_set1_epi32(pair_w[k / 2]);
      const __m256i lo = _mm256_unpacklo_epi8(a, b), hi = _mm256_unpackhi_epi8(a, b);
      s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), w));
      s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), w));
      s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), w));
      s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), w));
    }
    const __m256i w01 =
        _mm256_packs_epi32(_mm256_sra_epi32(s0, shift), _mm256_sra_epi32(s1, shift));
    const __m256i w23 =
        _mm256_packs_epi32(_mm256_sra_epi32(s2, shift), _mm256_sra_epi32(s3, shift));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), _mm256_packus_epi16(w01, w23));
  }
}

// The output row `oy` from one RGBX row `v` of `w` pixels, mirrored if `flip`: channel c of
// pixel x goes to out[at(c, x)], as uint8, or as float32 / bfloat16 v * mul[c] + add[c].
struct Layout {
  DType dtype;
  bool chw, flip;
  const float *mul, *add;
  size_t plane;  // CHW: elements per channel
  int w;
};

template <typename Put>
inline void EachValue(const uint8_t* v, const Layout& l, int oy, int from, Put put) {
  for (int c = 0; c < 3; ++c)
    for (int x = from; x < l.w; ++x) {
      const size_t at = l.chw ? c * l.plane + static_cast<size_t>(oy) * l.w + x
                              : (static_cast<size_t>(oy) * l.w + x) * 3 + c;
      put(at, c, v[4 * (l.flip ? l.w - 1 - x : x) + c]);
    }
}

// Outputs from column `from` on, portable.
void EmitPortable(const uint8_t* v, const Layout& l, int oy, int from, uint8_t* out) {
  if (l.dtype == DType::kFloat32) {
    float* f = reinterpret_cast<float*>(out);
    EachValue(v, l, oy, from, [&](size_t at, int c, uint8_t p) {
      f[at] = static_cast<float>(p) * l.mul[c] + l.add[c];
    });
  } else if (l.dtype == DType::kBFloat16) {
    uint16_t* h = reinterpret_cast<uint16_t*>(out);
    EachValue(v, l, oy, from, [&](size_t at, int c, uint8_t p) {
      h[at] = ToBFloat16(static_cast<float>(p) * l.mul[c] + l.add[c]);
    });
  } else {
    EachValue(v, l, oy, from, [&](size_t at, int, uint8_t p) { out[at] = p; });
  }
}

// CHW, AVX2: eight pixels at a time; returns the columns done. The factors are held in
// registers and the branches taken out of the loop (`out` may alias `l.mul`, as far as the
// compiler knows, so it would reload them per store).
template <DType D, bool kFlip>
__attribute__((target("avx2"))) int EmitChwAvx2(const uint8_t* v, const Layout& l, int oy,
                                                uint8_t* out) {
  const int n = l.w / 8 * 8;
  const __m256i reverse = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0), byte = _mm256_set1_epi32(255);
  __m256 mul[3] = {}, add[3] = {};  // uint8 output has no factors (l.mul is null)
  if (D != DType::kUInt8)
    for (int c = 0; c < 3; ++c) {
      mul[c] = _mm256_set1_ps(l.mul[c]);
      add[c] = _mm256_set1_ps(l.add[c]);
    }
  const size_t row = static_cast<size_t>(oy) * l.w, plane = l.plane;
  for (int x = 0; x < n; x += 8) {
    __m256i px =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 4 * (kFlip ? l.w - 8 - x : x)));
    if (kFlip) px = _mm256_permutevar8x32_epi32(px, reverse);
    for (int c = 0; c < 3; ++c) {
      const __m256i ch = _mm256_and_si256(_mm256_srli_epi32(px, 8 * c), byte);
      const size_t at = c * plane + row + x;
      if constexpr (D == DType::kUInt8) {
        const __m256i w16 = _mm256_packus_epi32(ch, ch);  // [0-3 0-3 | 4-7 4-7]
        const __m256i b8 = _mm256_packus_epi16(w16, w16);
        const uint64_t eight = static_cast<uint32_t>(_mm256_cvtsi256_si32(b8)) |
                               uint64_t{static_cast<uint32_t>(_mm256_extract_epi32(b8, 4))} << 32;
        std::memcpy(out + at, &eight, 8);
      } else {
        // Multiply, then add (no FMA): the portable code's rounding.
        Store8<D>(_mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ch), mul[c]), add[c]), out, at);
      }
    }
  }
  return n;
}

// HWC, AVX2: eight pixels at a time, their RGBX bytes packed to 24 RGB bytes, which are the
// output's next 24 values in order (uint8), or three runs of eight converted with factors that
// repeat every 3 values; returns the columns done.
template <DType D, bool kFlip>
__attribute__((target("avx2"))) int EmitHwcAvx2(const uint8_t* v, const Layout& l, int oy,
                                                uint8_t* out) {
  const int n = l.w / 8 * 8;
  const __m256i reverse = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
  // Per lane: its four pixels' R, G, B bytes first (12 bytes), the X bytes dropped.
  constexpr char z = -1;
  const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, z, z, z, z,  //
                                        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, z, z, z, z);
  // uint8 output has no factors (l.mul is null)
  static constexpr float kNone[3] = {};
  const Period3Factors f(D == DType::kUInt8 ? kNone : l.mul, D == DType::kUInt8 ? kNone : l.add);
  alignas(32) uint8_t rgb[32];
  for (int x = 0; x < n; x += 8) {
    __m256i px =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 4 * (kFlip ? l.w - 8 - x : x)));
    if (kFlip) px = _mm256_permutevar8x32_epi32(px, reverse);
    const __m256i packed = _mm256_shuffle_epi8(px, pack);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(rgb), _mm256_castsi256_si128(packed));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(rgb + 12), _mm256_extracti128_si256(packed, 1));
    const size_t at = (static_cast<size_t>(oy) * l.w + x) * 3;
    if constexpr (D == DType::kUInt8)
      std::memcpy(out + at, rgb, 24);
    else
      f.Convert24<D>(rgb, out, at);
  }
  return n;
}

template <DType D>
int EmitAvx2(const uint8_t* v, const Layout& l, int oy, uint8_t* out) {
  if (l.chw)
    return l.flip ? EmitChwAvx2<D, true>(v, l, oy, out) : EmitChwAvx2<D, false>(v, l, oy, out);
  return l.flip ? EmitHwcAvx2<D, true>(v, l, oy, out) : EmitHwcAvx2<D, false>(v, l, oy, out);
}

// Returns the columns done (the rest: EmitPortable).
int EmitAvx2(const uint8_t* v, const Layout& l, int oy, uint8_t* out) {
  switch (l.dtype) {
    case DType::kFloat32:
      return EmitAvx2<DType::kFloat32>(v, l, oy, out);
    case DType::kBFloat16:
      return EmitAvx2<DType::kBFloat16>(v, l, oy, out);
    default:
      return EmitAvx2<DType::kUInt8>(v, l, oy, out);
  }
}

}  // namespace

void Resampler::Run(const cv::Mat& src, cv::Point src_origin, const ResampleOutput& o,
                    uint8_t* out) {
  class MatRows : public RowSource {
   public:
    MatRows(const cv::Mat& m, cv::Point origin) : m_(m), origin_(origin) {}
    const uint8_t* Row(int y) override { return m_.ptr<uint8_t>(y - origin_.y); }
    int x0() const override { return origin_.x; }
    int readable() const override { return (m_.cols - origin_.x) * 3; }

   private:
    const cv::Mat& m_;
    cv::Point origin_;
  } rows(src, src_origin);
  Run(rows, o, out);
}

bool Resampler::Run(RowSource& src, const ResampleOutput& o, uint8_t* out) {
  const int out_w = static_cast<int>(x_.first.size()), out_h = static_cast<int>(y_.first.size());
  const bool avx2 = UseAvx2();
  const size_t row_bytes = static_cast<size_t>(out_w) * 4 + kPad;
  rows_.resize(row_bytes * y_.stride);
  out_row_.resize(row_bytes);
  const Layout layout{o.dtype, o.chw, o.flip, o.mul, o.add, static_cast<size_t>(out_w) * out_h,
                      out_w};
  // The AVX2 kernel covers the outputs (from the left) whose 16-byte loads stay readable.
  const int halves = (x_.most + 1) / 2, groups = (halves + 1) / 2;
  const int readable = src.readable() - (x_.lo - src.x0()) * 3;
  int fast = avx2 ? out_w : 0;
  while (fast > 0 && 3 * x_.first[fast - 1] + 12 * (groups - 1) + 16 > readable) --fast;
  fast = fast / 2 * 2;
  const HorizontalKernel horizontal = PickHorizontal(halves);
  const int y_pair_stride = (y_.stride + 1) / 2;
  taps_.resize(y_.stride);
  int next = 0;  // the next source row to read, counted from y_.lo
  for (int oy = 0; oy < out_h; ++oy) {
    const int first = y_.first[oy], count = y_.count[oy];
    // Horizontal: every source row up to this output's last tap, once, into a ring of rows.
    for (; next < first + count; ++next) {
      const uint8_t* row = src.Row(y_.lo + next);
      if (!row) return false;
      row += (x_.lo - src.x0()) * 3;
      uint8_t* h = &rows_[(next % y_.stride) * row_bytes];
      if (fast > 0) horizontal(row, x_.first.data(), x_pairs_.data(), halves, x_.bits, fast, h);
      HorizontalPortable(row, x_.first.data(), x_.count.data(), x_.weights.data(), x_.stride,
                         x_.bits, fast, out_w, h);
    }
    // Vertical, then the output's layout.
    for (int k = 0; k < count; ++k) taps_[k] = &rows_[((first + k) % y_.stride) * row_bytes];
    if (avx2)
      VerticalAvx2(taps_.data(), &y_pairs_[static_cast<size_t>(oy) * y_pair_stride], count, y_.bits,
                   out_w * 4, out_row_.data());
    else
      VerticalPortable(taps_.data(), &y_.weights[static_cast<size_t>(oy) * y_.stride], count,
                       y_.bits, out_w * 4, out_row_.data());
    const int done = avx2 ? EmitAvx2(out_row_.data(), layout, oy, out) : 0;
    EmitPortable(out_row_.data(), layout, oy, done, out);
  }
  return true;
}

}  // namespace mmfeed
