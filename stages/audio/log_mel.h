// Whisper's log-mel spectrogram, as published (openai/whisper audio.py): periodic Hann window
// of n_fft (400), hop 160, centered STFT with reflect padding, power spectrum, the last frame
// dropped, a Slaney-normalized mel filterbank (librosa's, htk=False), log10 of max(x, 1e-10),
// then max(x, max(x) - 8) and (x + 4) / 4.
//
// A LogMel holds the window, the filterbank and its transform (stages/audio/power_spectrum.h);
// it is made once per worker and used from that worker's thread only.
#pragma once

#include <cstddef>
#include <vector>

#include "stages/audio/power_spectrum.h"

namespace mmfeed {

class LogMel {
 public:
  LogMel(int sample_rate, int n_fft, int hop, int n_mels);

  // Frames for `samples` samples: samples / hop (the STFT's last frame is dropped).
  size_t Frames(size_t samples) const { return samples / hop_; }
  // Writes [n_mels, Frames(n)] to out for a signal of n samples: the `valid` ones at `samples`
  // (only those are read), then zeros (padding). Frames that see only zeros are not
  // transformed, their value is the silence value.
  // REQUIRES: n > n_fft / 2 (reflect padding), valid <= n.
  void Compute(const float* samples, size_t n, float* out, size_t valid);
  void Compute(const float* samples, size_t n, float* out) { Compute(samples, n, out, n); }

 private:
  struct Band {
    int first_bin;
    std::vector<float> weights;
  };
  // Compute's signal: n samples, the first `valid` of them at `samples`, then zeros.
  struct Signal {
    const float* samples;
    size_t n, valid;
  };
  // Frames [t, t + count), count <= 16, of n_fft samples each (before the window), frame f at
  // the result + f * *stride: where they lie in the signal, or, when one of them reaches into
  // the reflect padding or past the valid samples, made in the edge slots.
  const float* FramesAt(const Signal& x, size_t t, int count, size_t* stride);
  // Frames [t0, t0 + 8) of Compute's loop in AVX2 (Sixteen: [t0, t0 + 16) in AVX-512), each
  // band's sum over the frames at once: their log-mel values into `out` (of `frames` columns)
  // and their maximum into max_log.
  void EightFrames(const Signal& x, size_t t0, size_t frames, float* out, float* max_log);
  void SixteenFrames(const Signal& x, size_t t0, size_t frames, float* out, float* max_log);
  // Both, over a vector type V: one frame per lane, its power spectrum in power_lanes_.
  template <class V>
  void FrameBlock(const Signal& x, size_t t0, size_t frames, float* out, float* max_log);

  int n_fft_, hop_, n_mels_, n_bins_;
  std::vector<float> window_;
  std::vector<Band> bands_;
  PowerSpectrum spectrum_;
  std::vector<float> edges_;  // 16 slots of n_fft samples (FramesAt)
  std::vector<float> power_, mel_;
  std::vector<float> power_lanes_;  // [bin][frame] of 8 or 16 power spectra (Eight/SixteenFrames)
};

}  // namespace mmfeed
