#!/usr/bin/env python3
"""Qwen3.5 image/video + chat benchmark: mmfeed running configs/qwen3.5-vl.yaml (patches, grids,
chat ids with image pads, labels; one consumer rank) against the Python pipeline a user would
write (PIL open + the reference smart_resize, bicubic and patchify in numpy,
tests/reference/qwen_vision_reference.py, in DataLoader(num_workers=2) batches of 8 with the
patches concatenated), on the same photos in one run; the video set runs
configs/qwen3.5-vl-video.yaml against the reference's preprocess_video (PyAV decoding up to the
last sampled frame, as transformers' PyAV loader does, then PIL and numpy) likewise, on 640x360
30 fps clips of 6-14 s. The baseline does not tokenize: Hugging
Face tokenizers cannot be installed offline here, and tokenizing would only add to its time, so
the ratio is a lower bound. Steady state: each side runs a short and a long pass and
throughput is (long - short samples) / (long - short seconds); the sides take turns for
--rounds rounds and the ratio is the median of the rounds'.

usage: qwen_bench.py --build BUILD --out DIR [--short N] [--long N] [--rounds R]
                     [--sets imagenet,large,video]
"""
import argparse, json, os, pathlib, random, statistics, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = "/usr/bin/python3"
sys.path.insert(0, str(ROOT / "scripts"))
import make_photos  # noqa: E402

TOKENIZER = ROOT / "tests" / "data" / "tokenizer" / "qwen3-tokenizer.json.gz"
SETS = {"imagenet": (240, 620), "large": (1000, 2000), "video": None}  # photo widths
VIDEO_SHARE = 4  # the video set runs a quarter of --short and --long samples
BASELINE = r'''
import json, sys, time
sys.path.insert(0, sys.argv[3])
import numpy as np, torch
from torch.utils.data import DataLoader, Dataset
import qwen_vision_reference as ref

class Chat(Dataset):
    def __init__(self, manifest, limit):
        self.rows = [json.loads(l) for l in open(manifest)][:limit]
        self.dir = manifest.rsplit("/", 1)[0]
    def __len__(self):
        return len(self.rows)
    def __getitem__(self, i):
        row = self.rows[i]
        if "video" in row:
            patches, grid, _ = ref.preprocess_video(self.dir + "/" + row["video"])
        else:
            patches, grid = ref.preprocess_image(self.dir + "/" + row["image"], max_pixels=1003520)
        return torch.from_numpy(patches), torch.tensor(grid, dtype=torch.int32)

def collate(items):
    return torch.cat([p for p, _ in items]), torch.stack([g for _, g in items])

t0 = time.perf_counter()
n = 0
for patches, grids in DataLoader(Chat(sys.argv[1], int(sys.argv[2])), batch_size=8, shuffle=True, num_workers=2,
                                 collate_fn=collate):
    n += len(grids)
print(json.dumps({"samples": n, "seconds": time.perf_counter() - t0}))
'''


def make_set(data, name, count):
    d = data / name
    if name == "video":
        d.mkdir(parents=True, exist_ok=True)
        media = []
        for i in range(count // 10):
            clip = f"clip{i}.mp4"
            if not (d / clip).exists():
                subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                                f"testsrc2=size=640x360:rate=30:duration={6 + i % 9}", "-c:v", "libx264",
                                "-g", "60", "-pix_fmt", "yuv420p", str(d / clip)], check=True)
            media.append(("video", clip))
    else:
        lo, hi = SETS[name]
        media = [("image", p["name"]) for p in make_photos.make(d, count, lo, hi, seed=11)]
    rng = random.Random(0)
    words = ("what", "is", "in", "the", "photo", "a", "red", "house", "dog", "park", "describe", "it")
    with open(d / "manifest.jsonl", "w") as m:
        for kind, path in media:
            m.write(json.dumps({"id": path, kind: path,
                                "text": " ".join(rng.choice(words) for _ in range(12)) + "?",
                                "answer": " ".join(rng.choice(words) for _ in range(30)) + "."}) + "\n")
    return d


