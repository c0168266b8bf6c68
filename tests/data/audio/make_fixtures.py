#!/usr/bin/env python3
"""Regenerates the audio test fixtures: a deterministic 3 s test signal (float32 WAV, 16 kHz)
and its Whisper log-mel features computed by a numpy reference written from Whisper's
published definition (openai/whisper, audio.py: log_mel_spectrogram), checked against
torchaudio.transforms.MelSpectrogram where the conventions match.

usage: /usr/bin/python3 tests/data/audio/make_fixtures.py
"""
import os, struct, sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SR, N_FFT, HOP = 16000, 400, 160


def write_float_wav(path, x, sr):
    data = np.asarray(x, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, sr, sr * 4, 4, 32)  # IEEE float, mono
    with open(path, "wb") as f:
        f.write(b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE")
        f.write(b"fmt " + struct.pack("<I", len(fmt)) + fmt)
        f.write(b"data" + struct.pack("<I", len(data)) + data)


def test_signal():
    rng = np.random.default_rng(1234)
    t = np.arange(3 * SR) / SR
    chirp = np.sin(2 * np.pi * (200 * t + 600 * t * t))        # 200 Hz -> 3.8 kHz
    tones = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1250 * t)
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 1.5 * t)
    x = 0.4 * chirp * envelope + tones * (t > 1.0) + 0.02 * rng.standard_normal(t.size)
    return (0.5 * x).astype(np.float32)


def hz_to_mel(f):  # Slaney (librosa htk=False)
    f = np.asarray(f, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)


def mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filters(n_mels):  # librosa.filters.mel(sr, n_fft, n_mels), norm="slaney"
    fft_freqs = np.linspace(0, SR / 2, 1 + N_FFT // 2)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(SR / 2), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    return weights * (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]


def log_mel_reference(x, n_mels):
    """Whisper's log_mel_spectrogram in float64 numpy."""
    x = np.asarray(x, dtype=np.float64)
    padded = np.pad(x, N_FFT // 2, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)  # torch.hann_window (periodic)
    frames = 1 + (padded.size - N_FFT) // HOP
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(frames)[:, None]
    spec = np.fft.rfft(padded[idx] * window, axis=1)
    power = (np.abs(spec) ** 2)[:-1].T                # drop the last frame, [bins, frames]
    mel = mel_filters(n_mels) @ power
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


def torchaudio_log_mel(x, n_mels):
    import torch, torchaudio
    t = torchaudio.transforms.MelSpectrogram(sample_rate=SR, n_fft=N_FFT, hop_length=HOP, n_mels=n_mels, power=2.0,
                                             norm="slaney", mel_scale="slaney", center=True, pad_mode="reflect")
    mel = t(torch.from_numpy(np.asarray(x, dtype=np.float32)))[:, :-1].double()
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).numpy()


def main():
    x = test_signal()
    write_float_wav(os.path.join(HERE, "tone.wav"), x, SR)
    padded4 = np.concatenate([x, np.zeros(SR, np.float32)])  # max_seconds: 4 pads one second
    for name, signal, n_mels in (("tone_logmel80.npy", x, 80), ("tone_pad4s_logmel128.npy", padded4, 128)):
        ref = log_mel_reference(signal, n_mels)
        np.save(os.path.join(HERE, name), ref)
        try:
            diff = np.abs(torchaudio_log_mel(signal, n_mels) - ref).max()
            print(f"{name}: {ref.shape}, numpy reference vs torchaudio: max |diff| = {diff:.2e}")
            assert diff < 1e-3, "torchaudio disagrees with the numpy reference"
        except ImportError:
            print(f"{name}: {ref.shape} (torchaudio not installed: comparison skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
