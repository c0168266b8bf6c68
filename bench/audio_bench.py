#!/usr/bin/env python3
"""Audio benchmark: decode + resample to 16 kHz + Whisper log-mel (80 mels, 30 s windows),
in seconds of audio per second of one core, for mmfeed's audio stage and, in the same run on
the same files, a bare FFmpeg decode + libswresample (mmfeed-bench-audio), torchaudio
(torchaudio.load + functional.resample + MelSpectrogram + Whisper's log scaling) and the numpy
reference of Whisper's features (log-mel step only). Speech clips are made with espeak-ng
(several voices, 5-30 s) and encoded to WAV, FLAC and MP3 with ffmpeg. mmfeed and torchaudio
run in alternating rounds (after one warm-up round each); the figures are the rounds' medians, and
the ratio to the bare decode the median of each run's own ratio (mmfeed-bench-audio times the
two side by side, file by file).

usage: audio_bench.py [--build BUILD] [--out DIR] [--rounds N]
"""
import argparse, json, os, pathlib, statistics, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "data" / "audio"))
import make_fixtures as ref  # the numpy reference: log_mel_reference

SENTENCE = ("The quick brown fox jumps over the lazy dog while the data loader keeps every GPU busy. "
            "Speech recognition models learn from thousands of hours of audio like this one. ")
VOICES = ["en-us", "en", "de", "fr", "es", "it"]


def make_clips(out):
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for i, voice in enumerate(VOICES):
        for k, words in enumerate((14, 40, 75)):  # about 5, 15 and 28 seconds
            base = out / f"{voice}-{k}"
            wav = base.with_suffix(".wav")
            if not wav.exists():
                text = " ".join((SENTENCE * 3).split()[:words])
                subprocess.run(["espeak-ng", "-v", voice, "-s", "150", "-w", str(wav), text], check=True)
            fmt = ("wav", "flac", "mp3")[(i + k) % 3]
            f = base.with_suffix("." + fmt)
            if fmt != "wav" and not f.exists():
                subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(wav), str(f)], check=True)
            files.append(f)
    return files


def torchaudio_run(files, repeat):
    import torch, torchaudio
    torch.set_num_threads(1)
    mel = torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_fft=400, hop_length=160, n_mels=80, power=2.0,
                                               norm="slaney", mel_scale="slaney")
    seconds = 0.0
    t0 = time.perf_counter()
    for _ in range(repeat):
        for f in files:
            w, sr = torchaudio.load(str(f))
            w = torchaudio.functional.resample(w.mean(0), sr, 16000)
            seconds += w.numel() / 16000
            w = torch.nn.functional.pad(w[:480000], (0, max(0, 480000 - w.numel())))
            m = mel(w)[:, :-1].clamp(min=1e-10).log10()
            m = (torch.maximum(m, m.max() - 8.0) + 4.0) / 4.0
    return seconds / (time.perf_counter() - t0)


def numpy_log_mel_run(windows):
    import numpy as np
    x = np.sin(np.arange(480000) * 0.01).astype(np.float32)
    t0 = time.perf_counter()
    for _ in range(windows):
        ref.log_mel_reference(x, 80)
    return windows * 30.0 / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "audio"))
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.environ.pop("OPENBLAS_CORETYPE", None)  # see the env notes: numpy runs its current kernels
    files = make_clips(pathlib.Path(a.out))

    def mmfeed_run():
        return json.loads(subprocess.run([f"{a.build}/bin/mmfeed-bench-audio", "--repeat", "2", *map(str, files)],
                                         capture_output=True, text=True, check=True).stdout)

    mmfeed_run(), torchaudio_run(files, 1)  # warm-up: page cache, torch's kernels and plans
    mm, ta = [], []
    for _ in range(a.rounds):
        mm.append(mmfeed_run())
        ta.append(torchaudio_run(files, 1))
    med = lambda key: statistics.median(r[key] for r in mm)  # noqa: E731
    res = {
        "clips": len(files),
        "rounds": a.rounds,
        "audio_seconds": mm[0]["audio_seconds"] / 2,
        "mmfeed_decode_resample_logmel": med("pipeline_audio_s_per_s"),
        "bare_ffmpeg_decode_resample": med("decode_resample_audio_s_per_s"),
        "torchaudio_load_resample_melspectrogram": statistics.median(ta),
        "mmfeed_log_mel_only": med("log_mel_audio_s_per_s"),
        "numpy_reference_log_mel_only": numpy_log_mel_run(5),
    }
    res["mmfeed_vs_torchaudio"] = res["mmfeed_decode_resample_logmel"] / res["torchaudio_load_resample_melspectrogram"]
    # Each mmfeed-bench-audio run times the stage and the bare decode file by file, side by side: the
    # ratio is the median of the runs' own ratios, with their spread.
    bare = sorted(r["pipeline_audio_s_per_s"] / r["decode_resample_audio_s_per_s"] for r in mm)
    res["mmfeed_vs_bare_decode_resample"] = statistics.median(bare)
    res["mmfeed_vs_bare_decode_resample_range"] = [bare[0], bare[-1]]
    res["mmfeed_log_mel_vs_numpy"] = res["mmfeed_log_mel_only"] / res["numpy_reference_log_mel_only"]
    print(json.dumps(res, indent=2))
    print(f"\n| audio, one core | seconds of audio per second | ratio |\n|---|---|---|\n"
          f"| mmfeed: decode + resample + log-mel | {res['mmfeed_decode_resample_logmel']:.0f} | "
          f"{res['mmfeed_vs_torchaudio']:.2f}x torchaudio, {res['mmfeed_vs_bare_decode_resample']:.3f}x bare "
          f"({bare[0]:.3f}-{bare[-1]:.3f}) |\n"
          f"| bare FFmpeg decode + libswresample (no log-mel) | {res['bare_ffmpeg_decode_resample']:.0f} | - |\n"
          f"| torchaudio: load + resample + MelSpectrogram | {res['torchaudio_load_resample_melspectrogram']:.0f} | 1.00 |\n"
          f"| mmfeed: log-mel step alone | {res['mmfeed_log_mel_only']:.0f} | {res['mmfeed_log_mel_vs_numpy']:.1f}x numpy |\n"
          f"| numpy reference: log-mel step alone | {res['numpy_reference_log_mel_only']:.0f} | 1.00 |")


if __name__ == "__main__":
    sys.exit(main())
