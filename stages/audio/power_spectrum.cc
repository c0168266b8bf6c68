#include "stages/audio/power_spectrum.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "base/simd.h"

namespace mmfeed {
namespace {

// r[j] lane f <- r[f] lane j.
__attribute__((target("avx2"))) inline void Transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    // Lanes 0, 1 of r[k] and r[k + 1] interleaved (and 4, 5 in the upper half), then 2, 3.
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
    r[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
  }
}

// Samples [i, i + 8) of eight frames, windowed: r[j] holds sample i + j of every frame (eight
// loaded from each frame, transposed). Frame f's samples are x[f * stride ...].
__attribute__((target("avx2"))) inline void Rows(const float* x, size_t stride, const float* w,
                                                 int i, __m256 r[8]) {
  for (int f = 0; f < 8; ++f) r[f] = _mm256_loadu_ps(x + f * stride + i);
  Transpose8x8(r);
  for (int j = 0; j < 8; ++j) r[j] = _mm256_mul_ps(r[j], _mm256_set1_ps(w[i + j]));
}

// The same for sixteen frames: the first eight in each vector's lower half, the next in its
// upper half.
__attribute__((target("avx512f"))) inline void Rows(const float* x, size_t stride, const float* w,
                                                    int i, __m512 r[8]) {
  __m256 lo[8], hi[8];
  Rows(x, stride, w, i, lo);
  Rows(x + 8 * stride, stride, w, i, hi);
  for (int j = 0; j < 8; ++j)
    r[j] =
        __builtin_shufflevector(lo[j], hi[j], 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// The intrinsic type of a vector of W floats, for Rows.
template <int W>
struct Reg;
template <>
struct Reg<8> {
  using Type = __m256;
};
template <>
struct Reg<16> {
  using Type = __m512;
};

// How a value type reads and writes floats: one frame, or one per lane of a vector. Deal puts
// the frames' samples times the window into the transform's input: sample i of frame f is
// x[f * stride + i]; it goes to re[i / 2] (even i) or im[i / 2] (odd i) for even n, to re[i]
// (im zero) for odd n.
template <class V>
struct Lanes {
  static constexpr int kWidth = sizeof(V) / sizeof(float);
  static void Sample(const float* x, size_t stride, const float* w, int i, V& v) {
    for (int f = 0; f < kWidth; ++f) v[f] = x[f * stride + i] * w[i];
  }
  static void Deal(const float* x, size_t stride, const float* w, int n, V* re, V* im) {
    typename Reg<kWidth>::Type r[8];
    int i = 0;
    if (n % 2 == 0) {
      for (; i + 8 <= n; i += 8) {
        Rows(x, stride, w, i, r);
        for (int k = 0; k < 4; ++k) {
          re[i / 2 + k] = r[2 * k];
          im[i / 2 + k] = r[2 * k + 1];
        }
      }
      for (; i < n; i += 2) {
        Sample(x, stride, w, i, re[i / 2]);
        Sample(x, stride, w, i + 1, im[i / 2]);
      }
    } else {
      for (; i + 8 <= n; i += 8) {
        Rows(x, stride, w, i, r);
        for (int j = 0; j < 8; ++j) re[i + j] = r[j];
      }
      for (; i < n; ++i) Sample(x, stride, w, i, re[i]);
      for (int j = 0; j < n; ++j) im[j] = V{};
    }
  }
  static void Store(const V& v, float* p) { std::memcpy(p, &v, sizeof(V)); }
};
template <>
struct Lanes<float> {
  static constexpr int kWidth = 1;
  static void Deal(const float* x, size_t, const float* w, int n, float* re, float* im) {
    if (n % 2 == 0) {
      for (int j = 0; j < n / 2; ++j) {
        re[j] = x[2 * j] * w[2 * j];
        im[j] = x[2 * j + 1] * w[2 * j + 1];
      }
    } else {
      for (int j = 0; j < n; ++j) {
        re[j] = x[j] * w[j];
        im[j] = 0;
      }
    }
  }
  static void Store(const float& v, float* p) { *p = v; }
};

// (re, im) *= (wr, wi).
template <class V>
inline void Rotate(V& re, V& im, float wr, float wi) {
  const V t = re * wr - im * wi;
  im = re * wi + im * wr;
  re = t;
}

// e^{-2 pi i num / den} in double, rounded to float.
std::pair<float, float> Root(int64_t num, int64_t den) {
  const double a = -2.0 * M_PI * static_cast<double>(num % den) / static_cast<double>(den);
  return {static_cast<float>(std::cos(a)), static_cast<float>(std::sin(a))};
}

int SmallestFactor(int n) {
  for (int p = 2; p * p <= n; ++p)
    if (n % p == 0) return p;
  return n;
}

bool Smooth(int n) {  // every prime factor <= kMaxRadix
  while (n > 1) {
    const int p = SmallestFactor(n);
    if (p > PowerSpectrum::kMaxRadix) return false;
    n /= p;
  }
  return true;
}

// One Stockham pass of radix p = P (P = 0: the generic butterfly, p = `radix`, any prime;
// otherwise p is a constant the indices fold), decimation in frequency: over the current length
// len = p m (stride s, the product of the radices before it), it reads a_r = x[k + s (q + r m)],
// r < p, and writes its DFT b_j times e^{-2 pi i jq / len} to y[k + s (p q + j)]. Each radix has
// its own loop, compiled (and its registers allocated) alone: one loop with every radix's branch
// inside spilled registers (the transform 1.10x slower).
template <int P, class V>
void StockhamPass(int radix, int m, int s, const float* wr, const float* wi, const V* xr,
                  const V* xi, V* yr, V* yi) {
  static_assert(P == 0 || P == 2 || P == 3 || P == 4 || P == 5);
  const int p = P ? P : radix;
  const float c3 = -0.5f, s3 = static_cast<float>(std::sin(2 * M_PI / 3));
  const float c51 = static_cast<float>(std::cos(2 * M_PI / 5)),
              c52 = static_cast<float>(std::cos(4 * M_PI / 5)),
              s51 = static_cast<float>(std::sin(2 * M_PI / 5)),
              s52 = static_cast<float>(std::sin(4 * M_PI / 5));
  const size_t sm = static_cast<size_t>(s) * m;
  auto butterfly = [&](int q, int k, auto twiddled) {
    const float* qr = wr + static_cast<size_t>(q) * (p - 1);
    const float* qi = wi + static_cast<size_t>(q) * (p - 1);
    // (re, im) *= e^{-2 pi i jq / len}, 1 <= j < p; nothing for q = 0 (decltype(twiddled) is
    // false_type), whose twiddles are all 1.
    auto twiddle = [&](V& re, V& im, int j) {
      if constexpr (decltype(twiddled)::value) Rotate(re, im, qr[j - 1], qi[j - 1]);
    };
    const V* ar = xr + k + static_cast<size_t>(s) * q;
    const V* ai = xi + k + static_cast<size_t>(s) * q;
    V* br = yr + k + static_cast<size_t>(s) * p * q;
    V* bi = yi + k + static_cast<size_t>(s) * p * q;
    if constexpr (P == 2) {
      V r1 = ar[0] - ar[sm], i1 = ai[0] - ai[sm];
      br[0] = ar[0] + ar[sm];
      bi[0] = ai[0] + ai[sm];
      twiddle(r1, i1, 1);
      br[s] = r1;
      bi[s] = i1;
    } else if constexpr (P == 4) {
      const V t0r = ar[0] + ar[2 * sm], t0i = ai[0] + ai[2 * sm];
      const V t1r = ar[0] - ar[2 * sm], t1i = ai[0] - ai[2 * sm];
      const V t2r = ar[sm] + ar[3 * sm], t2i = ai[sm] + ai[3 * sm];
      const V t3r = ar[sm] - ar[3 * sm], t3i = ai[sm] - ai[3 * sm];
      V r1 = t1r + t3i, i1 = t1i - t3r;  // t1 - i t3
      V r2 = t0r - t2r, i2 = t0i - t2i;
      V r3 = t1r - t3i, i3 = t1i + t3r;  // t1 + i t3
      br[0] = t0r + t2r;
      bi[0] = t0i + t2i;
      twiddle(r1, i1, 1);
      twiddle(r2, i2, 2);
      twiddle(r3, i3, 3);
      br[s] = r1, bi[s] = i1, br[2 * s] = r2, bi[2 * s] = i2, br[3 * s] = r3, bi[3 * s] = i3;
    } else if constexpr (P == 3) {
      const V tr = ar[sm] + ar[2 * sm], ti = ai[sm] + ai[2 * sm];
      const V dr = (ar[sm] - ar[2 * sm]) * s3, di = (ai[sm] - ai[2 * sm]) * s3;
      const V ur = ar[0] + tr * c3, ui = ai[0] + ti * c3;
      V r1 = ur + di, i1 = ui - dr;  // u - i d
      V r2 = ur - di, i2 = ui + dr;  // u + i d
      br[0] = ar[0] + tr;
      bi[0] = ai[0] + ti;
      twiddle(r1, i1, 1);
      twiddle(r2, i2, 2);
      br[s] = r1, bi[s] = i1, br[2 * s] = r2, bi[2 * s] = i2;
    } else if constexpr (P == 5) {
      const V t1r = ar[sm] + ar[4 * sm], t1i = ai[sm] + ai[4 * sm];
      const V t2r = ar[2 * sm] + ar[3 * sm], t2i = ai[2 * sm] + ai[3 * sm];
      const V t3r = ar[sm] - ar[4 * sm], t3i = ai[sm] - ai[4 * sm];
      const V t4r = ar[2 * sm] - ar[3 * sm], t4i = ai[2 * sm] - ai[3 * sm];
      const V u1r = ar[0] + t1r * c51 + t2r * c52, u1i = ai[0] + t1i * c51 + t2i * c52;
      const V u2r = ar[0] + t1r * c52 + t2r * c51, u2i = ai[0] + t1i * c52 + t2i * c51;
      const V v1r = t3r * s51 + t4r * s52, v1i = t3i * s51 + t4i * s52;
      const V v2r = t3r * s52 - t4r * s51, v2i = t3i * s52 - t4i * s51;
      V r1 = u1r + v1i, i1 = u1i - v1r;  // u1 - i v1
      V r4 = u1r - v1i, i4 = u1i + v1r;  // u1 + i v1
      V r2 = u2r + v2i, i2 = u2i - v2r;  // u2 - i v2
      V r3 = u2r - v2i, i3 = u2i + v2r;  // u2 + i v2
      br[0] = ar[0] + t1r + t2r;
      bi[0] = ai[0] + t1i + t2i;
      twiddle(r1, i1, 1);
      twiddle(r2, i2, 2);
      twiddle(r3, i3, 3);
      twiddle(r4, i4, 4);
      br[s] = r1, bi[s] = i1, br[2 * s] = r2, bi[2 * s] = i2;
      br[3 * s] = r3, bi[3 * s] = i3, br[4 * s] = r4, bi[4 * s] = i4;
    } else {  // any other prime: b_j = sum_r a_r e^{-2 pi i rj / p}
      const float* root_r = wr + static_cast<size_t>(m) * (p - 1);
      const float* root_i = wi + static_cast<size_t>(m) * (p - 1);
      for (int j = 0; j < p; ++j) {
        V re = ar[0], im = ai[0];
        for (int r = 1, t = j; r < p; ++r, t = (t + j) % p) {
          re = re + (ar[r * sm] * root_r[t] - ai[r * sm] * root_i[t]);
          im = im + (ar[r * sm] * root_i[t] + ai[r * sm] * root_r[t]);
        }
        if (j > 0) twiddle(re, im, j);
        br[j * s] = re;
        bi[j * s] = im;
      }
    }
  };
  for (int k = 0; k < s; ++k) butterfly(0, k, std::false_type());
  for (int q = 1; q < m; ++q)
    for (int k = 0; k < s; ++k) butterfly(q, k, std::true_type());
}

}  // namespace

void PowerSpectrum::Fft::Plan(int n) {
  size = n;
  // Radix 4 while it divides, then the primes in increasing order.
  std::vector<int> radices;
  int rest = n;
  while (rest % 4 == 0) {
    radices.push_back(4);
    rest /= 4;
  }
  while (rest > 1) {
    const int p = SmallestFactor(rest);
    radices.push_back(p);
    rest /= p;
  }
  int len = n;
  for (int p : radices) {
    // Twiddles e^{-2 pi i jq / len} for q < len / p, 1 <= j < p, at [q * (p - 1) + j - 1];
    // then, for the generic butterfly, the p-th roots of unity e^{-2 pi i t / p}, t < p.
    passes.push_back({p, static_cast<int>(tw_re.size())});
    const int m = len / p;
    for (int q = 0; q < m; ++q)
      for (int j = 1; j < p; ++j) {
        auto [c, s] = Root(static_cast<int64_t>(j) * q, len);
        tw_re.push_back(c);
        tw_im.push_back(s);
      }
    if (p > 5)
      for (int t = 0; t < p; ++t) {
        auto [c, s] = Root(t, p);
        tw_re.push_back(c);
        tw_im.push_back(s);
      }
    len = m;
  }
}

// Stockham's self-sorting FFT: its passes in turn, between x and y.
template <class V>
void PowerSpectrum::Fft::Run(V* xr, V* xi, V* yr, V* yi) const {
  V* const out_r = xr;
  V* const out_i = xi;
  int len = size, s = 1;
  for (const Pass& pass : passes) {
    const int p = pass.radix, m = len / p;
    const float* wr = tw_re.data() + pass.twiddle_at;
    const float* wi = tw_im.data() + pass.twiddle_at;
    switch (p) {
      case 2:
        StockhamPass<2>(p, m, s, wr, wi, xr, xi, yr, yi);
        break;
      case 3:
        StockhamPass<3>(p, m, s, wr, wi, xr, xi, yr, yi);
        break;
      case 4:
        StockhamPass<4>(p, m, s, wr, wi, xr, xi, yr, yi);
        break;
      case 5:
        StockhamPass<5>(p, m, s, wr, wi, xr, xi, yr, yi);
        break;
      default:
        StockhamPass<0>(p, m, s, wr, wi, xr, xi, yr, yi);
    }
    len = m;
    s *= p;
    std::swap(xr, yr);
    std::swap(xi, yi);
  }
  if (xr != out_r) {
    std::memcpy(out_r, xr, sizeof(V) * size);
    std::memcpy(out_i, xi, sizeof(V) * size);
  }
}

PowerSpectrum::PowerSpectrum(int n) : n_(n), m_(n % 2 == 0 ? n / 2 : n) {
  if (n % 2 == 0) {
    for (int k = 0; k <= m_; ++k) {
      auto [c, s] = Root(k, n);
      split_re_.push_back(c);
      split_im_.push_back(s);
    }
  }
  // Bluestein: Z_k = w_k sum_j (z_j w_j) conj(w_{k-j}), w_k = e^{-pi i k^2 / m}: a circular
  // convolution of size L >= 2m - 1, by FFTs of size L (a power of two).
  bluestein_ = !Smooth(m_);
  int size = m_;
  if (bluestein_)
    for (size = 1; size < 2 * m_ - 1;) size *= 2;
  fft_.Plan(size);
  if (!bluestein_) return;
  for (int k = 0; k < m_; ++k) {
    // k^2 mod 2m keeps the angle exact for large k.
    auto [c, s] = Root((static_cast<int64_t>(k) * k) % (2 * m_), 2 * m_);
    chirp_re_.push_back(c);
    chirp_im_.push_back(s);
  }
  kernel_re_.assign(size, 0.0f);
  kernel_im_.assign(size, 0.0f);
  for (int k = 0; k < m_; ++k) {
    kernel_re_[k] = chirp_re_[k];
    kernel_im_[k] = -chirp_im_[k];
    if (k > 0) {
      kernel_re_[size - k] = chirp_re_[k];
      kernel_im_[size - k] = -chirp_im_[k];
    }
  }
  std::vector<float> scratch(2 * static_cast<size_t>(size));
  fft_.Run(kernel_re_.data(), kernel_im_.data(), scratch.data(), scratch.data() + size);
}

// x (re, im) of m_ values -> its DFT; scratch holds 2 fft_.size values, x fft_.size.
template <class V>
void PowerSpectrum::Transform(V* xr, V* xi, V* scratch) const {
  const int size = fft_.size;
  if (!bluestein_) {
    fft_.Run(xr, xi, scratch, scratch + size);
    return;
  }
  for (int k = 0; k < m_; ++k) Rotate(xr[k], xi[k], chirp_re_[k], chirp_im_[k]);
  for (int k = m_; k < size; ++k) xr[k] = xi[k] = V{};
  fft_.Run(xr, xi, scratch, scratch + size);
  // The inverse transform as a forward one of the conjugate: conj(FFT(conj(X K))) / size.
  for (int k = 0; k < size; ++k) {
    Rotate(xr[k], xi[k], kernel_re_[k], kernel_im_[k]);
    xi[k] = -xi[k];
  }
  fft_.Run(xr, xi, scratch, scratch + size);
  const float scale = 1.0f / static_cast<float>(size);
  for (int k = 0; k < m_; ++k) {
    xr[k] = xr[k] * scale;
    xi[k] = -xi[k] * scale;
    Rotate(xr[k], xi[k], chirp_re_[k], chirp_im_[k]);
  }
}

// x: one frame, or eight frame_stride apart, each windowed by w (Lanes<V>::Deal); buf: 4
// fft_.size values; power: bin k at power[k * stride].
template <class V>
void PowerSpectrum::Power(const float* x, size_t frame_stride, const float* w, V* buf, float* power,
                          int stride) const {
  using L = Lanes<V>;
  const size_t size = fft_.size;
  V* re = buf;
  V* im = buf + size;
  L::Deal(x, frame_stride, w, n_, re, im);
  Transform(re, im, buf + 2 * size);
  if (n_ % 2 == 0) {
    // X_k = (A - i C) / 2, where A = Z_k + conj(Z_{m-k}) and C = w_k (Z_k - conj(Z_{m-k})),
    // w_k = e^{-2 pi i k / n}. Bin m - k has conj(A) and conj(C) (w_{m-k} = -conj(w_k)), so one
    // rotation gives both: X_{m-k} = (conj(A) - i conj(C)) / 2.
    for (int k = 0; 2 * k <= m_; ++k) {
      const int b = k == 0 ? 0 : m_ - k;  // m - k, modulo m
      const V ar = re[k] + re[b], ai = im[k] - im[b];
      V cr = re[k] - re[b], ci = im[k] + im[b];
      Rotate(cr, ci, split_re_[k], split_im_[k]);
      V xr = ar + ci, xi = ai - cr;
      L::Store((xr * xr + xi * xi) * 0.25f, power + static_cast<size_t>(k) * stride);
      if (2 * k == m_) continue;  // bin m / 2 is its own partner
      xr = ar - ci, xi = -ai - cr;
      L::Store((xr * xr + xi * xi) * 0.25f, power + static_cast<size_t>(m_ - k) * stride);
    }
  } else {
    for (int k = 0; k < Bins(); ++k)
      L::Store(re[k] * re[k] + im[k] * im[k], power + static_cast<size_t>(k) * stride);
  }
}

// Power's buffers for V: 4 values of the transform's size, aligned for V. They grow to the
// widest V used, once.
template <class V>
V* PowerSpectrum::Scratch() {
  const size_t floats = 4 * static_cast<size_t>(fft_.size) * Lanes<V>::kWidth + 16;
  if (scratch_.size() < floats) scratch_.resize(floats);
  const auto at = reinterpret_cast<uintptr_t>(scratch_.data());
  return reinterpret_cast<V*>(scratch_.data() + ((64 - at % 64) % 64) / sizeof(float));
}

void PowerSpectrum::Of(const float* x, const float* window, float* power, int stride) {
  Power<float>(x, 0, window, Scratch<float>(), power, stride);
}

// flatten: the template's operators inline here, as AVX2 or AVX-512.
__attribute__((target("avx2"), flatten)) void PowerSpectrum::Of8(const float* x, size_t stride,
                                                                 const float* window,
                                                                 float* power8) {
  Power<Float8>(x, stride, window, Scratch<Float8>(), power8, 8);
}

__attribute__((target("avx512f"), flatten)) void PowerSpectrum::Of16(const float* x, size_t stride,
                                                                     const float* window,
                                                                     float* power16) {
  Power<Float16>(x, stride, window, Scratch<Float16>(), power16, 16);
}

}  // namespace mmfeed
