#!/usr/bin/env python3
"""Side by side: this build of mmfeed against another (--baseline-build, e.g. of the revision
before a refactor), on the same files in one run, for the pipelines a structural change could
slow: image-text (JPEG decode, random resized crop, normalize), a three-source mixture (image
captions, video QA, text; mix_bench.py's), audio (decode, resample, Whisper log-mel), video
(uniform frames), token-budget Qwen3.5-VL batches (each epoch planned from every sample's
cost), and the resume of a 100-million-sample mixture at a cursor 40 epochs deep (the stream's
arithmetic alone). Each pipeline runs a short and a long pass (1 and --epochs epochs) through
the real daemon and two consumers; throughput is (long - short samples) / (long - short
seconds), so start-up cancels out. The builds take turns for --rounds rounds, and each ratio
(this build / the baseline) is the median of the rounds' ratios.

usage: house_bench.py --build BUILD --baseline-build OTHER --out DIR [--rounds R] [--epochs E]
                      [--only image,mix,audio,video,budget,resume]
"""
import argparse, json, os, pathlib, statistics, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import mix_bench  # noqa: E402  (its data, configs, and daemon runs)

TOKENIZER = ROOT / "tests" / "data" / "tokenizer" / "qwen3-tokenizer.json.gz"


def make_audio(data, n=24):
    (data / "audio").mkdir(exist_ok=True)
    rows = []
    for k in range(n):  # 3-9 s tones and noise, WAV / FLAC / MP3
        ext = ("wav", "flac", "mp3")[k % 3]
        f = data / "audio" / f"a{k:02d}.{ext}"
        if not f.exists():
            src = f"sine=frequency={220 + 40 * k}:duration={3 + k % 7}" if k % 2 else \
                f"anoisesrc=duration={3 + k % 7}:amplitude=0.2"
            subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", src, "-ar", "44100", str(f)],
                           check=True)
        rows.append(json.dumps({"id": f"a{k}", "audio": f"audio/{f.name}", "text": f"clip {k}"}))
    (data / "audio.jsonl").write_text("\n".join(rows) + "\n")


def make_qwen(data):
    rows = []
    for line in (data / "captions.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.append(json.dumps({"id": r["id"], "image": r["image"], "text": r["text"],
                                "answer": "a photo " * (1 + len(r["id"]) % 9)}))
    (data / "qwen.jsonl").write_text("\n".join(rows) + "\n")


def one_source(name, path, stages, epochs):
    return (f"pipeline: {name}\nsource: {{type: manifest, path: {path}, shuffle: true, seed: 3, "
            f"epochs: {epochs}}}\nconsumers: 2\n{stages}output: {{ring_slots: 8}}\non_error: skip\n")


IMAGE = """stages:
  - {name: image, type: image, field: image, workers: 2,
     params: {crop: random_resized_crop, size: [224, 224], flip: 0.5,
              mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], dtype: float32, layout: CHW}}
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 128}}
  - {name: batch, type: batch, inputs: [image, text], params: {batch_size: 32}}
"""
AUDIO = """stages:
  - {name: audio, type: audio, field: audio, workers: 2,
     params: {sample_rate: 16000, features: log_mel, n_mels: 80, max_seconds: 30, crop: head}}
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 256}}
  - {name: batch, type: batch, inputs: [audio, text], params: {batch_size: 4}}
"""
VIDEO = """stages:
  - {name: video, type: video, field: video, workers: 2,
     params: {sampling: uniform, frames: 8, size: [112, 112], dtype: uint8, layout: TCHW}}
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 128}}
  - {name: batch, type: batch, inputs: [video, text], params: {batch_size: 8}}
"""
BUDGET = f"""stages:
  - {{name: pixel_values, type: qwen_vision, field: image, workers: 2,
     params: {{patch_size: 16, temporal_patch_size: 2, merge_size: 2, min_pixels: 65536,
              max_pixels: 262144, mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5], dtype: float32}}}}
  - {{name: input_ids, type: qwen_chat, field: text, workers: 1,
     params: {{tokenizer: {TOKENIZER}, max_len: 2048,
              template: "<|im_start|>user\\n{{image}}{{text}}<|im_end|>\\n<|im_start|>assistant\\n{{answer}}<|im_end|>\\n",
              answer_field: answer, image_grid: image_grid_thw, merge_size: 2}}}}
  - {{name: batch, type: batch, inputs: [pixel_values, input_ids],
     params: {{batch_size: 8, max_tokens: 4096, max_patches: 8192}}}}
"""

PIPELINES = {
    "image": lambda e: one_source("image", "captions.jsonl", IMAGE, e),
    "mix": lambda e: mix_bench.mix_config(e),
    "audio": lambda e: one_source("audio", "audio.jsonl", AUDIO, e),
    "video": lambda e: one_source("video", "video_qa.jsonl", VIDEO, e),
    "budget": lambda e: one_source("budget", "qwen.jsonl", BUDGET, e),
}


def rate(build, data, name, epochs):
    short = mix_bench.run(build, data, f"{name}-short", PIPELINES[name](1))
    long = mix_bench.run(build, data, f"{name}-long", PIPELINES[name](epochs))
    return mix_bench.steady(short, long)


def resume_seconds(build, data, rounds):
    d, sock = mix_bench.start(build, data, "deep", mix_bench.mix_config(0, ", samples_per_epoch: 100000000"))
    per_epoch = 100_000_000 // 2 // 32
    deep = [mix_bench.first_batch_seconds(build, sock, data, 40 * per_epoch, 40) for _ in range(rounds)]
    d.kill()
    d.wait()
    return statistics.median(deep)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--baseline-build", required=True)
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "house"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--only", default="image,mix,audio,video,budget,resume")
    a = ap.parse_args()
    builds = {"this": pathlib.Path(a.build).resolve(), "baseline": pathlib.Path(a.baseline_build).resolve()}
    data = pathlib.Path(a.out).resolve()
    data.mkdir(parents=True, exist_ok=True)
    mix_bench.make_data(data)
    make_audio(data)
    make_qwen(data)
    rows = []
    for name in a.only.split(","):
        if name == "resume":
            got = {side: [] for side in builds}
            for _ in range(a.rounds):
                for side, build in builds.items():
                    got[side].append(resume_seconds(build, data, 3))
            ratios = [b / t for t, b in zip(got["this"], got["baseline"])]
            rows.append((name, "s to the first batch", statistics.median(got["this"]),
                         statistics.median(got["baseline"]), statistics.median(ratios), min(ratios), max(ratios)))
            continue
        got = {side: [] for side in builds}
        for _ in range(a.rounds):
            for side, build in builds.items():
                got[side].append(rate(build, data, name, a.epochs))
        ratios = [t / b for t, b in zip(got["this"], got["baseline"])]
        rows.append((name, "samples/s", statistics.median(got["this"]), statistics.median(got["baseline"]),
                     statistics.median(ratios), min(ratios), max(ratios)))
    print(f"{'pipeline':<8} {'unit':<22} {'this':>10} {'baseline':>10} {'ratio':>7}  rounds' range")
    for name, unit, this, base, ratio, lo, hi in rows:
        print(f"{name:<8} {unit:<22} {this:>10.3f} {base:>10.3f} {ratio:>6.3f}x  {lo:.3f}-{hi:.3f}")
    print("(ratio: this build's speed over the baseline's, median of the rounds; > 1 is faster)")
    keys = ("pipeline", "unit", "this", "baseline", "ratio", "ratio_min", "ratio_max")
    (data / "house.json").write_text(json.dumps([dict(zip(keys, r)) for r in rows], indent=1))


if __name__ == "__main__":
    main()
