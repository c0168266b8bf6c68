#!/usr/bin/env python3
"""Mixture benchmark (issue #30): a three-source image / video / text mixture (`sources:` with
weights 5:2:1: image captions, video QA, text-only instructions) against the same samples in
one pre-mixed, shuffled manifest, through the same pipeline (JPEG decode, random resized crop
and normalize; uniform video frames; bytes tokenizer; two consumer ranks), on the same files in
one run. A sample lacks the fields of the other modalities (its `<stage>_present` is 0), so the
pre-mixed side is a `sources:` list of that one manifest (one `source:` needs every field in
every sample): both sides make the same tensors, and the difference is the mixture's dealing.
Each side runs a short and a long pass (1 and --epochs epochs) and throughput is (long - short
samples) / (long - short seconds), so start-up cancels out; the sides take turns for --rounds
rounds and the ratio is the median of the rounds'. Then the resume: a mixture of 100 million
samples an epoch, a trainer attaching with a cursor 40 epochs deep (4 billion positions in)
against one attaching at the start; the time to its first batch, median of --rounds.

usage: mix_bench.py --build BUILD --out DIR [--rounds R] [--epochs E]
"""
import argparse, json, os, pathlib, random, statistics, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import make_photos  # noqa: E402

# name, weight, samples, fields
SOURCES = [("captions", 5, 500, ("image", "text")), ("video_qa", 2, 200, ("video", "text")),
           ("text_sft", 1, 100, ("text",))]
STAGES = """consumers: 2
stages:
  - {name: image, type: image, field: image, workers: 2,
     params: {crop: random_resized_crop, size: [224, 224], flip: 0.5,
              mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], dtype: float32, layout: CHW}}
  - {name: video, type: video, field: video, workers: 2,
     params: {sampling: uniform, frames: 8, size: [112, 112], dtype: uint8, layout: TCHW}}
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 128}}
  - {name: batch, type: batch, inputs: [image, video, text], params: {batch_size: 32}}
output: {ring_slots: 8}
"""


def make_data(data):
    photos = make_photos.make(data / "img", 200, 240, 620, seed=7)
    (data / "clips").mkdir(exist_ok=True)
    clips = []
    for k in range(20):  # 2-4 s, 10 fps, H.264 with B-frames
        clips.append(f"clips/c{k:02d}.mp4")
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                        f"testsrc2=size=320x240:rate=10:duration={2 + k % 3}", "-c:v", "libx264",
                        "-pix_fmt", "yuv420p", str(data / clips[-1])], check=True)
    lines = {}
    rng = random.Random(3)
    for name, _, n, fields in SOURCES:
        rows = []
        for i in range(n):
            row = {"id": f"{name}{i:04d}", "text": f"{name} sample {i}"}
            if "image" in fields:
                row["image"] = f"img/{photos[rng.randrange(len(photos))]['name']}"
            if "video" in fields:
                row["video"] = clips[rng.randrange(len(clips))]
            rows.append(json.dumps(row))
        lines[name] = rows
        (data / f"{name}.jsonl").write_text("\n".join(rows) + "\n")
    # The same samples, each source's share of an epoch once, in one manifest.
    (data / "premixed.jsonl").write_text("\n".join(l for name, *_ in SOURCES for l in lines[name]) + "\n")


def mix_config(epochs, extra=""):
    sources = "".join(f"  - {{name: {n}, type: manifest, path: {n}.jsonl, weight: {w}}}\n" for n, w, *_ in SOURCES)
    return f"pipeline: mix\nsources:\n{sources}mix: {{seed: 42, epochs: {epochs}{extra}}}\n" + STAGES


def premixed_config(epochs):
    return ("pipeline: premixed\nsources:\n  - {name: premixed, type: manifest, path: premixed.jsonl, weight: 1}\n"
            f"mix: {{seed: 42, epochs: {epochs}}}\n" + STAGES)


def start(build, data, name, config):
    (data / f"{name}.yaml").write_text(config)
    sock = str(data / f"{name}.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    log = open(data / f"{name}.log", "w")
    d = subprocess.Popen([f"{build}/bin/mmfeedd", "--config", str(data / f"{name}.yaml"), "--socket", sock],
                         stderr=log, stdout=log)
    while not os.path.exists(sock):
        if d.poll() is not None:
            raise SystemExit(f"mmfeedd failed: {(data / f'{name}.log').read_text()}")
        time.sleep(0.01)
    return d, sock


def run(build, data, name, config):
    d, sock = start(build, data, name, config)
    t0 = time.perf_counter()
    cs = [subprocess.Popen([f"{build}/bin/mmfeed-consume", "--socket", sock, "--rank", str(r), "--json"],
                           stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [json.loads(c.communicate()[0]) for c in cs]
    seconds = time.perf_counter() - t0
    d.wait()
    return {"samples": sum(o["samples"] for o in outs), "seconds": seconds}


def steady(short, long):
    return (long["samples"] - short["samples"]) / (long["seconds"] - short["seconds"])


def first_batch_seconds(build, sock, data, seq, epoch):
    cursor = data / f"cursor-{seq}.json"
    cursor.write_text(json.dumps({"epoch": epoch, "batch": 0, "seq": seq}))
    t0 = time.perf_counter()
    subprocess.run([f"{build}/bin/mmfeed-consume", "--socket", sock, "--rank", "0", "--cursor", str(cursor),
                    "--batches", "1"], check=True, capture_output=True)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=10)
    a = ap.parse_args()
    build, data = pathlib.Path(a.build).resolve(), pathlib.Path(a.out).resolve()
    data.mkdir(parents=True, exist_ok=True)
    make_data(data)
    rates = {"mix": [], "premixed": []}
    for _ in range(a.rounds):
        for side, config in (("mix", mix_config), ("premixed", premixed_config)):
            short = run(build, data, f"{side}-short", config(1))
            long = run(build, data, f"{side}-long", config(a.epochs))
            rates[side].append(steady(short, long))
    ratios = [m / p for m, p in zip(rates["mix"], rates["premixed"])]
    # The resume: 100 M samples an epoch (4,000 passes of the sources), 1,562,500 batches per
    # rank and epoch; a cursor 40 epochs in.
    d, sock = start(build, data, "deep", mix_config(0, ", samples_per_epoch: 100000000"))
    per_epoch = 100_000_000 // 2 // 32
    deep, shallow = [], []
    for _ in range(a.rounds):
        shallow.append(first_batch_seconds(build, sock, data, 0, 0))
        deep.append(first_batch_seconds(build, sock, data, 40 * per_epoch, 40))
    d.kill()
    d.wait()
    result = {
        "samples_per_epoch": sum(n for _, _, n, _ in SOURCES),
        "mix_samples_per_s": statistics.median(rates["mix"]),
        "premixed_samples_per_s": statistics.median(rates["premixed"]),
        "ratio_mix_to_premixed": statistics.median(ratios),
        "ratios": ratios,
        "resume_first_batch_s": {"at_start": statistics.median(shallow),
                                 "at_40_epochs_of_100M": statistics.median(deep)},
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
