#include "stages/audio/log_mel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

namespace mmfeed {
namespace {

// FFTW's planner is not thread-safe; plans are made once per worker, so a lock is cheap.
std::mutex& PlannerMutex() {
  static std::mutex mu;
  return mu;
}

// Slaney mel scale (librosa.hz_to_mel / mel_to_hz with htk=False).
constexpr double kFSp = 200.0 / 3, kMinLogHz = 1000.0, kMinLogMel = kMinLogHz / kFSp;
const double kLogStep = std::log(6.4) / 27.0;

double HzToMel(double hz) { return hz < kMinLogHz ? hz / kFSp : kMinLogMel + std::log(hz / kMinLogHz) / kLogStep; }
double MelToHz(double mel) { return mel < kMinLogMel ? mel * kFSp : kMinLogHz * std::exp(kLogStep * (mel - kMinLogMel)); }

}  // namespace

LogMel::LogMel(int sample_rate, int n_fft, int hop, int n_mels)
    : n_fft_(n_fft), hop_(hop), n_mels_(n_mels), n_bins_(n_fft / 2 + 1) {
  window_.resize(n_fft);
  for (int i = 0; i < n_fft; ++i) window_[i] = static_cast<float>(0.5 - 0.5 * std::cos(2 * M_PI * i / n_fft));
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
  frame_ = fftwf_alloc_real(n_fft);
  spectrum_ = fftwf_alloc_complex(n_bins_);
  std::lock_guard<std::mutex> lock(PlannerMutex());
  plan_ = fftwf_plan_dft_r2c_1d(n_fft, frame_, spectrum_, FFTW_MEASURE);
}

LogMel::~LogMel() {
  {
    std::lock_guard<std::mutex> lock(PlannerMutex());
    fftwf_destroy_plan(plan_);
  }
  fftwf_free(frame_);
  fftwf_free(spectrum_);
}

std::vector<float> LogMel::DenseFilters() const {
  std::vector<float> dense(static_cast<size_t>(n_mels_) * n_bins_, 0.0f);
  for (int m = 0; m < n_mels_; ++m)
    for (size_t j = 0; j < bands_[m].weights.size(); ++j) dense[m * n_bins_ + bands_[m].first_bin + j] = bands_[m].weights[j];
  return dense;
}

void LogMel::Compute(const float* x, size_t n, float* out) {
  const int pad = n_fft_ / 2;
  padded_.resize(n + 2 * pad);
  for (int i = 0; i < pad; ++i) {  // reflect: x[pad], ..., x[1] | x | x[n-2], ..., x[n-1-pad]
    padded_[i] = x[pad - i];
    padded_[pad + n + i] = x[n - 2 - i];
  }
  std::memcpy(padded_.data() + pad, x, n * sizeof(float));
  const size_t frames = Frames(n);
  power_.resize(n_bins_);
  float max_log = -1e30f;
  for (size_t t = 0; t < frames; ++t) {
    const float* src = padded_.data() + t * hop_;
    for (int i = 0; i < n_fft_; ++i) frame_[i] = src[i] * window_[i];
    fftwf_execute(plan_);
    for (int k = 0; k < n_bins_; ++k) power_[k] = spectrum_[k][0] * spectrum_[k][0] + spectrum_[k][1] * spectrum_[k][1];
    for (int m = 0; m < n_mels_; ++m) {
      const Band& b = bands_[m];
      float acc = 0;
      for (size_t j = 0; j < b.weights.size(); ++j) acc += b.weights[j] * power_[b.first_bin + j];
      float v = std::log10(std::max(acc, 1e-10f));
      out[m * frames + t] = v;
      max_log = std::max(max_log, v);
    }
  }
  const float floor = max_log - 8.0f;
  for (size_t i = 0; i < static_cast<size_t>(n_mels_) * frames; ++i) out[i] = (std::max(out[i], floor) + 4.0f) / 4.0f;
}

}  // namespace mmfeed
