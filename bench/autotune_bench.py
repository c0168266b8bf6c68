#!/usr/bin/env python3
"""workers: auto against every fixed split: for two pipelines (image-text with heavy crops and a
Qwen3 BPE tokenizer; audio+text with short speech clips), runs the daemon with each split of
worker threads within the budget, then with `workers: auto`, on the same files in one run, and
reports samples/s and the ratio of auto to the best fixed split (target: at least 0.95).

Throughput is measured by `mmfeedctl profile` (the trainers' batches/s over a window) with one
consumer that takes batches as fast as they come: after --warmup seconds for a fixed split, and
after --tune seconds for auto (its tuner moves one worker at most every 6 s).

usage: autotune_bench.py [--build BUILD] [--budget N] [--window S] [--out DIR]
"""
import argparse, gzip, itertools, json, os, pathlib, shutil, subprocess, sys, tempfile, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "tests" / "data" / "tokenizer" / "qwen3-tokenizer.json.gz"
WORDS = ("a photo of the quick brown fox jumping over a lazy dog near the river at sunset while data "
         "loaders keep every accelerator busy with decoded frames and tokenized captions").split()

PIPELINES = {
    "image-text": """pipeline: image-text
source: {{type: manifest, path: manifest.jsonl, shuffle: true, seed: 1, epochs: 0}}
{budget}
stages:
  - {{name: image, type: image, field: image, workers: {w0},
     params: {{crop: random_resized_crop, size: [224, 224], flip: 0.5, dtype: float32, layout: CHW,
              mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}}}}
  - {{name: text, type: text, field: text, workers: {w1},
     params: {{tokenizer: {tokenizer}, max_len: 256}}}}
  - {{name: batch, type: batch, inputs: [image, text], params: {{batch_size: 32}}}}
output: {{ring_slots: 4}}
""",
    "audio-text": """pipeline: audio-text
source: {{type: manifest, path: manifest.jsonl, shuffle: true, seed: 1, epochs: 0}}
{budget}
stages:
  - {{name: audio, type: audio, field: audio, workers: {w0},
     params: {{sample_rate: 16000, features: log_mel, n_mels: 80, max_seconds: 4, crop: head}}}}
  - {{name: text, type: text, field: text, workers: {w1},
     params: {{tokenizer: {tokenizer}, max_len: 256}}}}
  - {{name: batch, type: batch, inputs: [audio, text], params: {{batch_size: 32}}}}
output: {{ring_slots: 4}}
""",
}


def caption(i, words):
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words)) + f" #{i}"


def make_data(d):
    """Photos (ImageNet-sized) and short speech clips, each with a long caption."""
    tok = d / "tokenizer.json"
    with gzip.open(TOKENIZER) as f:
        tok.write_bytes(f.read())
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_photos.py"), str(d), "--count", "64"], check=True)
    clips = []
    for i, voice in enumerate(["en-us", "en", "de", "fr", "es", "it"] * 2):
        wav = d / f"clip{i:02d}.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", "170", "-w", str(wav), caption(i, 6 + i % 5)], check=True)
        clips.append(wav.name)
    with open(d / "image.jsonl", "w") as m:
        for i in range(512):
            m.write(json.dumps({"id": f"i{i}", "image": f"p{i % 64:04d}.jpg", "text": caption(i, 60)}) + "\n")
    with open(d / "audio.jsonl", "w") as m:
        for i in range(512):
            m.write(json.dumps({"id": f"a{i}", "audio": clips[i % len(clips)], "text": caption(i, 60)}) + "\n")
    return tok


def run(build, d, name, tokenizer, w0, w1, budget, settle, window):
    """samples/s of one consumer over `window` seconds after `settle`, and the final split."""
    shutil.copy(d / ("image.jsonl" if name == "image-text" else "audio.jsonl"), d / "manifest.jsonl")
    cfg = d / "bench.yaml"
    cfg.write_text(PIPELINES[name].format(w0=w0, w1=w1, tokenizer=tokenizer,
                                          budget=f"cpu_budget: {budget}" if w0 == "auto" else ""))
    sock = str(d / "bench.sock")
    log = open(d / "daemon.log", "w")
    daemon = subprocess.Popen([f"{build}/bin/mmfeedd", "--config", str(cfg), "--socket", sock], stderr=log)
    ctl = [f"{build}/bin/mmfeedctl", "--socket", sock]
    try:
        while subprocess.run(ctl + ["status"], capture_output=True).returncode != 0:
            if daemon.poll() is not None:
                raise SystemExit(f"mmfeedd exited: {(d / 'daemon.log').read_text()}")
            time.sleep(0.05)
        consumer = subprocess.Popen([f"{build}/bin/mmfeed-consume", "--socket", sock, "--rank", "0"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(settle)
        report = json.loads(subprocess.run(ctl + ["profile", "--seconds", str(window), "--json"],
                                           capture_output=True, text=True, check=True).stdout)
        status = json.loads(subprocess.run(ctl + ["status", "--json"], capture_output=True, text=True,
                                           check=True).stdout)
        consumer.kill()
        consumer.wait()
        return report["consumers"][0]["batches_per_s"] * 32, status["workers"]["split"], report["diagnosis"]
    finally:
        daemon.kill()  # the next daemon takes its socket over
        daemon.wait()
        log.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--budget", type=int, default=4, help="cpu_budget: worker threads of both stages together")
    ap.add_argument("--warmup", type=float, default=4)
    ap.add_argument("--tune", type=float, default=16)
    ap.add_argument("--window", type=float, default=8)
    ap.add_argument("--out", default=str(ROOT / "bench" / "out"))
    a = ap.parse_args()
    d = pathlib.Path(tempfile.mkdtemp(prefix="mmfeed-autotune-"))
    results = {"budget": a.budget, "cores": len(os.sched_getaffinity(0)), "pipelines": {}}
    try:
        tokenizer = make_data(d)
        for name in PIPELINES:
            fixed = {}
            for w0, w1 in itertools.product(range(1, a.budget), repeat=2):
                if w0 + w1 > a.budget:
                    continue
                rate, _, dx = run(a.build, d, name, tokenizer, w0, w1, a.budget, a.warmup, a.window)
                fixed[f"{w0}+{w1}"] = rate
                print(f"{name:<11} fixed {w0}+{w1}: {rate:7.0f} samples/s  ({dx['stage']} {dx['kind']})", flush=True)
            rate, split, dx = run(a.build, d, name, tokenizer, "auto", "auto", a.budget, a.tune, a.window)
            best = max(fixed, key=fixed.get)
            ratio = rate / fixed[best]
            print(f"{name:<11} auto -> {'+'.join(str(v) for v in split.values())}: {rate:7.0f} samples/s = "
                  f"{ratio:.2f}x the best fixed split ({best}, {fixed[best]:.0f} samples/s)", flush=True)
            results["pipelines"][name] = {"fixed": fixed, "auto": rate, "auto_split": split, "best": best,
                                          "ratio": ratio}
    finally:
        shutil.rmtree(d, ignore_errors=True)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "autotune.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
