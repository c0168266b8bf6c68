#include "stages/audio/log_mel.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "base/simd.h"

namespace mmfeed {
namespace {

// Slaney mel scale (librosa.hz_to_mel / mel_to_hz with htk=False).
constexpr double kFSp = 200.0 / 3, kMinLogHz = 1000.0, kMinLogMel = kMinLogHz / kFSp;
const double kLogStep = std::log(6.4) / 27.0;

// log10 of a positive normal float (std::log10 is a scalar call, and was a tenth of the audio
// stage's time). x = 2^e m with m in [0.707, 1.414): subtracting the bits of 0.707 from x's
// makes e the exponent field and leaves m's mantissa bits over those of 0.707 (no compare and
// blend to move m into the range). log10(m) comes from the atanh series in s = (m - 1) / (m + 1),
// |s| < 0.172, times 2 log10(e): error below 1.3e-6 for x in [1e-10, 1e6]. Log10Lanes does the
// same operations in the same order on eight or sixteen values (no FMA in either), so all give
// the same bits.
constexpr uint32_t kSqrtHalfBits = 0x3F3504F3;  // 0.70710677f
constexpr float kLog10_2 = 0.301029996f, kTwoLog10E = 0.868588964f;

inline float Log10Fast(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t t = bits - kSqrtHalfBits;
  const int e = static_cast<int32_t>(t) >> 23;
  const uint32_t mbits = (t & 0x7FFFFF) + kSqrtHalfBits;
  float m;
  std::memcpy(&m, &mbits, 4);
  const float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
  const float log_m =
      kTwoLog10E * s *
      (1.0f + s2 * (1.0f / 3 + s2 * (1.0f / 5 + s2 * (1.0f / 7 + s2 * (1.0f / 9)))));
  return static_cast<float>(e) * kLog10_2 + log_m;
}

// Log10Fast on each lane of a Float8 or Float16, in place.
template <class V>
__attribute__((always_inline)) inline void Log10Lanes(V& v) {
  // The int32 vector of V's size (an attribute of a dependent size would be dropped).
  using Int8 = int32_t __attribute__((vector_size(32)));
  using Int16 = int32_t __attribute__((vector_size(64)));
  using Int = std::conditional_t<sizeof(V) == 32, Int8, Int16>;
  const Int t = (Int)v - static_cast<int32_t>(kSqrtHalfBits);  // the bits, as ints
  const Int e = t >> 23;
  const V m = (V)((t & 0x7FFFFF) + static_cast<int32_t>(kSqrtHalfBits));
  const V s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
  V p = s2 * (1.0f / 9);
  p = s2 * (1.0f / 7 + p);
  p = s2 * (1.0f / 5 + p);
  p = s2 * (1.0f / 3 + p);
  const V log_m = (kTwoLog10E * s) * (1.0f + p);
  v = __builtin_convertvector(e, V) * kLog10_2 + log_m;
}

// out = x86's max(a, b) on each lane: b where either is NaN (a vector ?: compiles to a compare
// and blend).
__attribute__((target("avx2"))) inline void MaxOf(const Float8& a, const Float8& b, Float8& out) {
  out = _mm256_max_ps(a, b);
}
__attribute__((target("avx512f"))) inline void MaxOf(const Float16& a, const Float16& b,
                                                     Float16& out) {
  // Zero-masked with every lane kept: plain _mm512_max_ps warns in GCC 12 (its undefined source).
  out = _mm512_maskz_max_ps(0xFFFF, a, b);
}

__attribute__((target("avx2"), flatten)) void Log10x8(float* v) {
  Float8 x;
  std::memcpy(&x, v, sizeof x);
  Log10Lanes(x);
  std::memcpy(v, &x, sizeof x);
}

// log10 of every value of v[0, n), eight at a time with `avx2` (UseAvx2(), asked once per call
// of Compute).
void Log10All(float* v, int n, bool avx2) {
  int i = 0;
  if (avx2)
    for (; i + 8 <= n; i += 8) Log10x8(v + i);
  for (; i < n; ++i) v[i] = Log10Fast(v[i]);
}

double HzToMel(double hz) {
  return hz < kMinLogHz ? hz / kFSp : kMinLogMel + std::log(hz / kMinLogHz) / kLogStep;
}
double MelToHz(double mel) {
  return mel < kMinLogMel ? mel * kFSp : kMinLogHz * std::exp(kLogStep * (mel - kMinLogMel));
}

}  // namespace

LogMel::LogMel(int sample_rate, int n_fft, int hop, int n_mels)
    : n_fft_(n_fft),
      hop_(hop),
      n_mels_(n_mels),
      n_bins_(n_fft / 2 + 1),
      spectrum_(n_fft),
      edges_(static_cast<size_t>(n_fft) * 16),
      power_(n_bins_),
      mel_(n_mels),
      power_lanes_(static_cast<size_t>(n_bins_) * 16) {
  window_.resize(n_fft);
  for (int i = 0; i < n_fft; ++i)
    window_[i] = static_cast<float>(0.5 - 0.5 * std::cos(2 * M_PI * i / n_fft));
  // librosa.filters.mel(sr, n_fft, n_mels, fmin=0, fmax=sr/2, htk=False, norm="slaney").
  std::vector<double> fft_freqs(n_bins_), mel_f(n_mels + 2);
  for (int i = 0; i < n_bins_; ++i) fft_freqs[i] = static_cast<double>(i) * sample_rate / n_fft;
  double mel_max = HzToMel(sample_rate / 2.0);
  for (int i = 0; i < n_mels + 2; ++i) mel_f[i] = MelToHz(mel_max * i / (n_mels + 1));
  for (int m = 0; m < n_mels; ++m) {
    double enorm = 2.0 / (mel_f[m + 2] - mel_f[m]);
    Band band{-1, {}};
    for (int k = 0; k < n_bins_; ++k) {
      double lower = (fft_freqs[k] - mel_f[m]) / (mel_f[m + 1] - mel_f[m]);
      double upper = (mel_f[m + 2] - fft_freqs[k]) / (mel_f[m + 2] - mel_f[m + 1]);
      double w = std::max(0.0, std::min(lower, upper)) * enorm;
      if (w > 0) {
        if (band.first_bin < 0) band.first_bin = k;
        band.weights.resize(k - band.first_bin + 1, 0.0f);
        band.weights[k - band.first_bin] = static_cast<float>(w);
      }
    }
    if (band.first_bin < 0) band.first_bin = 0;
    bands_.push_back(std::move(band));
  }
}

const float* LogMel::FramesAt(const Signal& x, size_t t, int count, size_t* stride) {
  const ptrdiff_t first = static_cast<ptrdiff_t>(t) * hop_ - n_fft_ / 2;
  const auto n = static_cast<ptrdiff_t>(x.n), valid = static_cast<ptrdiff_t>(x.valid);
  if (first >= 0 && first + (count - 1) * hop_ + n_fft_ <= valid) {
    *stride = static_cast<size_t>(hop_);
    return x.samples + first;
  }
  *stride = static_cast<size_t>(n_fft_);
  for (int f = 0; f < count; ++f) {
    float* frame = edges_.data() + static_cast<size_t>(f) * n_fft_;
    for (int i = 0; i < n_fft_; ++i) {
      ptrdiff_t k = first + f * hop_ + i;
      if (k < 0)
        k = -k;  // x[pad], ..., x[1] before x[0]
      else if (k >= n)
        k = 2 * (n - 1) - k;  // x[n - 2], x[n - 3], ... after x[n - 1]
      frame[i] = k < valid ? x.samples[k] : 0.0f;
    }
  }
  return edges_.data();
}

// Each lane is one frame: the same multiplies and adds in the same order as Compute's loop.
template <class V>
void LogMel::FrameBlock(const Signal& x, size_t t0, size_t frames, float* out, float* max_log) {
  constexpr int kWidth = sizeof(V) / sizeof(float);
  size_t stride;
  const float* first = FramesAt(x, t0, kWidth, &stride);
  float* power = power_lanes_.data();
  if constexpr (kWidth == 8)
    spectrum_.Of8(first, stride, window_.data(), power);
  else
    spectrum_.Of16(first, stride, window_.data(), power);
  const V tiny = V{} + 1e-10f;
  V most = V{} + *max_log;
  for (int m = 0; m < n_mels_; ++m) {
    const Band& b = bands_[m];
    const float* p = power + static_cast<size_t>(b.first_bin) * kWidth;
    V acc{};
    for (size_t j = 0; j < b.weights.size(); ++j) {
      V pj;
      std::memcpy(&pj, p + j * kWidth, sizeof pj);
      acc = acc + b.weights[j] * pj;
    }
    V mel;
    MaxOf(tiny, acc, mel);  // std::max(acc, 1e-10f), NaN kept
    Log10Lanes(mel);
    std::memcpy(out + static_cast<size_t>(m) * frames + t0, &mel, sizeof mel);
    MaxOf(mel, most, most);
  }
  for (int f = 0; f < kWidth; ++f) *max_log = std::max(*max_log, most[f]);
}

__attribute__((target("avx2"), flatten)) void LogMel::EightFrames(const Signal& x, size_t t0,
                                                                  size_t frames, float* out,
                                                                  float* max_log) {
  FrameBlock<Float8>(x, t0, frames, out, max_log);
}

__attribute__((target("avx512f"), flatten)) void LogMel::SixteenFrames(const Signal& x, size_t t0,
                                                                       size_t frames, float* out,
                                                                       float* max_log) {
  FrameBlock<Float16>(x, t0, frames, out, max_log);
}

void LogMel::Compute(const float* x, size_t n, float* out, size_t valid) {
  const size_t pad = static_cast<size_t>(n_fft_ / 2), hop = static_cast<size_t>(hop_);
  const size_t frames = Frames(n);
  // Frame t covers x[t*hop - pad, t*hop - pad + n_fft) (FramesAt). Once t*hop - pad >= valid and
  // the window stays left of the reflected tail, it is all zeros.
  size_t silent_from = frames;
  if (valid + 2 * pad < n) silent_from = std::min(frames, (valid + pad + hop - 1) / hop);
  const Signal signal{x, n, valid};
  float max_log = -1e30f;
  const bool avx2 = UseAvx2();
  size_t t = 0;
  if (UseAvx512())
    for (; t + 16 <= silent_from; t += 16) SixteenFrames(signal, t, frames, out, &max_log);
  if (avx2)
    for (; t + 8 <= silent_from; t += 8) EightFrames(signal, t, frames, out, &max_log);
  for (; t < silent_from; ++t) {
    size_t stride;
    spectrum_.Of(FramesAt(signal, t, 1, &stride), window_.data(), power_.data(), 1);
    for (int m = 0; m < n_mels_; ++m) {
      const Band& b = bands_[m];
      float acc = 0;
      for (size_t j = 0; j < b.weights.size(); ++j) acc += b.weights[j] * power_[b.first_bin + j];
      mel_[m] = std::max(acc, 1e-10f);
    }
    Log10All(mel_.data(), n_mels_, avx2);
    for (int m = 0; m < n_mels_; ++m) {
      out[m * frames + t] = mel_[m];
      max_log = std::max(max_log, mel_[m]);
    }
  }
  // The silent frames' value (log10 of the 1e-10 floor) counts in the maximum too; their
  // scaled value is written once per row.
  const float silence = Log10Fast(1e-10f);
  if (silent_from < frames) max_log = std::max(max_log, silence);
  const float floor = max_log - 8.0f, scaled_silence = (std::max(silence, floor) + 4.0f) / 4.0f;
  for (int m = 0; m < n_mels_; ++m) {
    float* row = out + static_cast<size_t>(m) * frames;
    for (size_t t = 0; t < silent_from; ++t) row[t] = (std::max(row[t], floor) + 4.0f) / 4.0f;
    std::fill(row + silent_from, row + frames, scaled_silence);
  }
}

}  // namespace mmfeed
