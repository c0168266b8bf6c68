// Power spectra of windowed real frames: |X_k|^2 of the DFT X of n samples times a window, for
// the bins k = 0 .. n/2 (what an STFT's magnitude squared keeps), unnormalized as numpy's rfft.
//
// A mixed-radix Stockham FFT (radix 4, 2, 3, 5, and any other prime up to kMaxRadix; a size
// with a larger prime factor goes through Bluestein's chirp-z convolution) of the complex
// size n/2 for even n (the even samples as real parts, the odd as imaginary, split after) or n
// for odd n. The transform is written once over a value type: a float for one frame, or eight
// floats (an AVX2 vector) for eight frames, one per lane, with the same operations in the same
// order, so both give the same bits; sixteen frames (AVX-512) likewise. No multiply and add are
// fused (built with -ffp-contract=off). Eight or sixteen frames are read eight samples at a time
// from each and transposed into the transform's layout as they are windowed.
//
// A PowerSpectrum is made once per worker and used from one thread at a time.
#pragma once

#include <cstddef>
#include <vector>

namespace mmfeed {

class PowerSpectrum {
 public:
  // REQUIRES: 2 <= n <= 65536.
  explicit PowerSpectrum(int n);

  int Bins() const { return n_ / 2 + 1; }
  // power[k * stride] = |X_k|^2, k in [0, Bins()), for the frame x[i] * window[i], i < n.
  void Of(const float* x, const float* window, float* power, int stride);
  // Eight frames at once, frame f x[f * stride + i] * window[i]: power8[k * 8 + f] is its bin
  // k. Each lane's bits equal Of's for that frame. AVX2 (the caller checks UseAvx2()).
  void Of8(const float* x, size_t stride, const float* window, float* power8);
  // Sixteen frames at once, as Of8: power16[k * 16 + f]. AVX-512 (the caller checks
  // UseAvx512()).
  void Of16(const float* x, size_t stride, const float* window, float* power16);

  static constexpr int kMaxRadix = 31;

 private:
  // One Stockham pass: radix p over the current length, its twiddles at tw[twiddle_at ...].
  struct Pass {
    int radix, twiddle_at;
  };
  // A complex FFT of a fixed size (its passes and twiddles, e^{-2 pi i jq / len}).
  struct Fft {
    int size = 0;
    std::vector<Pass> passes;
    std::vector<float> tw_re, tw_im;
    void Plan(int size);
    // x (re, im) of `size` values -> its DFT in x; y is scratch of the same size.
    template <class V>
    void Run(V* xr, V* xi, V* yr, V* yi) const;
  };
  template <class V>
  void Transform(V* xr, V* xi, V* scratch) const;
  template <class V>
  V* Scratch();
  template <class V>
  void Power(const float* x, size_t frame_stride, const float* window, V* buf, float* power,
             int stride) const;

  int n_, m_;  // m_: the complex size, n / 2 for even n, else n
  Fft fft_;    // of m_, or of the Bluestein size (a power of two >= 2 m_ - 1)
  bool bluestein_ = false;
  std::vector<float> chirp_re_, chirp_im_;    // Bluestein: e^{-pi i k^2 / m}, k < m
  std::vector<float> kernel_re_, kernel_im_;  // Bluestein: the chirp's conjugate, transformed
  std::vector<float> split_re_, split_im_;    // even n: e^{-2 pi i k / n}, k <= m
  std::vector<float> scratch_;                // Power's buffers (Scratch)
};

}  // namespace mmfeed