def manifest(d, samples):
    """The set's samples repeated to `samples` lines."""
    lines = (d / "manifest.jsonl").read_text().splitlines()
    path = d / f"manifest-{samples}.jsonl"
    path.write_text("".join(json.dumps(dict(json.loads(lines[i % len(lines)]), id=f"s{i}")) + "\n"
                            for i in range(samples)))
    return path


def run_mmfeed(build, d, samples):
    config = "qwen3.5-vl-video.yaml" if d.name == "video" else "qwen3.5-vl.yaml"
    cfg = (ROOT / "configs" / config).read_text()
    cfg = cfg.replace("path: manifest.jsonl", f"path: manifest-{samples}.jsonl")
    cfg = cfg.replace("../tests/data/tokenizer/qwen3-tokenizer.json.gz", str(TOKENIZER))
    (d / "bench.yaml").write_text(cfg)
    daemon, sock = start_daemon(build, d)
    t0 = time.perf_counter()
    out = subprocess.run([f"{build}/bin/mmfeed-consume", "--socket", sock, "--rank", "0", "--json"],
                         capture_output=True, text=True, check=True).stdout
    seconds = time.perf_counter() - t0
    daemon.wait()
    return {"samples": json.loads(out)["samples"], "seconds": seconds}


def start_daemon(build, d):
    """mmfeedd on d/bench.yaml, logging to d/daemon.log, once it serves: (process, socket)."""
    sock = str(d / "bench.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    with open(d / "daemon.log", "w") as log:
        daemon = subprocess.Popen([f"{build}/bin/mmfeedd", "--config", str(d / "bench.yaml"), "--socket", sock],
                                  stderr=log)
    while not os.path.exists(sock):
        if daemon.poll() is not None:
            raise SystemExit(f"mmfeedd exited: {(d / 'daemon.log').read_text()}")
        time.sleep(0.01)
    return daemon, sock


def run_python(d, samples):
    out = subprocess.run([PY, "-c", BASELINE, str(manifest(d, samples)), str(samples), str(ROOT / "tests" / "reference")],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def steady(short, long):
    return (long["samples"] - short["samples"]) / (long["seconds"] - short["seconds"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "qwen"))
    ap.add_argument("--short", type=int, default=48)
    ap.add_argument("--long", type=int, default=240)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sets", default="imagenet,large")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    results = {}
    for name in a.sets.split(","):
        d = make_set(out, name, 120)
        short, long = (a.short, a.long) if name != "video" else (a.short // VIDEO_SHARE, a.long // VIDEO_SHARE)
        for n in (short, long):
            manifest(d, n)
        rounds = []
        for _ in range(a.rounds):
            ours = steady(run_mmfeed(a.build, d, short), run_mmfeed(a.build, d, long))
            py = steady(run_python(d, short), run_python(d, long))
            rounds.append({"mmfeed": ours, "python": py, "ratio": ours / py})
            print(f"{name}: mmfeed {ours:.1f}/s, Python reference {py:.1f}/s, {ours / py:.2f}x", file=sys.stderr)
        results[name] = {"rounds": rounds, "ratio": statistics.median(r["ratio"] for r in rounds),
                         "mmfeed": statistics.median(r["mmfeed"] for r in rounds),
                         "python": statistics.median(r["python"] for r in rounds)}
    print(json.dumps(results, indent=2))
    print("\n| set | mmfeed samples/s | Python reference, DataLoader(num_workers=2) | ratio |\n|---|---|---|---|")
    for name, r in results.items():
        what = f"{SETS[name][0]}-{SETS[name][1]} px wide photos" if SETS[name] else "640x360 30 fps clips, 6-14 s"
        print(f"| {name} ({what}) | {r['mmfeed']:.1f} | {r['python']:.1f} | {r['ratio']:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
